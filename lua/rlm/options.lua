-- Option checking for Session.new. Misuse raises, naming the option.
local util = require("rlm.util")

local M = {}

local function integer(min)
  return function(v)
    return type(v) == "number" and v == math.floor(v) and v >= min and v < 2 ^ 53,
      "an integer >= " .. min
  end
end

local function positive_number(v)
  return type(v) == "number" and v > 0 and v < math.huge, "a number > 0"
end

local function non_negative_number(v)
  return type(v) == "number" and v >= 0 and v < math.huge, "a number >= 0"
end

local function callable(v)
  return util.is_callable(v), "a function (or a callable table)"
end

local function string_(v)
  return type(v) == "string", "a string"
end

local function non_empty_string(v)
  return type(v) == "string" and v ~= "", "a non-empty string"
end

local function boolean(v)
  return type(v) == "boolean", "a boolean"
end

local function context(v)
  return type(v) == "string" or type(v) == "table", "a string or a JSON-able table"
end

local function module_list(v)
  if type(v) ~= "table" then
    return false, "a list of module names"
  end
  local n = #v
  for k, name in pairs(v) do
    if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then
      return false, "a list of module names"
    end
    if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then
      return false, "a list of top-level module names (got " .. tostring(name) .. ")"
    end
  end
  return true
end

-- The checks, for other modules' option tables (rlm.llm.openai): each
-- returns ok, "what was wanted".
M.checks = {
  integer = integer,
  positive_number = positive_number,
  non_negative_number = non_negative_number,
  callable = callable,
  non_empty_string = non_empty_string,
}

-- name = { check, default }; a default of nil means optional.
local schema = {
  context = { context, "" },
  query = { string_ },
  root_llm = { callable, required = true },
  llm_query = { callable, required = true },
  llm_query_batch = { callable },
  cost_usd = { callable },
  on_event = { callable },
  max_iterations = { integer(1), 20 },
  step_timeout_ms = { positive_number, 60000 },
  root_timeout_ms = { positive_number, 600000 },
  interrupt_grace_ms = { positive_number, 2000 },
  start_timeout_ms = { positive_number, 30000 },
  max_rss_bytes = { integer(0), 2 ^ 30 },
  rss_poll_interval_ms = { integer(1), 50 },
  memory_cgroup = { boolean, true },
  max_sub_calls = { integer(0), 200 },
  max_concurrent_sub_calls = { integer(1), 8 },
  max_depth = { integer(1), 1 },
  max_wall_ms = { positive_number },
  max_total_cost_usd = { non_negative_number },
  max_total_tokens = { integer(1) },
  max_sub_prompt_chars = { integer(1) },
  stdout_truncate_chars = { integer(1), 2000 },
  python = { non_empty_string, "python3" },
  guardrails = { boolean, true },
  allowed_modules = { module_list },
  bwrap = { non_empty_string, "bwrap" },
  tmpdir = { non_empty_string },
  workdir_max_bytes = { integer(4096), 2 ^ 28 },
  workdir_max_files = { integer(1), 10000 },
  sandbox_uid_first = { integer(1), 1879048192 },
  sandbox_uid_count = { integer(1), 65536 },
  bind_pth_paths = { boolean, false },
  max_message_bytes = { integer(1024), 16 * 2 ^ 20 },
}

M.names = {}
for name in pairs(schema) do
  M.names[#M.names + 1] = name
end
table.sort(M.names)

-- check(opts) -> a new table with every option set or defaulted. Raises
-- "rlm.Session.new: option 'x' must be ..." on misuse.
function M.check(opts)
  if type(opts) ~= "table" then
    error("rlm.Session.new: expected a table of options, got " .. type(opts), 3)
  end
  for k in pairs(opts) do
    if type(k) ~= "string" or not schema[k] then
      error(("rlm.Session.new: unknown option '%s' (known: %s)"):format(
        tostring(k), table.concat(M.names, ", ")), 3)
    end
  end
  local out = {}
  for name, rule in pairs(schema) do
    local v = opts[name]
    if v == nil then
      if rule.required then
        error(("rlm.Session.new: option '%s' is required"):format(name), 3)
      end
      v = rule[2]
    else
      local ok, want = rule[1](v)
      if not ok then
        error(("rlm.Session.new: option '%s' must be %s, got %s"):format(
          name, want, type(v) == "string" and ("%q"):format(v) or type(v)), 3)
      end
    end
    out[name] = v
  end
  if out.sandbox_uid_first + out.sandbox_uid_count > 2 ^ 32 - 1 then
    error("rlm.Session.new: options 'sandbox_uid_first' + 'sandbox_uid_count' must stay below 2^32 - 1", 3)
  end
  if out.max_total_cost_usd and not out.cost_usd then
    error("rlm.Session.new: option 'max_total_cost_usd' needs option 'cost_usd'", 3)
  end
  out.tmpdir = out.tmpdir or os.getenv("TMPDIR") or "/tmp"
  out.allowed_modules = out.allowed_modules or {}
  return out
end

return M
