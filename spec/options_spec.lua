-- Misuse raises at Session.new, naming the option.
local rlm = require("rlm")

local function base()
  return { context = "x", root_llm = function() return "" end, llm_query = function() return "" end }
end

local cases = {
  -- option, value, message pattern
  { "bogus", 1, "unknown option 'bogus'" },
  { "max_iterations", 0, "option 'max_iterations' must be an integer >= 1" },
  { "max_iterations", 2.5, "option 'max_iterations'" },
  { "max_iterations", "10", "option 'max_iterations'" },
  { "step_timeout_ms", -1, "option 'step_timeout_ms' must be a number > 0" },
  { "max_rss_bytes", -5, "option 'max_rss_bytes'" },
  { "rss_poll_interval_ms", 0, "option 'rss_poll_interval_ms'" },
  { "max_sub_calls", -1, "option 'max_sub_calls'" },
  { "stdout_truncate_chars", 0, "option 'stdout_truncate_chars'" },
  { "max_sub_prompt_chars", 0, "option 'max_sub_prompt_chars'" },
  { "root_llm", "not a function", "option 'root_llm' must be a function" },
  { "llm_query", 5, "option 'llm_query' must be a function" },
  { "on_event", true, "option 'on_event'" },
  { "cost_usd", {}, "option 'cost_usd'" },
  { "context", 12, "option 'context' must be a string or a JSON%-able table" },
  { "query", {}, "option 'query' must be a string" },
  { "python", "", "option 'python' must be a non%-empty string" },
  { "guardrails", "yes", "option 'guardrails' must be a boolean" },
  { "allowed_modules", "numpy", "option 'allowed_modules'" },
  { "allowed_modules", { "os.path" }, "option 'allowed_modules'" },
  { "allowed_modules", { [3] = "numpy" }, "option 'allowed_modules'" },
  { "max_total_cost_usd", 1, "option 'max_total_cost_usd' needs option 'cost_usd'" },
  { "context", { f = print }, "option 'context' cannot be sent as JSON" },
}

describe("Session.new", function()
  for _, case in ipairs(cases) do
    local name, value, pattern = case[1], case[2], case[3]
    it(("raises naming '%s' for %s"):format(name, tostring(value)), function()
      local opts = base()
      opts[name] = value
      local ok, err = pcall(rlm.Session.new, opts)
      assert.is_false(ok)
      assert.matches(pattern, err)
    end)
  end

  it("raises when a required callback is missing", function()
    for _, name in ipairs({ "root_llm", "llm_query" }) do
      local opts = base()
      opts[name] = nil
      local ok, err = pcall(rlm.Session.new, opts)
      assert.is_false(ok)
      assert.matches("option '" .. name .. "' is required", err, 1, true)
    end
  end)

  it("raises for a non-table", function()
    assert.has_error(function() rlm.Session.new("x") end)
  end)

  it("accepts a callable table as a callback", function()
    local opts = base()
    opts.root_llm = setmetatable({}, { __call = function() return "" end })
    assert.is_table(rlm.Session.new(opts))
  end)

  it("starts nothing until run or step", function()
    local s = rlm.Session.new(base())
    assert.is_nil(s.driver)
    s:close()
  end)
end)
