-- Misuse raises at Session.new, naming the option.
local rlm = require("rlm")

local function base()
  return { context = "x", root_llm = function() return "" end, llm_query = function() return "" end }
end

local cases = {
  -- option, value, message pattern
  { "bogus", 1, "unknown option 'bogus'" },
  { "max_iteration", 5, "unknown option 'max_iteration' %(did you mean 'max_iterations'%? known: " },
  { "stdout_truncate", 5, "unknown option 'stdout_truncate' %(did you mean 'stdout_truncate_chars'%?" },
  { "max_iterations", 0, "option 'max_iterations' must be an integer from 1 to 1000000" },
  { "max_iterations", 2.5, "option 'max_iterations'" },
  { "max_iterations", "10", "option 'max_iterations'" },
  { "step_timeout_ms", -1, "option 'step_timeout_ms' must be a number of milliseconds > 0" },
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
    assert.is_nil(s.sandbox.driver)
    s:close()
  end)
end)

-- Every number that reaches a limit or a budget: NaN and the infinities
-- are refused, and so is a value past the option's range, naming the range.
local numeric = {
  max_iterations = 10 ^ 6, step_timeout_ms = 2 ^ 31 - 1, start_timeout_ms = 2 ^ 31 - 1,
  max_rss_bytes = 2 ^ 44, rss_poll_interval_ms = 60000, max_sub_calls = 2 ^ 31 - 1,
  max_concurrent_sub_calls = 4096, max_depth = 32, max_live_sandboxes = 4096, max_wall_ms = 2 ^ 31 - 1,
  max_total_tokens = 2 ^ 50, max_sub_prompt_chars = 2 ^ 30, stdout_truncate_chars = 2 ^ 26,
  workdir_max_bytes = 2 ^ 40, workdir_max_files = 2 ^ 31 - 1, sandbox_uid_first = 2 ^ 31 - 1,
  sandbox_uid_count = 2 ^ 31 - 1, max_message_bytes = 2 ^ 30, max_total_cost_usd = false,
}
local names = {}
for name in pairs(numeric) do
  names[#names + 1] = name
end
table.sort(names)

describe("Session.new's numbers", function()
  local function refuses(opts, pattern)
    local o = base()
    o.cost_usd = function() return 0 end
    for k, v in pairs(opts) do
      o[k] = v
    end
    local ok, err = pcall(rlm.Session.new, o)
    assert.is_false(ok, "accepted")
    assert.matches(pattern, err, 1, true)
  end

  for _, name in ipairs(names) do
    it(("refuses NaN, inf and -inf for '%s'"):format(name), function()
      for _, v in ipairs({ 0 / 0, math.huge, -math.huge }) do
        refuses({ [name] = v }, "option '" .. name .. "' must be")
      end
    end)
    if numeric[name] then
      it(("refuses '%s' past its range, naming the range"):format(name), function()
        refuses({ [name] = numeric[name] + 1 }, "option '" .. name .. "' must be")
        refuses({ [name] = 2 ^ 53 - 1 }, " to ")
      end)
    end
  end

  it("refuses the values of issue 14 with the range", function()
    refuses({ step_timeout_ms = 1e300 }, "option 'step_timeout_ms' must be a number of milliseconds > 0, up to 2^31 - 1 (24.8 days)")
    refuses({ max_iterations = 2 ^ 53 - 1 }, "option 'max_iterations' must be an integer from 1 to 1000000")
    refuses({ stdout_truncate_chars = 2 ^ 52 }, "option 'stdout_truncate_chars' must be an integer from 1 to 2^26")
  end)

  it("refuses a uid range past 2^31 - 1, what a uid map takes, naming the range (issue 32)", function()
    -- Accepted before, then every session failed "setting up uid map:
    -- Invalid argument", blamed on the container.
    refuses({ sandbox_uid_first = 2 ^ 31, sandbox_uid_count = 1 },
      "option 'sandbox_uid_first' must be an integer from 1 to 2^31 - 1")
    refuses({ sandbox_uid_first = 2 ^ 32 - 2, sandbox_uid_count = 1 }, "from 1 to 2^31 - 1")
    refuses({ sandbox_uid_first = 2 ^ 31 - 10, sandbox_uid_count = 11 },
      "options 'sandbox_uid_first' + 'sandbox_uid_count' - 1 must be at most 2^31 - 1 (the uids 1 to 2^31 - 1 "
      .. "are what a uid map takes), got 2147483638 + 11 - 1 = 2147483648")
    local ok, err = pcall(rlm.Pool.new, { size = 1, sandbox_uid_first = 2 ^ 31 - 1, sandbox_uid_count = 2 })
    assert.is_false(ok)
    assert.matches("rlm.Pool.new: options 'sandbox_uid_first' + 'sandbox_uid_count' - 1 must be at most 2^31 - 1",
      err, 1, true)
    local o = base()
    o.sandbox_uid_first, o.sandbox_uid_count = 2 ^ 31 - 10, 10
    rlm.Session.new(o):close()
  end)

  it("refuses a max_message_bytes too small for stdout_truncate_chars, naming both", function()
    refuses({ max_message_bytes = 20000 }, "option 'max_message_bytes' (20000) must be at least 12 * option "
      .. "'stdout_truncate_chars' + 8192 (32192 here)")
    refuses({ stdout_truncate_chars = 2 ^ 21 }, "option 'stdout_truncate_chars'")
    refuses({ max_message_bytes = 8204, stdout_truncate_chars = 2 }, "option 'max_message_bytes' (8204)")
  end)
end)

describe("Session.new's context", function()
  local deep = { "leaf" }
  for _ = 2, 201 do
    deep = { deep }
  end
  local cycle = {}
  cycle.self = cycle
  local rows = {
    { { 1, 2, { name = "a\255b" } }, "option 'context' holds a string that is not UTF-8 at context[3].name (byte 2)" },
    { { ok = { ["k\255"] = 1 } }, "option 'context' holds a key that is not UTF-8 at context.ok[\"k\\255\"]" },
    { { ["a b"] = "\237\160\128" }, "not UTF-8 at context[\"a b\"] (byte 1)" }, -- a surrogate
    { { "\192\128" }, "not UTF-8 at context[1]" }, -- overlong NUL
    { { "\244\144\128\128" }, "not UTF-8 at context[1]" }, -- past U+10FFFF
    { { "ok \226\130" }, "not UTF-8 at context[1] (byte 4)" }, -- cut short
    { deep, "option 'context' nests deeper than 200 tables at context[1][1]" },
    { cycle, "option 'context' nests deeper than 200 tables at context.self.self" },
  }
  for _, case in ipairs(rows) do
    it("refuses, naming the path: " .. case[2], function()
      local o = base()
      o.context = case[1]
      local ok, err = pcall(rlm.Session.new, o)
      assert.is_false(ok, "accepted")
      assert.matches(case[2], err, 1, true)
    end)
  end

  it("accepts valid UTF-8 of every length and a text context of any bytes", function()
    for _, context in ipairs({ { "é", "€", "𝄞", ["ключ"] = "значение" }, "a\255b" }) do
      local o = base()
      o.context = context
      rlm.Session.new(o):close()
    end
  end)
end)

-- rlm.base.checks.options, the one validator: a table option whose fields
-- are options themselves (rule.fields), and a check that names the field
-- that is wrong, both named 'option.field' in the message.
describe("the validator's table options", function()
  local checks = require("rlm.base.checks")
  local schema = {
    outer = { function(v)
      return type(v) == "table", "a table"
    end, fields = {
      size = { checks.integer(1, 10), required = true },
      mode = { checks.non_empty_string, "plain" },
    } },
    store = { function(v)
      if type(v) ~= "table" then
        return false, "a table"
      end
      return type(v.get) == "function", "a function", nil, "get", v.get
    end },
  }
  local rows = {
    { { outer = 5 }, "where: option 'outer' must be a table, got 5" },
    { { outer = {} }, "where: option 'outer.size' is required" },
    { { outer = { size = 11 } }, "where: option 'outer.size' must be an integer from 1 to 10, got 11" },
    { { outer = { size = 1, mode = "" } }, "where: option 'outer.mode' must be a non-empty string, got \"\"" },
    { { outer = { size = 1, sise = 2 } }, "where: unknown option 'outer.sise' (did you mean 'outer.size'? known: "
      .. "outer.mode, outer.size)" },
    { { store = { get = 1 } }, "where: option 'store.get' must be a function, got 1" },
  }
  for _, row in ipairs(rows) do
    it("raises " .. row[2], function()
      local ok, err = pcall(checks.options, "where", row[1], schema)
      assert.is_false(ok)
      assert.equals(row[2], (err:gsub("^[^ ]*:%d+: ", "")))
    end)
  end

  it("returns a table option's fields in a new table, defaults filled in", function()
    local given = { size = 3 }
    local out = checks.options("where", { outer = given }, schema)
    assert.same({ size = 3, mode = "plain" }, out.outer)
    assert.is_nil(given.mode)
  end)

  it("raises at the caller of the caller, as for any option", function()
    local function new(o)
      local out = checks.options("rlm.X.new", o, schema, nil, 2)
      return out -- not a tail call: new's frame stays, as a real new()'s does
    end
    local ok, err = pcall(function()
      new({ outer = { size = 0 } }) -- the line the message names
    end)
    assert.is_false(ok)
    assert.matches("options_spec.lua:%d+: rlm.X.new: option 'outer.size'", err)
  end)
end)
