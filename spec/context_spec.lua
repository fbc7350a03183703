-- The context reaches the REPL through a file, as a str, dict or list.
local H = require("helpers")
local core = require("rlm.core")
local fence = H.fence

describe("the context", function()
  after_each(H.assert_clean)

  it("arrives as a str with every byte of UTF-8 intact", function()
    local text = "caf\195\169 \226\130\172 line\nnext\0null"
    local result = H.run({
      context = text,
      root_llm = H.script({ fence("FINAL(repr((type(context).__name__, len(context), context[3], context[-4:])))") }),
      guardrails = false,
    })
    assert.are.equal("('str', 21, 'é', 'null')", result.answer)
  end)

  it("arrives as a dict from a table with keys", function()
    local result = H.run({
      context = { title = "t", items = { 1, 2, 3 } },
      root_llm = H.script({ fence("FINAL(f\"{type(context).__name__} {sorted(context)} {sum(context['items'])}\")") }),
    })
    assert.are.equal("dict ['items', 'title'] 6", result.answer)
  end)

  it("arrives as a list from a sequence", function()
    local result = H.run({
      context = { "a", "b", "c" },
      root_llm = H.script({ fence("FINAL(type(context).__name__ + ':' + ''.join(context))") }),
    })
    assert.are.equal("list:abc", result.answer)
  end)

  it("loads a 100 MB string", function()
    local mb = tonumber(os.getenv("RLM_SPEC_BIG_MB") or "100")
    local line = ("0123456789abcdef"):rep(4) .. "\n" -- 65 bytes
    local text = line:rep(math.floor(mb * 2 ^ 20 / #line)) .. "NEEDLE"
    local t0 = core.now_ms()
    local s = H.session({
      context = text,
      max_rss_bytes = 0,
      root_llm = H.script({ fence("FINAL(f'{len(context)} {context.rfind(\"NEEDLE\")}')") }),
    })
    local result, err = s:run()
    local elapsed = core.now_ms() - t0
    s:close()
    assert.is_nil(err, err and tostring(err))
    assert.are.equal(("%d %d"):format(#text, #text - 6), result.answer)
    print(("\n# %s: %d MB context to answer in %.0f ms"):format(H.lua_name(), mb, elapsed))
  end)
end)

-- A context that cannot fit max_rss_bytes is refused by Session.new, before
-- any sandbox starts, rather than loaded into memory_limit (docs/api.md,
-- max_rss_bytes); the floor is the str the driver must hold.
describe("a context that cannot fit max_rss_bytes", function()
  after_each(H.assert_clean)

  local MIB = 2 ^ 20
  local EMOJI = "\240\159\152\128"

  local function refusal(opts)
    local ok, err = pcall(require("rlm").Session.new, H.opts(opts))
    return not ok and tostring(err) or nil, ok and err or nil
  end

  -- one row a case: the context, max_rss_bytes, the floor named (nil: accepted)
  local cases = {
    { "8 MiB of ASCII under 4 MiB", ("a"):rep(8 * MIB), 4 * MIB, 8 * MIB },
    { "2 MiB of ASCII and one emoji (4 bytes a character) under 4 MiB", ("a"):rep(2 * MIB) .. EMOJI, 4 * MIB,
      (2 * MIB + 1) * 4 },
    { "a table of one 8 MiB string under 4 MiB", { doc = ("a"):rep(8 * MIB) }, 4 * MIB, 8 * MIB + 3 },
    { "4 MiB of bytes that are not UTF-8 (a surrogate each, 2 bytes) under 6 MiB", ("\255"):rep(4 * MIB), 6 * MIB,
      8 * MIB },
    { "8 MiB of Latin-1 text (1 byte a character) under 6 MiB", ("\195\169"):rep(4 * MIB), 6 * MIB, nil },
    { "8 MiB of ASCII with max_rss_bytes = 0", ("a"):rep(8 * MIB), 0, nil },
    { "100,000 records that share their keys, under 4 MiB", (function()
      local t = {}
      for i = 1, 100000 do
        t[i] = { name = "x", severity = "low" }
      end
      return t
    end)(), 4 * MIB, nil },
  }
  for _, case in ipairs(cases) do
    it((case[4] and "refuses " or "accepts ") .. case[1], function()
      local t0 = core.now_ms()
      local why, s = refusal({ context = case[2], max_rss_bytes = case[3] })
      local ms = core.now_ms() - t0
      if case[4] then
        assert.is_string(why)
        assert.is_truthy(why:find(("option 'context' cannot fit option 'max_rss_bytes' (%d bytes)"):format(case[3]),
          1, true), why)
        assert.is_truthy(why:find(("take at least %d bytes of the sandbox's memory"):format(case[4]), 1, true), why)
        assert.is_true(ms < 1000, ms .. " ms")
        assert.are.same({}, H.workdirs()) -- nothing started
      else
        assert.is_nil(why)
        s:close()
      end
    end)
  end

  it("names the context's size for a text", function()
    local why = refusal({ context = ("a"):rep(3 * MIB), max_rss_bytes = 2 * MIB })
    assert.is_truthy(why:find("its 3145728 bytes take at least 3145728 bytes", 1, true), why)
  end)

  -- The floor is what CPython's str of the bytes holds (PEP 393): its
  -- characters times 1, 2 or 4; python3 decodes each case here with
  -- surrogateescape, as the driver does, and says so.
  it("counts a text's str as CPython does", function()
    local texts = {
      "", "a", "plain ASCII", "caf\195\169", "\195\191\195\191", "\196\128", "\228\184\173\230\150\135",
      EMOJI, "a" .. EMOJI, "\255", "ok\255\254", "\195", "\226\130", "\240\159\152", "\237\160\128",
      "\192\175", "\224\128\175", "\244\144\128\128", "\128\128", "x\239\191\191y", "\244\143\191\191",
      ("abcdefgh"):rep(5) .. "\195\169" .. ("abcdefgh"):rep(5),
    }
    local args = {}
    for i, t in ipairs(texts) do
      args[i] = "x" .. t:gsub(".", function(c) -- "x": no argument is empty
        return ("%02x"):format(c:byte())
      end)
    end
    local out = H.sh("python3 -c '\nimport sys\nfor h in sys.argv[1:]:\n"
      .. "    t = bytes.fromhex(h[1:]).decode(\"utf-8\", \"surrogateescape\")\n"
      .. "    m = max(map(ord, t), default=0)\n"
      .. "    print(len(t), 1 if m < 256 else 2 if m < 65536 else 4)' " .. table.concat(args, " "))
    local i = 0
    for chars, width in out:gmatch("(%d+) (%d+)") do
      i = i + 1
      local bytes, c, w = core.utf8_str_size(texts[i])
      assert.are.same({ tonumber(chars) * tonumber(width), tonumber(chars), tonumber(width) }, { bytes, c, w },
        ("%q"):format(texts[i]))
    end
    assert.are.equal(#texts, i)
  end)
end)
