-- Host tools: Lua functions of the host that the REPL's code calls as Python
-- functions (docs/api.md, "Tools"). The code's call travels as a tool_call
-- message; the host checks it, counts it against max_tool_calls, hands it
-- out through poll() like an llm_query, and sends the tool's value (or its
-- error) back as a tool_result.
local core = require("rlm.core")
local json = require("rlm.base.json")
local textlib = require("rlm.base.text")

local util = require("rlm.base.util")

local M = {}

local function set(words)
  local t = {}
  for w in words:gmatch("%S+") do
    t[w] = true
  end
  return t
end

-- What a tool may not be called: Python's keywords, the builtins the code
-- uses, and the names the REPL already gives the code.
local KEYWORDS = set([[False None True and as assert async await break class continue def del elif
  else except finally for from global if import in is lambda nonlocal not or pass raise return try
  while with yield]])
local BUILTINS = set([[abs all any ascii bin bool bytearray bytes callable chr classmethod compile
  complex delattr dict dir divmod enumerate eval exec filter float format frozenset getattr globals
  hasattr hash help hex id input int isinstance issubclass iter len list locals map max memoryview
  min next object oct open ord pow print property range repr reversed round set setattr slice
  sorted staticmethod str sum super tuple type vars zip breakpoint exit quit]])
local REPL_NAMES = set([[context answer FINAL FINAL_VAR llm_query llm_query_batched rlm_query
  rlm_query_batched SubCallError ToolError]])

M.MAX_TOOLS = 100
M.MAX_NAME = 64
M.MAX_DOC = 1000

-- Why `name` cannot be a tool's name, or nil.
local function name_problem(name)
  if type(name) ~= "string" or not name:match("^[%a][%w_]*$") or #name > M.MAX_NAME then
    return ("%s is not a Python identifier of at most %d characters that starts with a letter")
      :format(type(name) == "string" and ("%q"):format(name:sub(1, 80)) or type(name), M.MAX_NAME)
  end
  if KEYWORDS[name] then
    return ("%q is a Python keyword"):format(name)
  end
  if BUILTINS[name] or REPL_NAMES[name] then
    return ("%q would hide the REPL's own %s"):format(name, name)
  end
end

