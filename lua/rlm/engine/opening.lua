-- A run's opening: the session_start event, the root model's first call,
-- which goes out first, and the sandbox's start (rlm.engine.boot), which
-- boots and self-tests while that call is answered (issue 30). Its reply
-- waits in the inbox until the start's last check has passed: only the
-- first turn (rlm.engine.turn's turn) takes it, so no model-written code
-- reaches a sandbox that is not proven, and a start that fails drops it.
-- Functions of a session, s; what they keep is the session's (starting)
-- and its conversation's (first_call).
local reattach = require("rlm.engine.reattach")

local M = {}

-- The root model's first call goes out, while the sandbox starts: the
-- budgets are checked and its step begins (step_start) as a turn's would.
-- true, or nil, err.
local function ask_first(s)
  local ok, err = s:_check_budget()
  if not ok then
    return nil, err
  end
  ok, err = s:_emit({ type = "step_start", step = s.conversation.iterations + 1 })
  if not ok then
    return nil, err
  end
  -- The conversation itself, as every root call gets it (rlm.engine.turn);
  -- its step is the one its root_delta events name.
  s.conversation:first_out(s.scheduler:request({ type = "root_llm", messages = s.conversation.messages,
    depth = s.depth }))
  return true
end

-- The start failed with the first call out: not handed out yet, it is
-- not; its reply, if it came, is dropped unread, and what it reported as
-- usage counts all the same (the tokens were paid). One that comes later
-- is dropped as any late reply.
local function drop_first(s)
  local req = s.conversation:take_first()
  if not req then
    return
  end
  s.scheduler:forget(req.id)
  local r = s.scheduler:take_reply()
  if r and r.request == req and not r.failed then
    s.tree:add_usage("root_llm", r.usage) -- a usage of another shape is not counted
  end
end

-- Starts the sandbox of s's first turn, the root model asked meanwhile.
-- true, or nil, err (the session has failed with it). The call is handed
-- out at the engine's first wait: under run() and step() its callback
-- holds the host's thread, and by then the sandbox is spawned (or its
-- interpreter probed), so it boots meanwhile.
function M.open(s)
  local ok, err = s:_emit({ type = "session_start", query = s.opts.query,
    journal_id = s.journal and s.journal.id, resumed = s.journal and s.journal.resumed })
  if not ok then
    return nil, err
  end
  s.starting = true
  ok, err = ask_first(s)
  if ok then
    ok, err = s.sandbox:boot()
  end
  if ok then
    ok, err = reattach.started(s) -- the head says where a lingering sandbox is
  end
  s.starting = nil
  s.conversation:first_waits() -- counted again by the turn that takes the call
  if ok then
    local info = s.sandbox.info
    ok, err = s:_emit({ type = "sandbox_ready", start = s.sandbox.start, backend = info.backend,
      mode = info.mode, detail = info.detail, not_promised = info.not_promised, container = info.container })
  end
  if not ok then
    drop_first(s)
    return nil, err
  end
  return true
end

-- A root call's callback held the host's thread for ms (rlm.drive.dispatch
-- times each one it starts): while the sandbox starts, its deadlines do not
-- count them. Its hello or its self-test's lines waited in the pipe
-- meanwhile, and the deadline, a timer of the driver's loop, would fire
-- before the loop read them.
function M.host_held(s, ms)
  local drv = s.sandbox.driver
  if s.starting and drv and not s.closed then
    s.clock:held(drv, ms)
  end
end

return M
