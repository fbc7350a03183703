-- A session's engine, its collaborator (rlm.engine.session creates it):
-- the coroutine that runs the session's turns (the conversation's main, rlm.engine.turn),
-- the wait inside it for the next thing to handle, and the set of
-- descriptors behind fd(). It never waits in C and never calls a model:
-- with nothing to do it yields IDLE, and whoever polls the session (run(),
-- step(), an adapter's loop) answers the requests poll() hands out and
-- waits on fd() until timeout(). How it is driven is none of its business.
local core = require("rlm.core")
local util = require("rlm.base.util")

---@class Engine
---@field session Session the session it runs
---@field thread thread|nil the coroutine, from the first poll() to the run's end
---@field waitset userdata|nil the set behind fd(), made on first use
local Engine = {}
Engine.__index = Engine

local M = {}

-- What the engine yields when it has nothing to do until the driver or a
-- reply wakes it; any other yield comes from a user callback.
local IDLE = {}
M.IDLE = IDLE

function M.new(session)
  return setmetatable({ session = session }, Engine)
end

-- A callback's yield inside it (on_event, cost.usd, ...) goes on out.
local pass_through = util.pass_through

-- What one resume gave: nothing (the engine waits: IDLE), "ended", ev (its
-- body returned ev), or "raised", traceback. A user callback's yield inside
-- it is passed on, and the engine resumed with the answer. Varargs, not a
-- table per resume.
local function resumed(self, ok, first, ...)
  if not ok then
    local trace = debug.traceback(self.thread, tostring(first))
    self.thread = nil
    return "raised", trace
  end
  if coroutine.status(self.thread) == "dead" then
    self.thread = nil
    return "ended", first
  end
  if first == IDLE then
    return nil
  end
  return resumed(self, coroutine.resume(self.thread, pass_through(first, ...)))
end

-- Runs the engine until it waits or ends (the session's poll() reads how).
function Engine:resume()
  if not self.thread then
    local s = self.session
    self.thread = coroutine.create(function()
      return s.conversation:main()
    end)
  end
  return resumed(self, coroutine.resume(self.thread))
end

-- The next thing the engine must handle: "reply", reply (when
-- accept_replies), "soft", kind (a soft deadline passed: the clock),
-- "child", child, ev (a nested session ended) or a driver event (kind,
-- ...: the sandbox's take). With nothing to do it yields IDLE, until the
-- session is polled again.
function Engine:wait(accept_replies)
  -- The hot loop of every sub-call: the collaborators' state is read here
  -- (changed only through their methods), a method call per look costs
  -- PUC Lua more than the look (bench/llm_query.lua).
  local s = self.session
  local sandbox, scheduler, clock, nested = s.sandbox, s.scheduler, s.clock, s.nested
  local children = nested.children
  local kind, a, b, c
  if sandbox.pre_events then
    kind, a, b, c = sandbox:pre_event()
    if kind then
      return kind, a, b, c
    end
  end
  while true do
    if accept_replies and scheduler.inbox[1] then
      local r = scheduler:take_reply()
      local j = s.root.journal
      if j and not j:took(r) then
        return "closed" -- the session ended with the journal's error
      end
      return "reply", r
    end
    local due = clock:soft_due()
    if due then
      return "soft", due
    end
    if not sandbox.driver then
      return "closed"
    end
    if children[1] then
      local child, ev = nested:pump()
      if child then
        return "child", child, ev
      end
    end
    kind, a, b, c = sandbox:take(scheduler.outbox[1] ~= nil)
    if kind then
      return kind, a, b, c
    end
    coroutine.yield(IDLE)
  end
end

-- The descriptors ---------------------------------------------------------

-- A descriptor that is readable when the session has work to do.
function Engine:fd()
  if self.session.closed then
    return self.waitset and self.waitset:fd() or nil
  end
  return self:watched():fd()
end

-- The set behind fd(), made on first use with the processes running then.
function Engine:watched()
  if not self.waitset then
    local sandbox = self.session.sandbox
    self.waitset = assert(core.waitset())
    for _, d in ipairs({ sandbox.driver or false, sandbox.helper or false }) do
      if d then
        assert(self.waitset:add(d:fd()))
      end
    end
  end
  return self.waitset
end

-- Waits on the calling thread (rlm.drive.blocking) until the session has
-- work or ms pass (-1: no limit); "interrupted" when a SIGINT asked to stop
-- meanwhile (token: core.hook_state()'s). While its driver is all it
-- watches (no probe, no nested session, not closed), in the driver's own
-- loop, which reads the line as it wakes: one system call, not the set's
-- and then the loop's.
function Engine:block(ms, token)
  local s = self.session
  local sandbox = s.sandbox
  local d = sandbox.driver
  if d and not sandbox.helper and not s.nested.children[1] and not s.closed then
    return d:wait(ms, token)
  end
  return self:watched():wait(ms, token)
end

-- Puts a process's descriptor into the set behind fd() (the root's, for a
-- nested session). Closing it takes it out again.
function Engine:watch(d)
  local parent = self.session.parent
  if parent then
    return parent.engine:watch(d)
  end
  if self.waitset then
    assert(self.waitset:add(d:fd()))
  end
end

-- The driver d is no longer the session's (a pooled sandbox skipped at
-- its take, rlm.engine.boot).
function Engine:unwatch(d)
  local parent = self.session.parent
  if parent then
    return parent.engine:unwatch(d)
  end
  if self.waitset then
    self.waitset:remove(d:fd())
  end
end

-- The set behind fd() goes, once no loop watches it (rlm.drive.dispatch).
function Engine:close_waitset()
  if self.waitset then
    self.waitset:close()
    self.waitset = nil
  end
end

return M
