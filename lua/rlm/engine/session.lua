-- A session: a small object that holds its collaborators, each made here
-- with its own fields and a few named methods (docs/architecture.md, "Who
-- owns what"): its engine (rlm.engine.loop: the coroutine, its wait, the
-- descriptors behind fd()), its sandbox (rlm.engine.handle), its sub-call
-- scheduler (rlm.engine.subcalls), its nested sessions (rlm.engine.nested),
-- the tree's budgets (rlm.engine.budgets, shared with its nested sessions),
-- its deadlines (rlm.engine.clock) and its conversation with the root model
-- and the turns that run it (rlm.engine.conversation). What stays the
-- session's own is the pump (poll() and reply(), which every host's loop
-- calls), and here, how it fails and what it reports. The
-- collaborators ask the session for those through its methods. rlm
-- (init.lua) adds the public API and run()/step() (rlm.drive.blocking).
local budgets = require("rlm.engine.budgets")
local clock = require("rlm.engine.clock")
local conversation = require("rlm.engine.conversation")
local core = require("rlm.core")
local engine = require("rlm.engine.loop")
local errors = require("rlm.base.errors")
local events = require("rlm.base.events")
local handle = require("rlm.engine.handle")
local nested = require("rlm.engine.nested")
local prompt = require("rlm.engine.prompt")
local subcalls = require("rlm.engine.subcalls")
local tools = require("rlm.engine.tools")
local util = require("rlm.base.util")

