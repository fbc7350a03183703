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
  { "sandbox", { rss_poll_interval_ms = 0 }, "option 'sandbox.rss_poll_interval_ms'" },
  { "max_sub_calls", -1, "option 'max_sub_calls'" },
  { "stdout_truncate_chars", 0, "option 'stdout_truncate_chars'" },
  { "max_sub_prompt_chars", 0, "option 'max_sub_prompt_chars'" },
  { "root_llm", "not a function", "option 'root_llm' must be a function" },
  { "llm_query", 5, "option 'llm_query' must be a function" },
  { "on_event", true, "option 'on_event'" },
  { "cost", { usd = {} }, "option 'cost.usd' must be a function" },
  { "cost", { max_usd = 1 }, "option 'cost.usd' is required" },
  { "cost", { usd = print, max = 1 }, "unknown option 'cost.max' %(did you mean 'cost.max_usd'%?" },
  { "context", 12, "option 'context' must be a string or a JSON%-able table" },
  { "query", {}, "option 'query' must be a string" },
  { "sandbox", { python = "" }, "option 'sandbox.python' must be a non%-empty string" },
  { "sandbox", { pyhton = "python3" }, "option 'sandbox' has no field 'pyhton' for backend \"bubblewrap\" %(did you mean 'python'%?" },
  { "guardrails", "yes", "option 'guardrails' must be a boolean" },
  { "sandbox", { allowed_modules = "numpy" }, "option 'sandbox.allowed_modules'" },
  { "sandbox", { allowed_modules = { "os.path" } }, "option 'sandbox.allowed_modules'" },
  { "sandbox", { allowed_modules = { [3] = "numpy" } }, "option 'sandbox.allowed_modules'" },
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
  max_iterations = 10 ^ 6, step_timeout_ms = 2 ^ 31 - 1, ["sandbox.start_timeout_ms"] = 2 ^ 31 - 1,
  max_rss_bytes = 2 ^ 44, ["sandbox.rss_poll_interval_ms"] = 60000, max_sub_calls = 2 ^ 31 - 1,
  max_concurrent_sub_calls = 4096, max_depth = 32, max_wall_ms = 2 ^ 31 - 1,
  max_total_tokens = 2 ^ 50, max_sub_prompt_chars = 2 ^ 30, stdout_truncate_chars = 2 ^ 26,
  ["sandbox.workdir_max_bytes"] = 2 ^ 40, ["sandbox.workdir_max_files"] = 2 ^ 31 - 1,
  ["sandbox.max_message_bytes"] = 2 ^ 30, ["sandbox.interrupt_grace_ms"] = 2 ^ 31 - 1, ["cost.max_usd"] = false,
}
local names = {}
for name in pairs(numeric) do
  names[#names + 1] = name
end
table.sort(names)

-- o with the option at path ("sandbox.tmpdir") set to v.
local function set(o, path, v)
  local head, rest = path:match("^([%w_]+)%.(.+)$")
  if not head then
    o[path] = v
    return o
  end
  o[head] = o[head] or {}
  set(o[head], rest, v)
  return o
end

describe("Session.new's numbers", function()
  local function refuses(opts, pattern)
    local o = base()
    o.cost = { usd = function() return 0 end }
    for k, v in pairs(opts) do
      set(o, k, v)
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
    refuses({ ["sandbox.uids"] = { first = 2 ^ 31, count = 1 } },
      "option 'sandbox.uids' must be a table { first = 1 to 2^31 - 1, count = 1 to 2^31 - 1 }")
    refuses({ ["sandbox.uids"] = { first = 2 ^ 32 - 2, count = 1 } }, "first = 1 to 2^31 - 1")
    refuses({ ["sandbox.uids"] = { first = 0 / 0, count = 1 } }, "option 'sandbox.uids' must be")
    refuses({ ["sandbox.uids"] = { first = 2 ^ 31 - 10, count = 11 } },
      "option 'sandbox.uids' must end at uid 2^31 - 1 at most (the uids a uid map takes), got first 2147483638 "
      .. "+ count 11 - 1 = 2147483648")
    local ok, err = pcall(rlm.Pool.new, { size = 1, sandbox = { uids = { first = 2 ^ 31 - 1, count = 2 } } })
    assert.is_false(ok)
    assert.matches("rlm.Pool.new: option 'sandbox.uids' must end at uid 2^31 - 1 at most", err, 1, true)
    local o = base()
    o.sandbox = { uids = { first = 2 ^ 31 - 10, count = 10 } }
    rlm.Session.new(o):close()
  end)

  it("refuses a sandbox.max_message_bytes too small for stdout_truncate_chars, naming both", function()
    refuses({ ["sandbox.max_message_bytes"] = 20000 }, "option 'sandbox.max_message_bytes' (20000) must be at "
      .. "least 12 * option 'stdout_truncate_chars' + 8192 (32192 here)")
    refuses({ stdout_truncate_chars = 2 ^ 21 }, "option 'stdout_truncate_chars'")
    refuses({ ["sandbox.max_message_bytes"] = 8204, stdout_truncate_chars = 2 },
      "option 'sandbox.max_message_bytes' (8204)")
  end)
end)