-- The option check (rlm.options): ok, or false and what was wanted.
function M.check(tools)
  local want = "a table of name = function or { call = function, doc = string, async = boolean }"
  if type(tools) ~= "table" then
    return false, want
  end
  local n = 0
  for name, t in pairs(tools) do
    n = n + 1
    local problem = name_problem(name)
    if not problem and not util.is_callable(t) then
      if type(t) ~= "table" or not util.is_callable(t.call) then
        problem = ("tool %q is neither a function nor a table with a function `call`"):format(name)
      elseif t.doc ~= nil and (type(t.doc) ~= "string" or #t.doc > M.MAX_DOC) then
        problem = ("tool %q: doc must be a string of at most %d bytes"):format(name, M.MAX_DOC)
      elseif t.async ~= nil and type(t.async) ~= "boolean" then
        problem = ("tool %q: async must be a boolean"):format(name)
      else
        for k in pairs(t) do
          if k ~= "call" and k ~= "doc" and k ~= "async" then
            problem = ("tool %q: unknown field %s (call, doc, async)"):format(name, tostring(k))
          end
        end
      end
    end
    if problem then
      return false, want .. " (" .. problem .. ")"
    end
  end
  if n > M.MAX_TOOLS then
    return false, ("%s, of at most %d tools"):format(want, M.MAX_TOOLS)
  end
  return true
end

-- The tools as a sorted list of { name =, doc =, call = }.
function M.list(o)
  local out = {}
  for name, t in pairs(o.tools or {}) do
    local fn, doc = t, nil
    if not util.is_callable(t) then
      fn, doc = t.call, t.doc
    end
    out[#out + 1] = { name = name, doc = doc and doc:gsub("%s+", " ") or "", call = fn }
  end
  table.sort(out, function(a, b)
    return a.name < b.name
  end)
  return out
end

-- What the driver's configure message says about them: names and docs.
function M.specs(o)
  local list = M.list(o)
  if #list == 0 then
    return nil -- an empty table would be an object
  end
  local specs = {}
  for i, t in ipairs(list) do
    specs[i] = { name = t.name, doc = t.doc }
  end
  return specs
end

-- The system prompt's lines about the tools ("" with none).
function M.prompt(o)
  local list = M.list(o)
  if #list == 0 then
    return ""
  end
  local lines = { "", "", "Host tools (Python functions in the REPL; arguments and results are JSON values: "
    .. "str, int, float, bool, None, list, dict; a tool that fails raises `ToolError`, which you may "
    .. ("catch; at most %d tool calls per run):"):format(o.max_tool_calls) }
  for _, t in ipairs(list) do
    lines[#lines + 1] = ("- `%s(...)`%s"):format(t.name, t.doc ~= "" and (": " .. t.doc) or "")
  end
  return table.concat(lines, "\n")
end

local function call_of(o, name)
  local t = o.tools and o.tools[name]
  if t == nil or util.is_callable(t) then
    return t
  end
  return t.call
end

local unpack = rawget(table, "unpack") or rawget(_G, "unpack")

-- Starts the tool for request ev (rlm.dispatch): start(fn, args, settle)
-- as for llm_query. The tool gets the code's positional arguments as its
-- Lua arguments, then its keyword arguments as one table when it gave any
-- (docs/api.md, "Tools"); an async tool gets done first. It answers a
-- value (rlm.null for None), nil and a message, or raises.
function M.start(s, ev, start)
  local fn, t = call_of(s.opts, ev.name), s.opts.tools[ev.name]
  local async = type(t) == "table" and not util.is_callable(t) and t.async
  local function call(_, done)
    local argv, n = {}, 0
    if async then
      argv[1], n = done, 1
    end
    for i = 1, ev.argc do
      argv[n + i] = ev.positional[i]
    end
    n = n + ev.argc
    if ev.kwargs then
      argv[n + 1], n = ev.kwargs, n + 1
    end
    return fn(unpack(argv, 1, n))
  end
  start(call, nil, function(ok, value, message)
    if not ok then
      s:reply(ev.id, nil, tostring(value))
    elseif value == nil then
      s:reply(ev.id, nil, type(message) == "string" and message or M.NOTHING)
    else
      s:reply(ev.id, value)
    end
  end)
end

M.NOTHING = "the tool returned nothing (a tool returns a JSON value; rlm.null is Python's None)"

-- Sends a tool_result: the value, or the error the code raises as ToolError.
local function send(s, scheduler, id, value, problem, name)
  scheduler:close_open()
  local text
  if problem == nil then
    local ok, encoded = pcall(json.encode, { type = "tool_result", id = id, value = value })
    if not ok then
      problem = ("tool %s returned a value JSON cannot carry: %s"):format(name, textlib.error_line(encoded))
    elseif #encoded > s.opts.sandbox.max_message_bytes then
      problem = ("tool %s returned %d bytes of JSON, more than sandbox.max_message_bytes (%d)")
        :format(name, #encoded, s.opts.sandbox.max_message_bytes)
    else
      text = encoded
    end
  end
  text = text or json.encode({ type = "tool_result", id = id, error = problem })
  return s.sandbox:send_line(text) -- on error, the reason it cannot take input is queued
end

-- The code of session s called a tool: check it, count it, hand it out
-- through poll() (s's scheduler). A name the host never gave is a hostile
-- driver: protocol_error. A call past max_tool_calls is not made: the code
-- gets a ToolError.
function M.call(s, scheduler, msg)
  local o, tree = s.opts, s.tree
  if scheduler:busy() then
    return s:_error("protocol_error", "the driver made a call before its last one was answered")
  end
  if not call_of(o, msg.name) then
    return s:_error("protocol_error", ("the driver called a tool %q the host does not have")
      :format(msg.name:sub(1, M.MAX_NAME)))
  end
  if s.conversation.interrupted then
    -- The step ran out of time: no call is made until the exec ends.
    return s.sandbox:send({ type = "tool_result", id = msg.id, interrupted = true })
  end
  scheduler:open(msg.id, 1, true)
  if tree:tool_calls_spent() then
    return send(s, scheduler, msg.id, nil, ("not called: the run's max_tool_calls (%d) are spent")
      :format(o.max_tool_calls))
  end
  local ok, err = s:_check_budget()
  if not ok then
    return nil, err
  end
  local index = tree:count_tool_call()
  local positional, args = msg.args or {}, {}
  for i, v in ipairs(positional) do
    args[i] = v
  end
  local kwargs = msg.kwargs and next(msg.kwargs) ~= nil and msg.kwargs or nil
  for k, v in pairs(kwargs or {}) do
    args[k] = v
  end
  -- args (positional at 1..n, keywords by name) for poll() and the event;
  -- positional, argc and kwargs for the call.
  scheduler:request({ type = "tool_call", name = msg.name, args = args, positional = positional, argc = #positional,
    kwargs = kwargs, depth = s.depth, driver_id = msg.id, exec_id = s.conversation.next_exec_id, index = index })
  return true
end

-- One line of why a tool failed, without the host's paths and addresses.
local reason = textlib.error_line

-- A tool answered (through reply()): its value or its error goes back to
-- the code, and an event says so.
function M.answer(s, scheduler, reply)
  local req = reply.request
  if req.exec_id ~= s.conversation.next_exec_id or s.conversation.interrupted then
    return true -- the exec it belonged to is over, or was interrupted
  end
  local value, problem = reply.text, nil
  if reply.failed then
    value, problem = nil, reason(reply.message)
  elseif value == nil then
    problem = M.NOTHING
  end
  local ok, err = s.sandbox:deadline_check()
  if not ok then
    return nil, err
  end
  ok, err = s:_emit({ type = "tool_call", step = s.conversation.iterations, name = req.name, args = req.args,
    result = value, error = problem, latency_ms = core.now_ms() - req.t0, index = req.index })
  if not ok then
    return nil, err
  end
  return send(s, scheduler, req.driver_id, value, problem, req.name)
end

return M
