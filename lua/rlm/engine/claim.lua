-- A session's sandbox claims (the exec backend's `sandbox.claim` and
-- `sandbox.release`: docs/backends.md; what a claim's answer becomes, and
-- a pool's claims, are rlm.sandbox.claim's). They run as the host's other
-- callbacks do. A session's claim is a request handed out through poll()
-- (type "sandbox_claim"): run() calls it at once, an adapter as it calls
-- root_llm, and its answer comes back through reply(id, argv[, handle]),
-- which the start (rlm.engine.boot) waits for. A release runs in a
-- coroutine of its own from close() (rlm.sandbox.exec), and its failure is
-- the session's event (sandbox_release_failed): never an error out of
-- close().
local errors = require("rlm.base.errors")
local events = require("rlm.base.events")
local util = require("rlm.base.util")
local sandbox_claim = require("rlm.sandbox.claim")
local IDLE = require("rlm.engine.loop").IDLE

local M = {}

-- Where a session's failed release goes: its on_event, if any, called
-- here and now; what on_event raises goes nowhere (the session may be
-- closed, and close() does not raise).
function M.reporter(s)
  return function(message)
    local cb = s.opts.on_event
    if cb then
      util.call_protected(cb, events.check({ type = "sandbox_release_failed", message = message,
        depth = s.depth, session = s.session_id }))
    end
  end
end

-- A sandbox session s took from a pool: its release's failure is the
-- session's to hear of from now on.
function M.adopt(s, drv)
  if drv.report_release then
    drv:report_release(M.reporter(s))
  end
end

-- The claim of session s's cold start: handed out through poll(), waited
-- for. Returns the spec of the start (the backend's claimed), or nil and
-- the error (sandbox_unavailable; cancelled when the session is closed
-- meanwhile; cost_budget at max_wall_ms). The root model's first call may
-- be out meanwhile (rlm.engine.opening): its reply stays in the inbox for
-- the first turn.
function M.session(s, backend, spec)
  local scheduler = s.scheduler
  local req = scheduler:request({ type = "sandbox_claim", info = { depth = s.depth, session = s.session_id },
    claim = spec.claim, release = spec.release })
  -- An answer the start never takes (the session closed first: drop_all)
  -- is released there, as an answer given after the close is (start).
  req.dropped = function(r)
    if not r.failed and r.text ~= nil and spec.release then
      util.invoke(spec.release, r.usage == nil and r.text or r.usage, function() end, false)
    end
  end
  while true do
    local r = scheduler:take_reply_to(req)
    if r then
      local out, why = sandbox_claim.answered(backend, spec, not r.failed, r.failed and r.message or r.text,
        r.usage, M.reporter(s))
      if not out then
        return nil, errors.new("sandbox_unavailable", why)
      end
      return out
    end
    if s.closed or s.failed then
      return nil, s.failed or errors.new("cancelled", "the session was closed while its sandbox was claimed")
    end
    -- max_wall_ms bounds the whole run, a claim that never answers too:
    -- given up, its late answer is released as one after a close is.
    local left = s.tree:wall_left()
    if left and left <= 0 then
      scheduler:forget(req.id)
      return nil, s.tree:wall_error()
    end
    coroutine.yield(IDLE)
  end
end

-- Starts request ev (type "sandbox_claim") of session s the host's way, as
-- rlm.drive.dispatch starts a model callback: start(fn, arg, settle). What
-- a claim gives after its session stopped waiting (closed, failed) is
-- released as it is given, whether it returned or called done(): it must
-- not outlive the session (an adapter drops an answer that comes after the
-- run's end).
function M.start(s, ev, start)
  local function given(argv, handle)
    if argv ~= nil and ev.release and not s.scheduler:wants(ev.id) then
      util.invoke(ev.release, handle == nil and argv or handle, function() end, false)
    end
    return argv, handle
  end
  local function claim(info, done)
    return given(ev.claim(info, function(argv, handle)
      return done(given(argv, handle))
    end))
  end
  start(claim, ev.info, function(ok, argv, handle)
    if ok then
      s:reply(ev.id, argv, handle)
    else
      s:reply(ev.id, nil, tostring(argv))
    end
  end)
end

return M
