-- A turn's code runs: one block at a time in the sandbox, the driver's
-- calls answered meanwhile (sub-calls, tools, nested sessions), and a
-- block that runs past step_timeout_ms interrupted. Methods of the
-- conversation (rlm.engine.conversation); the exec's id and its interrupt
-- are the conversation's fields, which the scheduler reads to drop a late
-- reply.
local textlib = require("rlm.base.text")

local M = {}

-- Conversation methods (rlm.engine.conversation).
M.methods = {}
local C = M.methods

local EXEC_REPLIES = { exec_result = true, llm_query = true, llm_batch = true, rlm_query = true,
  rlm_batch = true, tool_call = true, fatal = true }

-- Runs one block of code; answers the driver's calls back meanwhile.
-- prose: the text of a prose FINAL line, which the driver runs (as code)
-- only when it is code (docs/prompt.md); else its result is `literal`.
function C:exec(code, prose)
  local s = self.session
  local id = self:next_id()
  self.interrupted = nil
  s.scheduler:exec_started()
  local ok, err = s.sandbox:send({ type = "exec", id = id, code = code, prose = prose })
  if not ok then
    return nil, err
  end
  s.sandbox:remove_canaries() -- the start's, while the driver runs the code (rlm.engine.boot)
  while true do
    local kind, a, b, c = s.engine:wait(true)
    if kind == "reply" then
      ok, err = s.scheduler:answer(a)
    elseif kind == "soft" then
      ok, err = self:interrupt()
    elseif kind == "child" then
      ok, err = s.nested:done(a, b)
    else
      local msg
      msg, err = s.sandbox:message(EXEC_REPLIES, kind, a, b, c)
      if msg and msg.type == "exec_result" then
        return self:exec_done(msg, id)
      end
      ok = msg ~= nil
      if ok then
        ok, err = s.scheduler:query(msg)
      end
    end
    if not ok then
      return nil, err
    end
  end
end

function C:exec_done(msg, id)
  local s = self.session
  if msg.id ~= id then
    return s:_error("protocol_error", ("the driver answered exec %d while exec %d ran"):format(msg.id, id))
  end
  -- A hostile driver may end an exec with calls still out.
  s.scheduler:exec_ended()
  s.nested:end_all()
  if not s.nested:running() and s.sandbox.driver then
    s.clock:resume(s.sandbox.driver)
  end
  local limit = self.opts.stdout_truncate_chars
  msg.stdout = textlib.cut(msg.stdout, limit, false)
  msg.error = msg.error and textlib.cut(msg.error, limit, true) or nil
  if self.interrupted then
    msg.interrupted = true
    msg.error = (msg.error and msg.error .. "\n" or "") .. self:interrupt_note()
  end
  return msg
end

-- What the model is told after an interrupted block.
function C:interrupt_note()
  return ("[the step ran past step_timeout_ms (%.0f ms) and was interrupted: this block's changes were rolled "
    .. "back and the rest of the turn's blocks did not run; do less per step (smaller chunks, fewer calls)]")
    :format(self.opts.step_timeout_ms)
end

-- The step ran out of time: SIGINT to the driver (a KeyboardInterrupt in
-- the code), the call it waits on answered with `interrupted`, and any call
-- it makes from now on too; the sandbox dies at the hard deadline unless
-- the exec ends first.
function C:interrupt()
  local s = self.session
  self.interrupted = true
  s.scheduler:drop_held()
  s.nested:end_all()
  s.clock:interrupted(s.sandbox.driver)
  s.sandbox.driver:interrupt()
  local ok, err = s:_emit({ type = "interrupt", step = self.iterations,
    timeout_ms = self.opts.step_timeout_ms, grace_ms = self.opts.sandbox.interrupt_grace_ms })
  if not ok then
    return nil, err
  end
  local answer = s.scheduler:interrupt_open()
  if answer then
    return s.sandbox:send(answer)
  end
  return true
end

return M
