-- Option checking for Session.new. Misuse raises, naming the option.
local checks = require("rlm.base.checks")
local integer, non_negative_number = checks.integer, checks.non_negative_number
local milliseconds, callable, string_ = checks.milliseconds, checks.callable, checks.string
local text_or_callable, boolean = checks.text_or_callable, checks.boolean
local backend = require("rlm.sandbox.backend")
local shape = require("rlm.sandbox.shape")

local M = {}

-- The deepest a JSON context may nest: what the protocol decodes
-- (json.lua's decode_max_depth), well below where the sandbox's
-- json.loads runs out of recursion (about 990).
M.MAX_CONTEXT_DEPTH = 200

-- UTF-8 (rlm.base.text, csrc/utf8.c): whether s is what Python's strict
-- decoder takes (true, or false and the position of the first bad byte),
-- and what its str holds.
local textlib = require("rlm.base.text")
local utf8_valid = textlib.utf8_valid

local function path_to(path, k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then
    return path .. "." .. k
  elseif type(k) == "string" then
    local bad = utf8_valid(k) and "[%c\"\\]" or "[%c\"\\\128-\255]"
    return path .. "[\"" .. k:gsub(bad, function(ch)
      return ("\\%d"):format(ch:byte())
    end) .. "\"]"
  end
  return path .. "[" .. tostring(k) .. "]"
end

-- nil, or why the driver would refuse this context (so that run() never
-- refuses as protocol_error what new accepted): a string or key that is
-- not UTF-8, or nesting past MAX_CONTEXT_DEPTH (a cycle included). The
-- rest (functions, sparse arrays, NaN) is left to the JSON encoder.
local function context_problem(v, path, depth)
  if type(v) == "string" then
    local ok, at = utf8_valid(v)
    return not ok and ("holds a string that is not UTF-8 at %s (byte %d)"):format(path, at) or nil
  elseif type(v) ~= "table" then
    return nil
  end
  if depth > M.MAX_CONTEXT_DEPTH then
    return ("nests deeper than %d tables at %s"):format(M.MAX_CONTEXT_DEPTH, path:sub(1, 200)
      .. (#path > 200 and "..." or ""))
  end
  for k, item in pairs(v) do
    local at = path_to(path, k)
    if type(k) == "string" and not utf8_valid(k) then
      return ("holds a key that is not UTF-8 at %s"):format(at)
    end
    local why = context_problem(item, at, depth + 1)
    if why then
      return why
    end
  end
  return nil
end

-- The fewest bytes of the sandbox's memory the context takes once the
-- driver holds it as Python objects: a floor, so that a context refused for
-- it could never have loaded (bench/context_fit.lua measures the real need
-- beside it). A text context is one str, its characters' storage counted
-- exactly by rlm.core (1, 2 or 4 bytes each, by the widest: PEP 393); the
-- interpreter, the objects' headers and the load's copies come on top. A
-- JSON table: its strings alike, each key once (json.loads shares equal
-- keys), none of one character (it may be a shared singleton); numbers,
-- booleans and the containers count 0.
local function str_floor(s)
  local bytes, chars = textlib.utf8_str_size(s)
  return chars > 1 and bytes or 0
end

local function floor_bytes(v, keys)
  if type(v) == "string" then
    return str_floor(v)
  elseif type(v) ~= "table" then
    return 0
  end
  local n = 0
  for k, item in pairs(v) do
    if type(k) == "string" and not keys[k] then
      keys[k] = true
      n = n + str_floor(k)
    end
    n = n + floor_bytes(item, keys)
  end
  return n
end

function M.context_floor_bytes(v)
  return floor_bytes(v, {})
end

local function context(v)
  if type(v) == "string" then
    return true -- a text context is bytes; the driver keeps invalid UTF-8 as it is
  elseif type(v) ~= "table" then
    return false, "a string or a JSON-able table"
  end
  local why = context_problem(v, "context", 1)
  return why == nil, "a JSON-able table", why
end

-- The sandbox: nil or { backend = "bubblewrap" } (beside the host),
-- "exec" (the far side of a stream), "podman" or "docker" (a container),
-- with what shapes the sandbox (rlm.sandbox.shape: the interpreter, the
-- limits, the start); each backend checks its fields (rlm.sandbox.backend).
-- Raises naming the field.
local function check_sandbox(where, v)
  backend.check_option(where, v, 3)
end

local function sandbox_rule(v)
  return type(v) == "table", "a table"
end

-- compact: a table of fields, each an option of its own ('compact.at_tokens').
local function compact_rule(v)
  return type(v) == "table", 'a table { at_tokens = n[, keep_turns = k][, summary = "digest" | "model"] }'
end

local function summary_kind(v)
  return v == "digest" or v == "model", '"digest" or "model"'
end

-- cost: a table of fields, each an option of its own ('cost.max_usd').
local function cost_rule(v)
  return type(v) == "table", "a table { usd = function() return dollars spent end[, max_usd = n] }"
end

-- The checks, for other modules' option tables: rlm.base.checks.
M.checks = checks

-- What one driver line needs besides the output and the traceback
-- (rlm.sandbox.shape).
M.LINE_OVERHEAD = shape.LINE_OVERHEAD

-- name = { check, default }; a default of nil means optional.
local schema = {
  context = { context, "" },
  query = { string_ },
  root_llm = { callable, required = true },
  llm_query = { callable, required = true },
  llm_query_batch = { callable },
  on_event = { callable },
  system_prompt = { text_or_callable },
  max_iterations = { integer(1, 10 ^ 6), 20 },
  step_timeout_ms = { milliseconds, 60000 },
  root_timeout_ms = { milliseconds, 600000 },
  max_rss_bytes = { integer(0, 2 ^ 44), 2 ^ 30 },
  max_sub_calls = { integer(0, 2 ^ 31 - 1), 200 },
  max_concurrent_sub_calls = { integer(1, 4096), 8 },
  max_depth = { integer(1, 32), 1 },
  max_wall_ms = { milliseconds },
  max_total_tokens = { integer(1, 2 ^ 50) },
  max_sub_prompt_chars = { integer(1, 2 ^ 30) },
  stdout_truncate_chars = { integer(1, 2 ^ 26), 2000 },
  guardrails = { boolean, true },
  tools = { require("rlm.engine.tools").check },
  max_tool_calls = { integer(0, 2 ^ 31 - 1), 1000 },
  validate = { callable },
  answer_schema = { require("rlm.engine.answer").check_schema },
  fallback = { boolean, true },
  pool = { function(v)
    return getmetatable(v) == require("rlm.sandbox.pool"), "an rlm.Pool"
  end },
  sandbox = { sandbox_rule },
  compact = { compact_rule, fields = {
    at_tokens = { integer(1000, 2 ^ 40), required = true },
    keep_turns = { integer(1, 10 ^ 6), 4 },
    summary = { summary_kind, "digest" },
  } },
  sub_call_cache = { require("rlm.engine.cache").check, false },
  journal = { require("rlm.engine.journal_option").check },
  cost = { cost_rule, fields = {
    usd = { callable, required = true },
    max_usd = { non_negative_number },
  } },
}

-- The options of earlier releases, and where each went (CHANGES.md): one
-- given raises, naming its new place, rather than being ignored.
M.MOVED = {
  cost_usd = "cost.usd",
  max_total_cost_usd = "cost.max_usd",
  sub_call_cache_namespace = "sub_call_cache.namespace",
  sandbox_uid_first = "sandbox.uids.first",
  sandbox_uid_count = "sandbox.uids.count",
  max_live_sandboxes = "max_concurrent_sub_calls",
}
for name in pairs(shape.FIELDS) do
  if name ~= "uids" then
    M.MOVED[name] = "sandbox." .. name
  end
end
local MOVED_WHY = {
  max_live_sandboxes = ", which caps the nested sessions alive over the run's tree as well as the sub-calls "
    .. "in flight",
}

local function refuse_moved(where, opts)
  for name, to in pairs(M.MOVED) do
    if opts[name] ~= nil then
      error(("%s: option '%s' is now %s%s"):format(where, name, to, MOVED_WHY[name] or ""), 4)
    end
  end
end

-- The options that shape a sandbox or the pool-level configure: a pool
-- (rlm.Pool.new) takes them, and a session from the pool gets them from it.
M.POOL_OPTIONS = { "guardrails", "max_rss_bytes", "sandbox" }
local pool_option = {}
for _, name in ipairs(M.POOL_OPTIONS) do
  pool_option[name] = true
end

M.names = checks.names(schema)

-- Whether two option values are the same data: equal, or tables with the
-- same keys holding the same data (to a depth of 8, which no option
-- nests past).
local function same(a, b, depth)
  if type(a) ~= "table" or type(b) ~= "table" or a == b then
    return a == b
  end
  depth = depth or 8
  if depth == 0 then
    return false
  end
  for k, v in pairs(a) do
    if not same(v, b[k], depth - 1) then
      return false
    end
  end
  for k in pairs(b) do
    if a[k] == nil then
      return false
    end
  end
  return true
end

-- The sandbox option as its backend reads it, defaults filled in.
local function sandbox_read(v)
  return backend.read_option(v)
end

-- nil, or the name of the option (a sandbox field: 'sandbox.python') a
-- pooled session gives that differs from the pool's. A sandbox field left
-- out is the pool's.
local function differs(name, v, pooled)
  if name ~= "sandbox" then
    return not same(v, pooled) and name or nil
  end
  local read = sandbox_read(v)
  local fields = {}
  for k in pairs(v) do
    fields[#fields + 1] = k
  end
  table.sort(fields)
  for _, k in ipairs(fields) do
    if not same(read[k], pooled[k]) then
      return "sandbox." .. k
    end
  end
end

-- check_pool(opts, max_size) -> the pool's options (every one of
-- POOL_OPTIONS, checked or defaulted), size. Raises "rlm.Pool.new: option
-- 'x' ..." on misuse.
function M.check_pool(opts, max_size)
  local where = "rlm.Pool.new"
  local pool_schema = { size = { integer(1, max_size), required = true } }
  for name in pairs(pool_option) do
    pool_schema[name] = schema[name]
  end
  if type(opts) == "table" then
    refuse_moved(where, opts)
    check_sandbox(where, opts.sandbox)
  end
  local out = checks.options(where, opts, pool_schema, nil, 3)
  local size = out.size
  out.size = nil
  out.sandbox = sandbox_read(out.sandbox)
  return out, size
end

-- check(opts) -> a new table with every option set or defaulted. Raises
-- "rlm.Session.new: option 'x' must be ..." on misuse.
function M.check(opts)
  local where = "rlm.Session.new"
  if type(opts) ~= "table" then
    error(where .. ": expected a table of options, got " .. type(opts), 3)
  end
  refuse_moved(where, opts)
  check_sandbox(where, opts.sandbox)
  local pool = opts.pool ~= nil and checks.option(where, "pool", schema.pool, opts.pool, 3)
  local given = opts
  if pool then
    -- The pool's sandboxes are started with its options: a session may
    -- repeat one, not change it.
    given = {}
    for k, v in pairs(opts) do
      given[k] = v
    end
    for name in pairs(pool_option) do
      local v = opts[name]
      local which = v ~= nil and differs(name, v, pool.opts[name])
      if which then
        error(("%s: option '%s' differs from the pool's (a pooled sandbox was started "
          .. "with the pool's; leave it out or make it the same)"):format(where, which), 3)
      end
      given[name] = pool.opts[name]
    end
  end
  local out = checks.options(where, given, schema, M.names, 3)
  out.sandbox = sandbox_read(out.sandbox)
  -- One exec_result line holds the output and the traceback, each up to
  -- stdout_truncate_chars characters of up to 6 bytes as JSON (\u0001),
  -- and the frame around them; a FINAL needs room beside the output.
  local need = 12 * out.stdout_truncate_chars + M.LINE_OVERHEAD
  if out.sandbox.max_message_bytes < need then
    error(("rlm.Session.new: option 'sandbox.max_message_bytes' (%d) must be at least 12 * option "
      .. "'stdout_truncate_chars' + %d (%d here): a block's output and error, escaped as JSON, "
      .. "must fit in one line"):format(out.sandbox.max_message_bytes, M.LINE_OVERHEAD, need), 3)
  end
  -- A host's store may be shared by sessions whose llm_query answers for
  -- someone else (another customer's key, another model): each says whose
  -- answers it keeps and finds, and sessions share answers only by naming
  -- the same namespace.
  local cache = out.sub_call_cache
  if type(cache) == "table" and cache.store ~= nil and not cache.namespace then
    error("rlm.Session.new: option 'sub_call_cache.store' (a host's store) needs option 'sub_call_cache.namespace' "
      .. "(whose answers it keeps: sessions share cached answers only under the same namespace)", 3)
  end
  -- false, or { store =, namespace = } (true is the built-in store, no namespace).
  out.sub_call_cache = cache and { store = type(cache) == "table" and cache.store or nil,
    namespace = type(cache) == "table" and cache.namespace or nil }
  if out.journal ~= nil then
    out.journal = require("rlm.engine.journal_option").read(out.journal)
  end
  -- A context that cannot fit is refused here, not after a sandbox's start
  -- and a load that ends in memory_limit (a 2 GB one ran 29 s for that).
  local floor = out.max_rss_bytes > 0 and M.context_floor_bytes(out.context) or 0
  if floor > out.max_rss_bytes then
    error(("rlm.Session.new: option 'context' cannot fit option 'max_rss_bytes' (%.0f bytes): its %s "
      .. "take at least %.0f bytes of the sandbox's memory as Python objects; raise option 'max_rss_bytes' (0 "
      .. "turns the limit off) or give less context"):format(out.max_rss_bytes, type(out.context) == "string"
      and ("%.0f bytes"):format(#out.context) or "strings", floor), 3)
  end
  return out
end

return M