-- Every field of a session, in one place (spec/layers_spec.lua checks that
-- the engine sets no other; each collaborator declares its own).
---@class Session
-- Its collaborators, each made here with its own fields and methods
---@field engine Engine its coroutine, its wait, the descriptors behind fd() (rlm.engine.loop)
---@field conversation Conversation its root model's conversation and the turns that run it (rlm.engine.conversation)
---@field sandbox Handle its sandbox: the start, the wire to the driver (rlm.engine.handle, boot)
---@field scheduler Scheduler its sub-calls: requests out, replies in (rlm.engine.subcalls)
---@field nested Nested its nested sessions (rlm.engine.nested)
---@field tree Budgets the budgets it shares with its nested sessions (rlm.engine.budgets)
---@field clock Clock its deadlines (rlm.engine.clock)
---@field journal Journal|nil its journal (option journal; the root's only: rlm.engine.journal)
-- Who it is
---@field opts table the checked options (rlm.engine.options)
---@field parent Session|nil the session whose code started it (rlm_query)
---@field root Session the root of its tree (itself, when it is not nested)
---@field depth integer 0 for the root
---@field session_id string "1", "1.2", ...: names it in its events
---@field system_problem string|nil why its system_prompt function failed (a nested session ends with it)
-- The pump: poll() and reply()
---@field pumped_at number|nil when it was last polled (others wait for its probe meanwhile: rlm.sandbox.probe)
---@field stepped boolean|nil its first step is out
-- How it ends
---@field terminal table|nil the run's end: { type = "done" | "error", ... }
---@field failed table|nil the error it ended with; every later call returns it
---@field closed boolean|nil close() was called
---@field trim_token userdata|nil on Lua 5.1 and LuaJIT: the allocator's trim after its collection (rlm/init.lua)
-- The run's opening (rlm.engine.opening)
---@field starting boolean|nil the sandbox starts: replies wait, callbacks' time is the start's
local Session = {}
Session.__index = Session

-- A session over context_data (text, or a JSON document); parent is the
-- session whose code started it with rlm_query, or nil.
local child_of

local function new_session(o, parent, context_data, context_format, description)
  local self = setmetatable({
    opts = o,
    parent = parent,
    depth = parent and parent.depth + 1 or 0,
    tree = parent and parent.tree or budgets.new(o), -- one budget for the tree
  }, Session)
  -- Names the session in its events: "1" for the root, "1.2" for the second
  -- session its code started, and so on.
  self.session_id = parent and parent.nested:next_id() or "1"
  self.root = parent and parent.root or self
  local tree = self.tree
  self.engine = engine.new(self)
  self.sandbox = handle.new(self, context_data, context_format)
  self.scheduler = subcalls.new(self)
  self.nested = nested.new(self, child_of)
  self.clock = clock.new(o, function()
    return tree:wall_left()
  end)
  -- A system_prompt function that fails: misuse at Session.new for the
  -- root; a nested session ends with callback_error when it starts.
  local system, problem = prompt.system(o, description, self.depth)
  if not system then
    if not parent then
      error("rlm.Session.new: " .. problem, 3)
    end
    self.system_problem, system = problem, ""
  end
  -- The tools and the answer's schema are told whatever the prompt is.
  self.conversation = conversation.new(self, system .. tools.prompt(o) .. require("rlm.engine.answer").prompt(o))
  return self
end


-- The nested session for one rlm_query of parent's (its Nested makes it):
-- the same options and callbacks, the prompt as its question, and the
-- given context (or the prompt) as its own.
function child_of(parent, call)
  local o = {}
  for k, v in pairs(parent.opts) do
    o[k] = v
  end
  o.query, o.context = call.prompt, nil
  if call.context and call.format == "json" then
    return new_session(o, parent, call.context, "json", prompt.describe_json(call.context))
  end
  local text = call.context or call.prompt
  return new_session(o, parent, text, "text", prompt.describe(text))
end

-- Ends the session with err: the sandbox is torn down, and every later
-- call returns the same err.
function Session:_fail(err)
  if self.closed and not self.failed and err.kind ~= "cancelled" then
    return self:_cancelled()
  end
  err.history = self.conversation.history
  self.failed = self.failed or err
  self.nested:end_all()
  self.sandbox:teardown()
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

-- The budgets before a root turn or a sub-call (rlm.engine.budgets): true,
-- or the session ends.
function Session:_check_budget()
  local err = self.tree:check()
  if self.closed then
    return self:_cancelled()
  end
  if err then
    return self:_fail(err)
  end
  return true
end

-- A callback's usage, added to the tree's tokens: true, or the session
-- ends (a usage of another shape).
function Session:_add_usage(who, usage)
  if usage == nil then
    return true
  end
  local err = self.tree:add_usage(who, usage)
  if err then
    return self:_fail(err)
  end
  return true
end

-- Checks what a model callback gave back: text, and optionally a usage
-- table. Then the deadline, which a callback that blocked may have passed.
function Session:_model_result(who, reply)
  if reply.failed then
    return self:_error("callback_error", who .. " raised: " .. tostring(reply.message))
  end
  if type(reply.text) ~= "string" then
    return self:_error("callback_error", who .. " returned " .. type(reply.text) .. ", not a string")
  end
  local ok, err = self:_add_usage(who, reply.usage)
  if not ok then
    return nil, err
  end
  ok, err = self.sandbox:deadline_check()
  if not ok then
    return nil, err
  end
  return reply.text, reply.usage
end

-- Gives on_event (if any) ev, an event of rlm.base.events' (else it raises:
-- a programming error).
function Session:_emit(ev)
  local cb = self.opts.on_event
  if not cb then
    return true
  end
  local j = self.root.journal
  if j and j.tape and j:replaying(self.root.conversation.iterations) then
    return true -- a resume runs a recorded step again: its events were given once
  end
  ev.depth = ev.depth or self.depth
  ev.session = self.session_id
  local ok, e = util.call_protected(cb, events.check(ev))
  if self.closed then
    return self:_cancelled()
  end
  if not ok then
    return self:_error("callback_error", "on_event raised: " .. tostring(e))
  end
  return true
end

-- The pump ------------------------------------------------------------------

