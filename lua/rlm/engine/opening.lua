-- A run's opening: the session_start event, the sandbox's start
-- (rlm.engine.boot) and the root model's first call, which goes out while
-- the sandbox boots and self-tests (issue 30). Its reply waits in the inbox
-- until the start's last check has passed: only the first turn
-- (rlm.engine.turn's turn) takes it, so no model-written code reaches a
-- sandbox that is not proven, and a start that fails drops it. Methods of
-- the Session.
local M = {}

-- Starts the sandbox of a run's first turn, the root model asked
-- meanwhile. true, or nil, err (the session has failed with it).
function M:_open()
  local ok, err = self:_emit({ type = "session_start", query = self.opts.query })
  if not ok then
    return nil, err
  end
  self.starting = true
  -- Under an adapter or a loop over poll() the call goes out now: its
  -- callback runs while the engine reads the start's lines as they come.
  -- Under run() and step() the callback holds the host's thread: it goes
  -- out once the sandbox is spawned (the Handle's checks ask for it), so
  -- that the sandbox boots while it blocks.
  if not self.inline then
    ok, err = self:_ask_first()
  end
  if ok then
    ok, err = self.sandbox:boot()
  end
  self.starting = nil
  self.conversation:first_waits() -- counted again by the turn that takes the call
  if ok then
    local info = self.sandbox.info
    ok, err = self:_emit({ type = "sandbox_ready", start = self.sandbox.start, backend = info.backend,
      mode = info.mode, detail = info.detail, not_promised = info.not_promised, container = info.container })
  end
  if not ok then
    self:_drop_first()
    return nil, err
  end
  return true
end

-- The root model's first call goes out, once, while the sandbox starts:
-- the budgets are checked and its step begins (step_start) as a turn's
-- would. true, or nil, err.
function M:_ask_first()
  if self.conversation.first_call or not self.starting then
    return true
  end
  local ok, err = self:_check_budget()
  if not ok then
    return nil, err
  end
  ok, err = self:_emit({ type = "step_start", step = self.conversation.iterations + 1 })
  if not ok then
    return nil, err
  end
  -- The conversation itself, as every root call gets it (rlm.engine.turn).
  self.conversation:first_out(self.scheduler:request({ type = "root_llm", messages = self.conversation.messages,
    depth = self.depth }))
  return true
end

-- The start failed with the first call out: its reply, if it came, is
-- dropped unread, and what it reported as usage counts all the same (the
-- tokens were paid). One that comes later is dropped as any late reply.
function M:_drop_first()
  local req = self.conversation:take_first()
  if not req then
    return
  end
  local r = self.scheduler:take_reply()
  if r and r.request == req and not r.failed then
    self.tree:add_usage("root_llm", r.usage) -- a usage of another shape is not counted
  end
end

-- A root call's callback held the host's thread for ms (rlm.drive.dispatch
-- times each one it starts): while the sandbox starts, its deadlines do not
-- count them. Its hello or its self-test's lines waited in the pipe
-- meanwhile, and the deadline, a timer of the driver's loop, would fire
-- before the loop read them.
function M:_host_held(ms)
  local drv = self.sandbox.driver
  if self.starting and drv and not self.closed then
    self.clock:held(drv, ms)
  end
end

return M
