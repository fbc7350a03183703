-- A resume by re-attach (issue 41; docs/durability.md, "Resume"): a
-- journaled session on the exec backend with `sandbox.linger_ms` starts
-- its keeper lingering (start_spec), and its journal's head says where
-- that keeper is at each step boundary (record). rlm.Session.resume
-- reaches it again (attach) with the new owner's fence, which the keeper
-- then holds against the old one, and goes on in its REPL as it is: the
-- done steps are not run again, the conversation and the budgets come
-- from the journal, and the step in flight runs again on the host's side
-- only, against the keeper's lines replayed from the step's start. Its
-- recorded answers come from the journal; its driver lines the keeper
-- had taken (the attach's `taken`, past the head's `sent`) are not sent
-- again (rlm.engine.handle's skip_lines), so its code runs once, and
-- its output is what the keeper replays. Anything else replays in a
-- fresh sandbox (rlm.engine.journal). Functions of a session, s.
local linger = require("rlm.sandbox.linger")

local M = {}

-- The sandbox's start (rlm.engine.boot's cold start; spec: the backend's
-- prepare): with the exec backend and `sandbox.linger_ms`, the root's
-- keeper is asked to linger, named after the session and its owner's
-- fence, which it takes as its first.
function M.start_spec(s, spec)
  local j, sb = s.journal, s.opts.sandbox
  if not (j and j.lease and sb.backend == "exec" and sb.linger_ms) then
    return spec
  end
  local token = linger.token()
  if not token then
    return spec -- no random source: nothing to reach again, a resume replays
  end
  local fence = j.lease.fence
  return linger.start_spec(spec, { id = ("%s-%d"):format(j.id, fence), token = token, fence = fence })
end

-- The head's `sandbox` (rlm.journal.record's SUBFIELDS), read at a step
-- boundary: the lingering keeper, the lines taken from it and sent to the
-- driver (of which those a re-attach has yet to pass over count as not
-- sent), the last exec's id; nil when the sandbox does not linger.
function M.record(s)
  local sb = s.sandbox
  local drv = s.opts.sandbox.backend == "exec" and sb.driver
  local d = drv and drv.durable
  if not d then
    return nil
  end
  return { backend = "exec", id = d.id, token = d.token, fence = d.fence, seen = drv:received(),
    sent = drv:sent_lines() - (sb.skip_lines or 0), exec = s.conversation.next_exec_id }
end

-- The sandbox has started (rlm.engine.opening), fresh: a run at its first
-- step records it now, so that a host that dies in step 1 is resumed in
-- it. A replay's fresh sandbox is recorded at its first live step's end:
-- until then its REPL is behind the head. true, or nil, err.
function M.started(s)
  local j = s.journal
  if not (j and j.steps == 0 and not j.ended and s.sandbox.start ~= "attach" and M.record(s)) then
    return true
  end
  return j:write_head()
end

-- A re-attached step in flight sent fewer lines than the keeper had taken
-- of it: the REPL is not where the journal says.
function M.diverged(s, n)
  return s:_error("replay_diverged", ("the re-attached REPL had taken more of step %d's lines than the step "
    .. "sent again: it did not run as it did"):format(n), { step = n })
end

-- Why state (rlm.engine.tape's load) cannot go on by re-attach, or nil.
local function refusal(o, state)
  local rec, head = state.head.sandbox, state.head
  if not rec then
    return "the run recorded no lingering sandbox (sandbox.linger_ms of the exec backend)"
  elseif rec.backend ~= "exec" or o.sandbox.backend ~= "exec" then
    return "the resume's sandbox option is not the exec backend"
  elseif o.compact then
    return "with option compact the journal does not hold the conversation as the model saw it"
  elseif head.steps > 0 and state.done[head.steps].final then
    return "the run had its answer"
  end
end

-- rlm.Session.resume, s made and state read: the lingering keeper of the
-- recorded sandbox reached with this owner's fence, and s set to go on in
-- its REPL. true; or false and why (s replays: nothing lingers, the
-- linger is over, the keeper refused, or it no longer holds the step in
-- flight's lines).
function M.attach(s, state)
  local o, rec = s.opts, state.head.sandbox
  local why = refusal(o, state)
  if why then
    return false, why
  end
  local ok, h, info = pcall(linger.attach, o, { id = rec.id, token = rec.token, fence = state.lease.fence,
    seen = rec.seen })
  if not ok or not h then
    return false, tostring(ok and info or h)
  end
  if info.lost > 0 or info.taken < rec.sent then
    h:close() -- the session's end for that keeper: nothing lingers on
    return false, ("the keeper no longer holds the step in flight's lines (%d lost)"):format(info.lost)
  end
  s.sandbox:attach_to(h, math.floor(info.taken - rec.sent))
  s.conversation:restore(state.done, state.head.steps, rec.exec)
  s.tree:restore(state.head.counts)
  return true
end

return M
