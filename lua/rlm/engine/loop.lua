-- The engine: a coroutine per session that hands out requests through
-- poll() and takes answers through reply(); fd() and timeout() say when to
-- poll again.
local core = require("rlm.core")
local errors = require("rlm.base.errors")
local util = require("rlm.base.util")

local M = {}

-- What the engine yields when it has nothing to do until the driver or a
-- reply wakes it; any other yield comes from a user callback.
local IDLE = {}
M.IDLE = IDLE

-- A yield from a user callback that runs inside the engine (on_event,
-- cost_usd): passed on to whoever resumed us when that is a coroutine that
-- may yield; otherwise the callback gets util.NO_YIELD back, and fails.
local function pass_through(...)
  if not util.can_yield() then
    return util.NO_YIELD
  end
  return coroutine.yield(...)
end

-- What one resume of the engine gave: it raised, ended, waits (IDLE), or
-- a user callback inside it yielded (passed on, and the engine resumed
-- with the answer). Varargs, not a table per resume.
local function resumed(self, ok, first, ...)
  if not ok then
    -- The engine raised. Whatever the driver sent must not raise out of
    -- run(), step(), poll() or an adapter: the session ends with an err.
    local trace = debug.traceback(self.engine, tostring(first))
    self.engine = nil
    if self.closed then
      -- Closed from a callback the engine was inside: that is the end.
      self:_cancelled()
      self.terminal = { type = "error", err = self.failed }
      return
    end
    self:_fail(errors.new("protocol_error", "rlm: internal error while handling the driver's input: "
      .. trace))
    self.terminal = { type = "error", err = self.failed }
    return
  end
  if coroutine.status(self.engine) == "dead" then
    self.engine = nil
    local ev = first
    if ev.type == "error" then
      self:_fail(ev.err)
      ev.err = self.failed
    end
    self.terminal = ev
    return
  end
  if first == IDLE then
    return
  end
  return resumed(self, coroutine.resume(self.engine, pass_through(first, ...)))
end