-- The run's end, as the engine's resume gave it (rlm.engine.loop): it
-- ended with ev, or raised (whatever the driver sent must not raise out of
-- run(), step(), poll() or an adapter: the session ends with an err).
local function ended(self, how, v)
  if how == "raised" then
    if self.closed then
      -- Closed from a callback the engine was inside: that is the end.
      self:_cancelled()
    else
      self:_fail(errors.new("protocol_error", "rlm: internal error while handling the driver's input: " .. v))
    end
    self.terminal = { type = "error", err = self.failed }
    return
  end
  if v.type == "error" then
    self:_fail(v.err)
    v.err = self.failed
  end
  self.terminal = v
end

--- What the session needs from the outside now, or nil when it must wait
-- (for fd() to be readable or timeout() ms). Never blocks, except for the
-- spawn of the sandbox at the first call.
function Session:poll()
  if self.sandbox.refill and self.stepped and not self.parent and not self.nested:running() then
    self.sandbox:refill_pool(false)
  end
  local j = self.journal
  if j then
    j.renewal:tick(j) -- the lease's renewal, when due (rlm.engine.renewal); a lost lease fails the session
  end
  if not self.terminal and (self.failed or self.closed) then
    if not self.failed then
      self:_cancelled()
    end
    self.terminal = { type = "error", err = self.failed }
  end
  if self.terminal then
    self.scheduler:drop_all()
    return self.terminal
  end
  local scheduler = self.scheduler
  local ev = scheduler.outbox[1] and scheduler:next_out()
  if not ev then
    self.pumped_at = core.now_ms() -- rlm.sandbox.probe: this session is driven
    local how, v = self.engine:resume()
    if how then
      ended(self, how, v)
    end
    ev = scheduler.outbox[1] and scheduler:next_out() or self.terminal
  end
  if ev and (ev.type == "step" or ev.type == "done" or ev.type == "error") then
    self.stepped = true
  end
  return ev
end

-- The answer to a request poll() handed out: reply(id, text[, usage]), or
-- reply(id, nil, message) when the call failed.
-- A reply to a request that is no longer wanted (the run ended, the
-- session was closed, the exec it belonged to is over, or it was answered
-- already) is dropped: returns false. One poll() never handed out raises.
function Session:reply(id, text, usage)
  local taken = self.scheduler:reply(id, text, usage)
  if taken == nil then
    error(("rlm: reply to unknown request %s"):format(tostring(id)), 2)
  end
  return taken
end

-- A descriptor that is readable when the session has work to do; nil while
-- no sandbox runs (the engine's set).
function Session:fd()
  return self.engine:fd()
end

-- How often to look while another session of this Lua state probes the
-- interpreter: there is no descriptor to wait on then.
local PROBE_WAIT_MS = 5

-- How often to look while a pooled sandbox's large context is written off
-- the host's thread (rlm.boot): there is no descriptor to wait on then.
local CONTEXT_WAIT_MS = 1

-- Milliseconds until the session must be polled even if fd() stays quiet:
-- -1 for no timer, 0 to poll now.
function Session:timeout()
  local scheduler = self.scheduler
  -- The first call's reply waits while the sandbox starts (rlm.engine.opening):
  -- no reason to poll at once.
  if scheduler.outbox[1] or (scheduler.inbox[1] and not self.starting) or self.terminal or not self.engine.thread then
    return 0
  end
  local sandbox = self.sandbox
  if sandbox.context_writing then
    return CONTEXT_WAIT_MS
  end
  local d = sandbox.driver or sandbox.helper
  local ms = self.clock:soft_timeout(d and d:timeout() or PROBE_WAIT_MS)
  if self.journal then
    ms = self.journal.renewal:timeout(self.journal, ms) -- the lease's renewal on a timer (rlm.engine.renewal)
  end
  if self.nested.children[1] then
    ms = self.nested:timeout(ms)
  end
  return ms
end

-- The class (rlm adds its public API to it) and the constructor, which is
-- not a method: rlm.Session holds only what docs/api.md documents.
return { Session = Session, new_session = new_session }
