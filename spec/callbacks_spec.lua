-- One way to call a user callback (rlm.util.invoke), whoever drives the
-- session: run() and the luv adapter give every form of root_llm the same
-- outcome; the adapters reach the session through its public methods only.
local H = require("helpers")
local fence = H.fence

local L = require("helpers.luv")
local luv_adapter = L and require("rlm.adapters.luv")

local FINAL = fence("FINAL('done')")

-- root_llm's forms: the callback, and what the run must end with.
local forms = {
  { "returns the text", function() return FINAL end, "done" },
  { "returns the text and a usage", function() return FINAL, { input_tokens = 1, output_tokens = 2 } end, "done" },
  { "calls done() before it returns", function(_, done) done(FINAL) end, "done" },
  { "raises", function() error("boom in root_llm") end, "callback_error", "boom in root_llm" },
  { "returns nil and a message", function() return nil, "the model is down" end, "callback_error",
    "the model is down" },
  { "calls done(nil, message)", function(_, done) done(nil, "refused upstream") end, "callback_error",
    "refused upstream" },
  { "returns a number", function() return 42 end, "callback_error", "root_llm returned number, not a string" },
  { "returns a NaN usage", function() return FINAL, { input_tokens = 0 / 0, output_tokens = 1 } end,
    "callback_error", "root_llm returned a usage" },
}

local function check(form, result, err)
  if form[3] == "done" then
    assert.is_nil(err)
    assert.equals("done", result.answer)
  else
    assert.is_nil(result)
    assert.equals(form[3], err.kind)
    assert.matches(form[4], err.message, 1, true)
  end
end

describe("a root_llm callback, under run()", function()
  after_each(H.assert_clean)
  for _, form in ipairs(forms) do
    it(form[1], function()
      check(form, H.run({ root_llm = form[2] }))
    end)
  end

  it("that returns nothing and calls no done() is a callback_error at once", function()
    local result, err = H.run({ root_llm = function() end })
    assert.is_nil(result)
    assert.equals("callback_error", err.kind)
    assert.matches("root_llm returned nil", err.message, 1, true)
  end)
end)

H.describe_luv("a root_llm callback, under the luv adapter", function()
  after_each(H.assert_clean)
  for _, form in ipairs(forms) do
    it(form[1], function()
      local got
      luv_adapter.run(H.opts({ root_llm = form[2] }), function(err, result)
        got = { result = result, err = err }
      end)
      L.run_until(function() return got ~= nil end)
      check(form, got.result, got.err)
    end)
  end
end)

describe("the adapters", function()
  it("use the session's public methods only", function()
    local files = { "lua/rlm/async.lua", "lua/rlm/adapters/luv.lua", "lua/rlm/adapters/nvim.lua",
      "lua/rlm/adapters/resty.lua" }
    for _, path in ipairs(files) do
      local f = assert(io.open(path))
      local text = f:read("*a")
      f:close()
      local n = 0
      for line in text:gmatch("[^\n]*") do
        n = n + 1
        local code = line:gsub("%-%-.*$", "")
        assert.is_nil(code:match("[%w_]+:_%a") or code:match("[%w_]+%._%a")
          or code:match("%f[%w_]s%.opts") or code:match("%.opts%."),
          ("%s:%d reaches into the session: %s"):format(path, n, line))
      end
    end
  end)
end)

describe("root_llm's messages", function()
  after_each(H.assert_clean)

  it("are one conversation table, appended to from call to call, never copied", function()
    local seen, sizes = {}, {}
    local root = function(messages)
      seen[#seen + 1], sizes[#sizes + 1] = messages, #messages
      return #seen < 3 and fence("print(1)") or FINAL
    end
    local result, err = H.run({ root_llm = root })
    assert.is_nil(err)
    assert.equals("done", result.answer)
    assert.equals(3, #seen)
    assert.is_true(rawequal(seen[1], seen[2]) and rawequal(seen[2], seen[3]))
    assert.are.same({ 2, 4, 6 }, sizes)
  end)
end)
