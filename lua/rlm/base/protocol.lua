-- The host's reading of the driver's lines (see docs/protocol.md). The
-- driver is hostile: a line that is not what the protocol allows at that
-- point is an error, never a guess.
local cjson = require("cjson")
local json = require("rlm.base.json")
local util = require("rlm.base.util")

local M = {}

M.VERSION = 1

local tointeger = rawget(math, "tointeger") -- Lua 5.3+

-- Ids and counts: integers the host can print and compare, never 1e999
-- (inf), NaN, a fraction, a negative or a number past 2^31.
M.MAX_ID = 2 ^ 31 - 1

local function is_int(v)
  return type(v) == "number" and v >= 0 and v <= M.MAX_ID and v == math.floor(v)
end

-- The most JSON values a line may hold, for a max_message_bytes: what
-- decoding it may build on the host is bounded by this count, not by the
-- bytes (3 bytes of `"",` are a Lua string slot each). The driver checks
-- the same bound before it sends a final value.
-- PUC Lua 5.1 interns every string with a hash that samples a few bytes,
-- so strings that differ only where it does not look all collide: decoding
-- n of them costs O(n^2). There the cap is 16384 (a quarter of a second at
-- worst here); LuaJIT and 5.2+ hash differently.
local COLLIDING_HASH = _VERSION == "Lua 5.1" and not rawget(_G, "jit")

function M.max_values(max_message_bytes)
  local n = math.max(4096, math.floor(max_message_bytes / 256))
  return COLLIDING_HASH and math.min(n, 16384) or n
end

local function opt_string(v)
  return v == nil or v == cjson.null or type(v) == "string"
end

local function string_list(v)
  if type(v) ~= "table" then
    return false
  end
  for i = 1, #v do
    if type(v[i]) ~= "string" then
      return false
    end
  end
  return true
end

-- llm_query's optional model= hint: a short string (the driver checks the
-- same bound).
local MAX_MODEL_BYTES = 800

