-- UTF-8 is read in one place: rlm.base.text, over csrc/utf8.c (rlm.core)
-- when it loads, else the same rules in Lua (rlm.log runs without the
-- core). Both read every case alike, and the session's context check
-- (rlm.engine.options) goes through it.
local text = require("rlm.base.text")

-- rlm.base.text loaded again where rlm.core cannot load.
local function pure_text()
  local saved_core, saved_text = package.loaded["rlm.core"], package.loaded["rlm.base.text"]
  package.loaded["rlm.core"], package.loaded["rlm.base.text"] = nil, nil
  package.preload["rlm.core"] = function()
    error("no core here")
  end
  local ok, pure = pcall(require, "rlm.base.text")
  package.preload["rlm.core"] = nil
  package.loaded["rlm.core"], package.loaded["rlm.base.text"] = saved_core, saved_text
  assert(ok, tostring(pure))
  return pure
end

-- { bytes, valid?, position of the first bad byte, characters (of valid ones) }
local CASES = {
  { "", true, nil, 0 },
  { "plain ascii\0with a NUL", true, nil, 22 },
  { "h\195\169llo", true, nil, 5 }, -- é, 2 bytes
  { "\226\130\172", true, nil, 1 }, -- €, 3 bytes
  { "\240\159\152\128", true, nil, 1 }, -- U+1F600, 4 bytes
  { "\244\143\191\191", true, nil, 1 }, -- U+10FFFF, the last
  { "a\255b", false, 2 },
  { "\192\128", false, 1 }, -- an overlong NUL
  { "\224\128\128", false, 1 }, -- an overlong 3-byte form
  { "\237\160\128", false, 1 }, -- a surrogate (U+D800)
  { "\244\144\128\128", false, 1 }, -- past U+10FFFF
  { "ok\226\130", false, 3 }, -- a sequence cut off by the end
  { "\128abc", false, 1 }, -- a stray continuation byte
  { "abc\195", false, 4 },
}

describe("rlm.base.text's UTF-8", function()
  local pure = pure_text()

  it("loads without rlm.core, on the Lua rules", function()
    assert.are_not.equal(text, pure)
    assert.are_not.equal(text.utf8_clean, pure.utf8_clean)
  end)

  for _, case in ipairs(CASES) do
    it(("reads %q alike in C and in Lua"):format(case[1]), function()
      for _, t in ipairs({ text, pure }) do
        local ok, at = t.utf8_valid(case[1])
        assert.are.equal(case[2], ok)
        assert.are.equal(case[3], at)
        local clean = t.utf8_clean(case[1])
        assert.is_true((t.utf8_valid(clean)))
        if case[2] then
          assert.are.equal(case[1], clean)
          assert.are.equal(case[4], t.utf8_len(case[1]))
          assert.are.equal(#case[1], (t.utf8_prefix(case[1], 2 ^ 40)))
        end
      end
      assert.are.equal(text.utf8_clean(case[1]), pure.utf8_clean(case[1]))
    end)
  end

  it("cuts valid UTF-8 on character boundaries alike", function()
    local s = ("aé€😀"):rep(50)
    for n = 0, 210, 7 do
      local b1, c1 = text.utf8_prefix(s, n)
      local b2, c2 = pure.utf8_prefix(s, n)
      assert.are.same({ b1, c1 }, { b2, c2 })
      assert.is_true((text.utf8_valid(s:sub(1, b1))))
    end
  end)

  it("is what Session.new checks a JSON context's strings with", function()
    local rlm = require("rlm")
    local ok, err = pcall(rlm.Session.new, { root_llm = function() end, llm_query = function() end,
      context = { docs = { "fine", "bad \237\160\128 here" } } })
    assert.is_false(ok)
    assert.matches("not UTF%-8 at context.docs%[2%] %(byte 5%)", err)
  end)
end)
