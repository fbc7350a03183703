-- run() and step(): the engine driven from the calling thread, a few
-- lines over the public poll() and reply() as cqueues' loop is over its
-- step: rlm.drive.dispatch polls and calls each callback at once (a yield
-- passes through to whoever resumed run()), and while the session waits
-- the loop sleeps on its fd() until timeout(). The engine does not know it
-- is driven this way.
local core = require("rlm.core")
local dispatch = require("rlm.drive.dispatch")
local errors = require("rlm.base.errors")
local util = require("rlm.base.util")

local M = {}

-- Drives s until an event of type `stop` or the end of the run: the loop,
-- run in a coroutine of its own (below).
local function loop(s, stop)
  -- The hook as the run starts: one set later is an interrupt's (Ctrl-C),
  -- which the waits end for. It arms rlm.core's SIGINT handler until the
  -- run ends (or the token is collected: a run that yielded and was never
  -- resumed).
  local token, sigint = core.hook_state(), false
  -- A SIGINT asked the Lua state to stop (rlm.core's interruptible waits:
  -- the standalone interpreter's handler). The session ends as cancelled,
  -- its sandbox goes now, and the interpreter gets its interrupt back as
  -- run() or step() returns.
  local function interrupted()
    if not sigint then
      sigint = true
      s:_fail(errors.new("cancelled", "interrupted (SIGINT) before the run ended"))
      s:close()
    end
  end
  -- Each callback at once (rlm.util.invoke, the path every host takes).
  -- One that took the interrupt as its error (the interpreter's hook
  -- raised inside it) ends the run before the engine reads its answer.
  local function call_now(fn, arg, settle)
    util.invoke(fn, arg, settle, true)
    if not sigint and core.interrupted(token) then
      interrupted()
    end
  end
  -- No pcall here: callbacks may yield through run() on PUC Lua 5.1 too.
  -- Nothing in the loop raises (poll() and util.invoke catch).
  while true do
    local ev = dispatch.next(s, call_now, stop)
    if ev then
      dispatch.release(s)
      core.hook_release(token)
      if not sigint and core.interrupted(token) then
        interrupted() -- after a callback that took the interrupt as its error (LuaJIT)
      end
      if sigint then
        -- Closed by a SIGINT: the interpreter's "interrupted!" is raised
        -- from here, the sandbox gone already; or ours, when its hook has
        -- been and gone.
        if not core.reraise_interrupt() then
          error("interrupted!")
        end
      end
      return ev
    end
    local ms = s:timeout()
    if ms ~= 0 and s.engine:block(ms, token) == "interrupted" then
      interrupted()
    end
  end
end

-- A callback's yield inside it (on_event, cost.usd, ...) goes on out.
local pass_through = util.pass_through

local function resumed(co, ok, first, ...)
  if not ok then
    error(first, 0) -- "interrupted!", raised out of run() or step()
  end
  if coroutine.status(co) == "dead" then
    return first
  end
  return resumed(co, coroutine.resume(co, pass_through(first, ...)))
end

-- The loop runs in a coroutine, as the engine does: the standalone
-- interpreters' SIGINT hook is set on the main thread, and a callback that
-- returns after one must not meet it at the loop's next instruction with
-- the session still open. The loop takes the hook off (core.interrupted)
-- and puts it back once the session is closed.
local function drive(s, who, stop)
  dispatch.claim(s, who)
  local co = coroutine.create(loop)
  return resumed(co, coroutine.resume(co, s, stop))
end

-- One root turn: ask the root model, run the code it wrote, show it the
-- output. Returns the history entry, or nil, err.
function M:step()
  if self.failed then
    return nil, self.failed
  end
  -- The turns are spent: the step that follows the last one runs the end
  -- run() would (the last-chance call, the fallback answer); later ones, or
  -- a step past a final answer, get max_iterations.
  local conv = self.conversation
  if conv:turns_spent() and not self.closed and (conv.turns_over or conv.final) then
    return nil, errors.new("max_iterations", ("max_iterations (%d) root turns are spent")
      :format(self.opts.max_iterations), { history = conv.history })
  end
  if conv.final then
    conv:go_on() -- after the final answer, more steps go on
  end
  if self.terminal and self.terminal.type == "done" then
    self.terminal = nil
  end
  local ev = drive(self, "step()", "step")
  if ev.type == "step" then
    return ev.entry
  elseif ev.type == "done" then
    local result = ev.result
    if result.kind == "fallback" then
      -- No root turn gave this answer: the entry is the fallback call's.
      return { response = result.answer, code = "", stdout = "", blocks = {},
        final = { kind = "fallback", answer = result.answer, value = result.value, partial = true,
          reason = result.reason } }
    end
    return conv.history[#conv.history]
  end
  return nil, ev.err
end

-- Runs root turns until the code gives a final answer. Returns the result
-- table, or nil, err.
function M:run()
  local ev = drive(self, "run()", nil)
  if ev.type == "done" then
    return ev.result
  end
  return nil, ev.err
end

return M