local function model_hint(v)
  return v == nil or (type(v) == "string" and #v > 0 and #v <= MAX_MODEL_BYTES)
end

-- One nested session's question: a prompt and an optional context, text or
-- a JSON document.
local function sub_session(m)
  if type(m) ~= "table" or type(m.prompt) ~= "string" then
    return false
  end
  if m.context == nil or m.context == cjson.null then
    m.context, m.format = nil, nil
    return true
  end
  return type(m.context) == "string" and (m.format == "text" or m.format == "json")
end

local function is_list(v)
  return type(v) == "table" and #v >= 1 and next(v, #v) == nil
end

-- A tool_call line's name and arguments (the tool table, rlm.engine.tools,
-- checks the name against the host's tools).
local function valid_call(m)
  return type(m.name) == "string" and (m.args == nil or util.is_json_array(m.args))
    and (m.kwargs == nil or util.is_json_object(m.kwargs))
end

local validators = {
  hello = function(m)
    return is_int(m.protocol) and type(m.python) == "string"
  end,
  configured = function()
    return true
  end,
  self_test_result = function(m)
    if type(m.checks) ~= "table" then
      return false
    end
    for name, c in pairs(m.checks) do
      if type(name) ~= "string" or type(c) ~= "table" or type(c.ok) ~= "boolean"
        or not opt_string(c.detail) then
        return false
      end
    end
    return true
  end,
  ready = function(m)
    return opt_string(m.error) and opt_string(m.context_type)
  end,
  exec_result = function(m)
    if not is_int(m.id) or type(m.stdout) ~= "string" or not opt_string(m.error)
      or (m.syntax_error ~= nil and type(m.syntax_error) ~= "boolean")
      or (m.literal ~= nil and m.literal ~= true) or not opt_string(m.value) then
      return false
    end
    local f = m.final
    if f == nil or f == cjson.null then
      return true
    end
    if type(f) ~= "table" then
      return false
    end
    if f.kind == "value" or f.kind == "answer" then
      return type(f.value) == "string"
    end
    if f.kind ~= "var" or type(f.name) ~= "string" or type(f.json) ~= "boolean" then
      return false
    end
    -- A JSON value comes as its text (value_json), decoded in M.decode.
    if f.numbers ~= nil and f.numbers ~= "ints" and f.numbers ~= "floats" and f.numbers ~= "mixed" then
      return false
    end
    -- The answer's text, when an int the host cannot hold came as a string.
    if f.answer ~= nil and (type(f.answer) ~= "string" or not f.json) then
      return false
    end
    if f.value_json ~= nil then
      return f.json and type(f.value_json) == "string"
    end
    return f.value ~= nil and (f.json or type(f.value) == "string")
  end,
  llm_query = function(m)
    return is_int(m.id) and type(m.prompt) == "string" and model_hint(m.model)
  end,
  llm_batch = function(m)
    return is_int(m.id) and string_list(m.prompts) and is_list(m.prompts) and model_hint(m.model)
  end,
  rlm_query = function(m)
    return is_int(m.id) and sub_session(m)
  end,
  rlm_batch = function(m)
    if not is_int(m.id) or not is_list(m.queries) then
      return false
    end
    for _, q in ipairs(m.queries) do
      if not sub_session(q) then
        return false
      end
    end
    return true
  end,
  tool_call = function(m)
    return is_int(m.id) and valid_call(m)
  end,
  vars = function(m)
    if not is_int(m.id) or not is_int(m.more) or type(m.vars) ~= "table" or (m.vars[1] and not is_list(m.vars)) then
      return false
    end
    for _, v in ipairs(m.vars) do
      local size = type(v) == "table" and v[3]
      if type(v) ~= "table" or type(v[1]) ~= "string" or type(v[2]) ~= "string"
        or not (size == nil or size == cjson.null or (type(size) == "number" and size >= 0 and size <= 2 ^ 53
          and size == math.floor(size))) then
        return false
      end
    end
    return true
  end,
  fatal = function(m)
    return opt_string(m.message)
  end,
}

-- decode(line, allowed[, max_values]) -> msg | nil, why. `allowed` is a set
-- of the types the host expects now; max_values bounds a FINAL_VAR value.
function M.decode(line, allowed, max_values)
  local ok, msg = pcall(json.decode, line)
  if not ok then
    return nil, "a line that is not JSON: " .. tostring(msg)
  end
  if type(msg) ~= "table" or type(msg.type) ~= "string" then
    return nil, "a line that is not a message object"
  end
  local check = validators[msg.type]
  if not check then
    return nil, ("an unknown message type %q"):format(msg.type:sub(1, 64))
  end
  if not allowed[msg.type] then
    return nil, ("a %q message where it expected %s"):format(msg.type, M.describe(allowed))
  end
  if not check(msg) then
    return nil, ("a malformed %q message"):format(msg.type)
  end
  -- Where a message's numbers reach anything (ids are checked above; the
  -- other fields the host reads are strings): a final value, a tool's
  -- arguments, the start's stamps (t). Not the whole message: a batch of
  -- 60,000 prompts would cost half its decoding again.
  if not (json.finite(msg.final) and json.finite(msg.args) and json.finite(msg.kwargs) and json.finite(msg.t)) then
    return nil, ("a %q message with a number past a double's range (1e999, or 310 digits)"):format(msg.type)
  end
  if msg.error == cjson.null then
    msg.error = nil
  end
  if msg.final == cjson.null then
    msg.final = nil
  end
  -- A FINAL_VAR value: lua-cjson decoded it where that is exact (no
  -- numbers, floats only, or on 5.1 and LuaJIT, where the driver sends no
  -- integer past 2^53); "ints" (integers within 2^53 only) are made Lua
  -- integers; a value holding integers and floats comes as its text
  -- (value_json) for decode_value. A driver that gives a wrong hint only
  -- gets its own answer's numbers wrong.
  local f = msg.final
  if f and f.kind == "var" and f.value_json then
    local value, why = json.decode_value(f.value_json, max_values or math.huge)
    if value == nil then
      return nil, "a FINAL_VAR value that is not JSON: " .. why
    end
    f.value, f.value_json = value, nil
  elseif f and f.kind == "var" and f.json and f.numbers == "ints" and tointeger then
    if type(f.value) == "table" then
      json.integers(f.value)
    elseif type(f.value) == "number" then
      f.value = tointeger(f.value) or f.value
    end
  end
  return msg
end

-- The probe's report (python/probe.py); it runs on the host, but its answer
-- decides what is bound into the sandbox, so its shape is checked too.
function M.decode_probe(line)
  local info = json.decode(line)
  if type(info) ~= "table" or type(info.executable) ~= "string"
    or info.executable:sub(1, 1) ~= "/" or not string_list(info.sys_path)
    or not string_list(info.files) then
    return nil
  end
  if type(info.interpreter) ~= "string" then
    info.interpreter = nil
  end
  if not string_list(info.pth_paths) then
    info.pth_paths = {}
  end
  return info
end

function M.describe(allowed)
  local names = {}
  for k in pairs(allowed) do
    names[#names + 1] = k
  end
  table.sort(names)
  return table.concat(names, " or ")
end

return M
