-- A session: a small object that holds its collaborators, each made here
-- with its own fields and a few named methods (docs/architecture.md, "Who
-- owns what"): its sandbox (rlm.engine.handle), its sub-call scheduler
-- (rlm.engine.subcalls), its nested sessions (rlm.engine.nested), the
-- tree's budgets (rlm.engine.budgets, shared with its nested sessions) and
-- its deadlines (rlm.engine.clock). What stays the session's own is the
-- conversation and its turns (rlm.engine.turn, finals, answer, compact:
-- methods of this class) and the engine's coroutine, which drives them all
-- (rlm.engine.loop); and here, how it fails and what it reports. The
-- collaborators ask the session for those through its methods. rlm
-- (init.lua) adds the public API and run()/step() (rlm.drive.blocking).
local budgets = require("rlm.engine.budgets")
local clock = require("rlm.engine.clock")
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
---@field sandbox Handle its sandbox: the start, the wire to the driver (rlm.engine.handle, boot)
---@field scheduler Scheduler its sub-calls: requests out, replies in (rlm.engine.subcalls)
---@field nested Nested its nested sessions (rlm.engine.nested)
---@field tree Budgets the budgets it shares with its nested sessions (rlm.engine.budgets)
---@field clock Clock its deadlines (rlm.engine.clock)
-- Who it is
---@field opts table the checked options (rlm.engine.options)
---@field parent Session|nil the session whose code started it (rlm_query)
---@field depth integer 0 for the root
---@field session_id string "1", "1.2", ...: names it in its events
---@field system_problem string|nil why its system_prompt function failed (a nested session ends with it)
-- The engine's coroutine (rlm.engine.loop) and who drives it
---@field engine thread|nil the coroutine that runs the session
---@field waitset userdata|nil the set behind fd()
---@field pumped_at number|nil when the engine last ran (others wait for its probe meanwhile)
---@field stepped boolean|nil its first step is out
---@field inline function|nil under run()/step(): answers the requests handed out at once (rlm.drive.blocking)
---@field hook_token userdata|nil under run()/step(): the hook as it started; SIGINT armed (rlm.drive.blocking)
---@field sigint boolean|nil closed by a SIGINT: run()/step() raise "interrupted!" (rlm.drive.blocking)
-- The conversation and its turns (rlm.engine.turn, finals, answer; rlm's ask)
---@field messages table the root model's conversation
---@field history table the steps so far (err.history, result.history)
---@field iterations integer turns taken
---@field next_exec_id integer
---@field interrupted boolean|nil the current exec ran out of time
---@field final table|nil the answer, once given
---@field terminal table|nil the run's end: { type = "done" | "error", ... }
---@field failed table|nil the error it ended with; every later call returns it
---@field closed boolean|nil close() was called
---@field turns_over boolean|nil max_iterations is spent
---@field more_turns boolean|nil step() after the answer goes on (ask)
---@field asked table|nil the earlier questions and answers of ask()
---@field question string|nil the current follow-up question
---@field history_mark integer|nil where the current question's steps begin
---@field turn_base integer|nil the turns taken before the current question
---@field trim_token userdata|nil on Lua 5.1 and LuaJIT: the allocator's trim after its collection (rlm/init.lua)
-- Compaction (option compact: rlm.engine.compact)
---@field compaction table|nil the current question's: { head = its first user message, turns = compacted }
---@field compactions integer|nil compactions run over the session's life
---@field root_sent table|nil the last root call's size: { bytes =, tokens = (its usage's input) }
-- The run's opening (rlm.engine.opening)
---@field starting boolean|nil the sandbox starts: replies wait, callbacks' time is the start's
---@field first_call table|nil the root call that went out while the sandbox started, till a turn takes it
local Session = {}
Session.__index = Session

-- A session over context_data (text, or a JSON document); parent is the
-- session whose code started it with rlm_query, or nil.
local function new_session(o, parent, context_data, context_format, description)
  local self = setmetatable({
    opts = o,
    parent = parent,
    depth = parent and parent.depth + 1 or 0,
    tree = parent and parent.tree or budgets.new(o), -- one budget for the tree
    history = {},
    iterations = 0,
    next_exec_id = 0,
  }, Session)
  -- Names the session in its events: "1" for the root, "1.2" for the second
  -- session its code started, and so on.
  self.session_id = parent and parent.nested:next_id() or "1"
  local tree = self.tree
  self.sandbox = handle.new(self, context_data, context_format)
  self.scheduler = subcalls.new(self)
  self.nested = nested.new(self)
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

-- The root of its tree (itself, when it is not nested).
function Session:_root()
  local s = self
  while s.parent do
    s = s.parent
  end
  return s
end

-- Ends the session with err: the sandbox is torn down, and every later
-- call returns the same err.
function Session:_fail(err)
  if self.closed and not self.failed and err.kind ~= "cancelled" then
    return self:_cancelled()
  end
  err.history = self.history
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

-- A callback that blocked may have passed the driver's deadline: its
-- keeper kills the sandbox then, and the session ends as the deadline says.
function Session:_deadline_check()
  local drv = self.sandbox.driver
  if drv and drv:deadline_passed() then
    drv:kill()
    return self:_timeout_error()
  end
  return true
end

-- The driver's deadline passed: which one it was.
function Session:_timeout_error()
  if self.clock.wall_cut then
    return self:_fail(self.tree:wall_error())
  end
  local booting = self.sandbox.booting
  if booting == "hello" then
    return self:_error("sandbox_unavailable", ("the driver did not say hello within sandbox.start_timeout_ms "
      .. "(%.0f ms); the sandbox was killed"):format(self.opts.sandbox.start_timeout_ms),
      { timeout_ms = self.opts.sandbox.start_timeout_ms })
  elseif booting then
    local ms = self.sandbox:boot_timeout_ms()
    return self:_error("sandbox_unavailable", ("the sandbox did not finish its self-test and load the "
      .. "context within %.0f ms; it was killed"):format(ms), { timeout_ms = ms })
  end
  return self:_error("step_timeout", ("the step ran past step_timeout_ms (%.0f ms) and did not stop within "
    .. "sandbox.interrupt_grace_ms (%.0f ms) of its interrupt; the sandbox was killed")
    :format(self.opts.step_timeout_ms, self.opts.sandbox.interrupt_grace_ms),
    { timeout_ms = self.opts.step_timeout_ms, grace_ms = self.opts.sandbox.interrupt_grace_ms })
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
  ok, err = self:_deadline_check()
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

for _, methods in ipairs({ require("rlm.engine.answer").methods,
  require("rlm.engine.finals").methods, require("rlm.engine.compact").methods }) do
  for k, fn in pairs(methods) do
    assert(Session[k] == nil, k)
    Session[k] = fn
  end
end

for _, name in ipairs({ "turn", "loop", "opening" }) do
  for k, fn in pairs(require("rlm.engine." .. name)) do
    if type(fn) == "function" then -- not loop's IDLE: a module's constants stay its own
      assert(Session[k] == nil, k)
      Session[k] = fn
    end
  end
end

-- The class (rlm adds its public API to it) and the constructor, which is
-- not a method: rlm.Session holds only what docs/api.md documents.
return { Session = Session, new_session = new_session }
