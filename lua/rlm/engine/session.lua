-- A session's state: what one session and the nested sessions it starts
-- share (the tree), its own fields, and how it fails. The methods of the
-- other modules (boot, wire, limits, subcalls, nested, turn, finals,
-- loop) are mixed into the one Session class here; rlm (init.lua) adds
-- the public API and run()/step() (rlm.drive.blocking).
local errors = require("rlm.base.errors")
local prompt = require("rlm.engine.prompt")
local protocol = require("rlm.base.protocol")
local tools = require("rlm.engine.tools")
local util = require("rlm.base.util")

local Session = {}
Session.__index = Session

-- What a session and the nested sessions it starts share: one budget, one
-- cap on the sub-calls in flight, and the clock of the run.
local function new_tree()
  return {
    sub_calls = 0,
    tokens = { input = 0, output = 0, total = 0 },
    in_flight = 0, -- sub-calls handed out and not yet answered
    held = {}, -- { session =, req = }: past max_concurrent_sub_calls, not yet handed out
    batches = 0,
    live_children = 0, -- nested sessions made and not yet closed (max_live_sandboxes)
  }
end

-- A session over context_data (text, or a JSON document); parent is the
-- session whose code started it with rlm_query, or nil.
local function new_session(o, parent, context_data, context_format, description)
  local self = setmetatable({
    opts = o,
    parent = parent,
    depth = parent and parent.depth + 1 or 0,
    tree = parent and parent.tree or new_tree(),
    context_data = context_data,
    context_format = context_format,
    history = {},
    iterations = 0,
    next_exec_id = 0,
    next_request_id = 0,
    outbox = {}, -- requests and events not yet handed out by poll()
    inbox = {}, -- replies not yet taken by the engine
    pending = {}, -- id -> request handed out and not yet answered
    routes = {}, -- id -> { child =, id = } for a request passed on from a child
    children = {}, -- nested sessions running for the current exec
    queued = {}, -- nested sessions asked for past max_concurrent_sub_calls
    finished = {}, -- nested sessions that ended, their sandboxes kept till their call is answered
    started_children = 0,
    open_slots = 0, -- answers the driver still waits for, for its current call
    max_values = protocol.max_values(o.max_message_bytes), -- JSON values in one line
  }, Session)
  -- Names the session in its events: "1" for the root, "1.2" for the second
  -- session its code started, and so on.
  if parent then
    parent.started_children = parent.started_children + 1
    self.session_id = parent.session_id .. "." .. parent.started_children
  else
    self.session_id = "1"
  end
  self.tokens = self.tree.tokens
  -- A system_prompt function that fails: misuse at Session.new for the
  -- root; a nested session ends with callback_error when it starts.
  local system, problem = prompt.system(o, description, self.depth)
  if not system then
    if not parent then
      error("rlm.Session.new: " .. problem, 3)
    end
    self.system_problem, system = problem, ""
  end
  self.messages = {
    -- The tools and the answer's schema are told whatever the prompt is.
    { role = "system", content = system .. tools.prompt(o) .. require("rlm.engine.answer").prompt(o) },
    { role = "user", content = prompt.first_user(o.query) },
  }
  return self
end


-- The nested session for one rlm_query: the same options and callbacks, the
-- prompt as its question, and the given context (or the prompt) as its own.
function Session:_new_child(call)
  local o = {}
  for k, v in pairs(self.opts) do
    o[k] = v
  end
  o.query, o.context = call.prompt, nil
  if call.context and call.format == "json" then
    return new_session(o, self, call.context, "json", prompt.describe_json(call.context))
  end
  local text = call.context or call.prompt
  return new_session(o, self, text, "text", prompt.describe(text))
end

-- Ends the session with err: the sandbox is torn down, and every later
-- call returns the same err.
function Session:_fail(err)
  if self.closed and not self.failed and err.kind ~= "cancelled" then
    return self:_cancelled()
  end
  err.history = self.history
  self.failed = self.failed or err
  self:_end_children()
  self:_teardown()
  return nil, self.failed
end

-- The run ends because close() was called (from a callback, on_event, or
-- another coroutine).
function Session:_cancelled()
  return self:_fail(errors.new("cancelled", "the session was closed (close() or a cancel) before the run ended"))
end

function Session:_error(kind, message, fields)
  return self:_fail(errors.new(kind, message, fields))
end

function Session:_emit(ev)
  local cb = self.opts.on_event
  if not cb then
    return true
  end
  ev.depth = ev.depth or self.depth
  ev.session = self.session_id
  local ok, e = util.call_protected(cb, ev)
  if self.closed then
    return self:_cancelled()
  end
  if not ok then
    return self:_error("callback_error", "on_event raised: " .. tostring(e))
  end
  return true
end

Session.new_session = new_session

for _, methods in ipairs({ tools.methods, require("rlm.engine.answer").methods,
  require("rlm.engine.finals").methods }) do
  for k, fn in pairs(methods) do
    assert(Session[k] == nil, k)
    Session[k] = fn
  end
end

for _, name in ipairs({ "wire", "boot", "limits", "subcalls", "nested", "turn", "loop" }) do
  for k, fn in pairs(require("rlm.engine." .. name)) do
    assert(Session[k] == nil, k)
    Session[k] = fn
  end
end

return Session
