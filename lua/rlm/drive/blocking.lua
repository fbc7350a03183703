-- run() and step(): the engine driven from the calling thread. A loop over
-- rlm.dispatch that calls each callback at once (a yield passes through to
-- whoever resumed run()) and, while the session waits, sleeps on its fd()
-- until timeout(), as cqueues' loop is a Lua loop over step.
local core = require("rlm.core")
local dispatch = require("rlm.drive.dispatch")
local errors = require("rlm.base.errors")
local util = require("rlm.base.util")

local M = {}

-- Each callback at once, its yields passed through to whoever resumed
-- run(): rlm.util.invoke, the path every host takes.
local function call_now(fn, arg, settle)
  util.invoke(fn, arg, settle, true)
end

-- The engine's own turn of this loop (rlm.engine.loop's _idle): the
-- requests it handed out, answered at once.
local function answer_inline(s)
  return dispatch.answer_out(s, call_now)
end

-- Drives s until an event of type `stop` or the end of the run.
local function drive(s, who, stop)
  dispatch.claim(s, who)
  s.inline = answer_inline
  -- The hook as the run starts: one set later is an interrupt's (Ctrl-C),
  -- which the session's waits end for (rlm.engine's _interrupted). It arms
  -- rlm.core's SIGINT handler until the run ends (or the token is
  -- collected: a run that yielded and was never resumed).
  s.hook_token = core.hook_state()
  -- No pcall here: callbacks may yield through run() on PUC Lua 5.1 too.
  -- Nothing in the loop raises (poll() and util.invoke catch).
  while true do
    local ev = dispatch.next(s, call_now, stop)
    if ev then
      local token = s.hook_token
      s.inline, s.hook_token = nil, nil
      dispatch.release(s)
      core.hook_release(token)
      if not s.sigint and core.interrupted(token) then
        s:_interrupted() -- after a callback that took the interrupt as its error (LuaJIT)
      end
      if s.sigint then
        -- Closed by a SIGINT (rlm.engine's _interrupted): the interpreter's
        -- "interrupted!" is raised from here, the sandbox gone already; or
        -- ours, when its hook has been and gone.
        s.sigint = nil
        if not core.reraise_interrupt() then
          error("interrupted!")
        end
      end
      return ev
    end
    local ms = s:timeout()
    if ms ~= 0 then
      s:_block(ms)
    end
  end
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