-- Issue 40: at most 30 top-level options (29, and issue 41's journal), and
-- every option of earlier releases that moved, merged or went raises
-- naming where it went, for a session and a pool alike: never ignored.
describe("Session.new's options", function()
  local MOVED = {
    python = "sandbox.python", bwrap = "sandbox.bwrap", allowed_modules = "sandbox.allowed_modules",
    bind_pth_paths = "sandbox.bind_pth_paths", memory_cgroup = "sandbox.memory_cgroup",
    rss_poll_interval_ms = "sandbox.rss_poll_interval_ms", workdir_max_bytes = "sandbox.workdir_max_bytes",
    workdir_max_files = "sandbox.workdir_max_files", sandbox_uid_first = "sandbox.uids.first",
    sandbox_uid_count = "sandbox.uids.count", max_message_bytes = "sandbox.max_message_bytes",
    tmpdir = "sandbox.tmpdir", start_timeout_ms = "sandbox.start_timeout_ms",
    interrupt_grace_ms = "sandbox.interrupt_grace_ms", cost_usd = "cost.usd", max_total_cost_usd = "cost.max_usd",
    sub_call_cache_namespace = "sub_call_cache.namespace", max_live_sandboxes = "max_concurrent_sub_calls",
  }

  it("are at most 30", function()
    local n = #require("rlm.engine.options").names
    assert.is_true(n <= 30, n .. " top-level options")
    assert.are.equal(30, n) -- issue 41's journal the 30th
  end)

  for old, new in pairs(MOVED) do
    it(("refuses '%s', naming %s"):format(old, new), function()
      local o = base()
      o[old] = 1
      local ok, err = pcall(rlm.Session.new, o)
      assert.is_false(ok)
      assert.matches(("rlm.Session.new: option '%s' is now %s"):format(old, new), err, 1, true)
      ok, err = pcall(rlm.Pool.new, { size = 1, [old] = 1 })
      assert.is_false(ok)
      assert.matches(("rlm.Pool.new: option '%s' is now %s"):format(old, new), err, 1, true)
    end)
  end

  it("knows no moved name as an option still", function()
    local known = {}
    for _, name in ipairs(require("rlm.engine.options").names) do
      known[name] = true
    end
    for old in pairs(MOVED) do
      assert.is_nil(known[old], old)
    end
  end)
end)

-- Issue 40: every top-level option is set somewhere a user reads: a code
-- example of README.md or docs/ (fenced, or indented four spaces), a flag
-- of the CLI (its --help: --max-tool-calls is max_tool_calls), or a host
-- (the Neovim plugin, the adapters, examples/). One set nowhere is a knob
-- no one turns: a constant, or merged into another.
describe("Session.new's options, each", function()
  local function read(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
  end
  local function list(cmd)
    local out, p = {}, assert(io.popen(cmd))
    for line in p:lines() do
      out[#out + 1] = line
    end
    p:close()
    return out
  end
  -- The code of a Markdown page: its fenced blocks and indented lines.
  local function code_of(text)
    local out, fenced = {}, false
    for line in (text .. "\n"):gmatch("([^\n]*)\n") do
      if line:match("^%s*```") then
        fenced = not fenced
      elseif fenced or line:match("^    ") then
        out[#out + 1] = line
      end
    end
    return table.concat(out, "\n")
  end
  local sources = {}
  for _, path in ipairs(list("ls README.md docs/*.md")) do
    sources[#sources + 1] = { path, code_of(read(path)) }
  end
  for _, path in ipairs(list("find lua/rlm/nvim.lua lua/rlm/nvim lua/rlm/adapters examples -type f | sort")) do
    sources[#sources + 1] = { path, read(path) }
  end
  local help = table.concat(list(("%s bin/rlm --help 2>&1"):format(os.getenv("RLM_SPEC_LUA") or "lua5.4")), "\n")
  assert(help:find("--max-iterations", 1, true), "bin/rlm --help printed no flags: " .. help)
  local flags = {}
  for flag in help:gmatch("%-%-([%w%-]+)") do
    flags[(flag:gsub("%-", "_"))] = "--" .. flag
    flags[(flag:gsub("^no%-", ""):gsub("%-", "_"))] = "--" .. flag -- --no-fallback: fallback = false
  end

  local function where(name)
    local found = {}
    if flags[name] then
      found[#found + 1] = "bin/rlm " .. flags[name]
    end
    for _, src in ipairs(sources) do
      if src[2]:find("%f[%w_]" .. name .. "%s*=[^=]") then
        found[#found + 1] = src[1]
      end
    end
    return found
  end

  for _, name in ipairs(require("rlm.engine.options").names) do
    it(("is set by a doc example, the CLI or a host: %s"):format(name), function()
      assert.is_true(#where(name) > 0, ("option '%s' is set by no doc example, CLI flag or host"):format(name))
    end)
  end

  it("is looked for where it is set, not where it is only named", function()
    assert.are.same({}, where("no_such_option"))
    assert.are.same({ "bin/rlm --max-tool-calls" }, where("max_tool_calls"))
    assert.are.same({ "bin/rlm --no-fallback" }, where("fallback"))
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