-- The next thing the engine must handle: "reply", reply (when
-- accept_replies), "soft", kind (a soft deadline passed: the clock),
-- "child", child, ev (a nested session ended) or a driver event (kind,
-- ...: the sandbox's take). It never waits in C: with nothing to do it
-- yields IDLE until poll() is called again (or, under run() and step(),
-- waits: _idle).
function M:_wait(accept_replies)
  -- The hot loop of every sub-call: the collaborators' state is read here
  -- (changed only through their methods), a method call per look costs
  -- PUC Lua more than the look (bench/llm_query.lua).
  local sandbox, scheduler, children = self.sandbox, self.scheduler, self.nested.children
  local kind, a, b, c
  if sandbox.pre_events then
    kind, a, b, c = sandbox:pre_event()
    if kind then
      return kind, a, b, c
    end
  end
  while true do
    if accept_replies and scheduler.inbox[1] then
      return "reply", scheduler:take_reply()
    end
    local due = self.clock:soft_due()
    if due then
      return "soft", due
    end
    if not sandbox.driver then
      return "closed"
    end
    if children[1] then
      local child, ev = self.nested:pump()
      if child then
        return "child", child, ev
      end
    end
    kind, a, b, c = sandbox:take(self.inline, scheduler.outbox[1] ~= nil)
    if kind then
      return kind, a, b, c
    end
    kind, a, b, c = self:_idle()
    if kind then
      return kind, a, b, c
    end
  end
end

-- The engine has nothing to do until the driver or a reply wakes it: it
-- yields IDLE to whoever drives it. Under run() and step() (rlm.blocking
-- sets self.inline) it does that driver's work itself, without the yield
-- and the resume per llm_query: it answers the requests it just handed out
-- (rlm.dispatch.answer_out, as the loop would once poll() gave them) and
-- waits on fd() as the loop would. Whatever else the loop would see (the
-- session closed or failed from a callback, a wait of 0 ms: a child or a
-- deadline to look at) goes back to it through the yield. While the
-- driver is all the session watches, the wait is the driver's own poll,
-- and the event it wakes for comes back from here.
function M:_idle()
  local inline = self.inline
  if inline and not self.closed and not self.failed then
    if self.scheduler.outbox[1] then
      inline(self)
      -- A SIGINT while a callback blocked (in a coroutine the main thread's
      -- hook does not reach) is taken now: the engine may next give the
      -- loop a wait of 0 ms (the sandbox's start has lines waiting, the
      -- run's first call being out while it starts), where the hook would
      -- raise with the session still open.
      if core.interrupted(self.hook_token) then
        self:_interrupted()
      end
      return
    end
    local ms = self:timeout()
    if ms ~= 0 then
      local sandbox = self.sandbox
      local d = sandbox.driver
      if d and not sandbox.helper and not self.nested.children[1] then -- _driver_alone(), in place
        local kind, a, b, c = d:poll(ms, sandbox.max_values, false, self.hook_token)
        self.pumped_at = core.now_ms()
        if kind ~= "interrupted" then
          return kind, a, b, c
        end
        self:_interrupted()
      else
        self:_block(ms)
        self.pumped_at = core.now_ms()
        return
      end
    end
  end
  coroutine.yield(IDLE)
end

-- A SIGINT asked the Lua state to stop during a wait of run() or step()
-- (rlm.core's interruptible waits: the standalone interpreter's handler).
-- The session ends as cancelled, its sandbox goes now, and rlm.blocking
-- gives the interpreter its interrupt back as run() or step() returns.
function M:_interrupted()
  self.sigint = true -- for rlm.blocking, which raises it
  self:_fail(errors.new("cancelled", "interrupted (SIGINT) before the run ended"))
  self:close()
end

-- Resumes the engine until it has something for the outside or waits.
function M:_pump()
  self.pumped_at = core.now_ms() -- sandbox.probe: this session is driven
  if not self.engine then
    self.engine = coroutine.create(function()
      return self.conversation:main()
    end)
  end
  return resumed(self, coroutine.resume(self.engine))
end

--- The pump: what the session needs from the outside now, or nil when it
-- must wait (for fd() to be readable or timeout() ms). Never blocks, except
-- for the spawn of the sandbox at the first call.
function M:poll()
  if self.sandbox.refill and self.stepped and not self.parent and not self.nested:running() then
    self.sandbox:refill_pool(false)
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
  local ev = self.scheduler:next_out()
  if not ev then
    self:_pump()
    ev = self.scheduler:next_out() or self.terminal
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
function M:reply(id, text, usage)
  local taken = self.scheduler:reply(id, text, usage)
  if taken == nil then
    error(("rlm: reply to unknown request %s"):format(tostring(id)), 2)
  end
  return taken
end

-- A descriptor that is readable when the session has work to do; nil while
-- no sandbox runs.
function M:fd()
  if self.closed then
    return self.waitset and self.waitset:fd() or nil
  end
  return self:_waitset():fd()
end

-- The set behind fd(), made on first use with the processes running then.
function M:_waitset()
  if not self.waitset then
    self.waitset = assert(core.waitset())
    for _, d in ipairs({ self.sandbox.driver or false, self.sandbox.helper or false }) do
      if d then
        assert(self.waitset:add(d:fd()))
      end
    end
  end
  return self.waitset
end

-- Waits, on the calling thread (rlm.blocking), until the session has work,
-- ms pass (-1: no limit) or a SIGINT asks to stop (M:_interrupted). While
-- its driver is all it watches (no probe, no nested session), in the
-- driver's own loop, which reads the line as it wakes: one system call, not
-- the set's and then the loop's.
function M:_block(ms)
  local d = self:_driver_alone()
  local woke
  if d then
    woke = d:wait(ms, self.hook_token)
  else
    woke = self:_waitset():wait(ms, self.hook_token)
  end
  if woke == "interrupted" then
    self:_interrupted()
  end
end

-- The driver, when it is all the session watches (no probe, no nested
-- session, not closed): its own loop is then the session's wait.
function M:_driver_alone()
  local d = self.sandbox.driver
  return d and not self.sandbox.helper and not self.nested.children[1] and not self.closed and d or nil
end

-- Puts a process's descriptor into the set behind fd() (the root's, for a
-- nested session). Closing it takes it out again.
function M:_watch(d)
  if self.parent then
    return self.parent:_watch(d)
  end
  if self.waitset then
    assert(self.waitset:add(d:fd()))
  end
end

-- The driver d is no longer the session's (a pooled sandbox skipped at
-- its take, rlm.engine.boot).
function M:_unwatch(d)
  if self.parent then
    return self.parent:_unwatch(d)
  end
  if self.waitset then
    self.waitset:remove(d:fd())
  end
end

-- The set behind fd() goes, once no loop watches it (rlm.dispatch).
function M:_close_waitset()
  if self.waitset then
    self.waitset:close()
    self.waitset = nil
  end
end

-- How often to look while another session of this Lua state probes the
-- interpreter: there is no descriptor to wait on then.
local PROBE_WAIT_MS = 5

-- How often to look while a pooled sandbox's large context is written off
-- the host's thread (rlm.boot): there is no descriptor to wait on then.
local CONTEXT_WAIT_MS = 1

-- Milliseconds until the session must be polled even if fd() stays quiet:
-- -1 for no timer, 0 to poll now.
function M:timeout()
  local scheduler = self.scheduler
  -- The first call's reply waits while the sandbox starts (rlm.engine.opening):
  -- no reason to poll at once.
  if scheduler.outbox[1] or (scheduler.inbox[1] and not self.starting) or self.terminal or not self.engine then
    return 0
  end
  local sandbox = self.sandbox
  if sandbox.context_writing then
    return CONTEXT_WAIT_MS
  end
  local d = sandbox.driver or sandbox.helper
  local ms = self.clock:soft_timeout(d and d:timeout() or PROBE_WAIT_MS)
  if self.nested.children[1] then
    ms = self.nested:timeout(ms)
  end
  return ms
end

return M
