-- A sandbox made for each start by the host's callbacks (the exec
-- backend's `sandbox.claim` and `sandbox.release`: docs/backends.md): a
-- Kubernetes SandboxClaim created and waited on, a container started. The
-- claim gives the stream's argv; the release, when the sandbox is closed,
-- deletes what the claim made.
--
-- They run as the host's other callbacks do. A session's claim is a
-- request handed out through poll() (type "sandbox_claim"): run() calls it
-- at once, an adapter as it calls root_llm, and its answer comes back
-- through reply(id, argv[, handle]). A pool has no loop of its own: its
-- claims run in a coroutine each (rlm.base.util.invoke), which a yield
-- leaves to whoever resumes it (the host's loop), and the sandbox starts
-- when the claim returns. A release runs the same way from close(), and
-- its failure is an event (sandbox_release_failed) for a session, a count
-- for a pool: never an error out of close().
local errors = require("rlm.base.errors")
local util = require("rlm.base.util")
local IDLE = require("rlm.engine.loop").IDLE

local M = {}

-- Where a session's failed release goes: its on_event, if any, called
-- here and now; what on_event raises goes nowhere (the session may be
-- closed, and close() does not raise).
function M.reporter(s)
  return function(message)
    local cb = s.opts.on_event
    if cb then
      util.call_protected(cb, { type = "sandbox_release_failed", message = message, depth = s.depth,
        session = s.session_id })
    end
  end
end

-- A sandbox a session took from a pool: its release's failure is the
-- session's to hear of from now on.
function M.adopt(s, drv)
  if drv.report_release then
    drv:report_release(M.reporter(s))
  end
end

-- The claim of a session's cold start: handed out through poll(), waited
-- for. Returns the spec of the start (backend.claimed), or nil and the
-- error (sandbox_unavailable; cancelled when the session is closed
-- meanwhile).
function M.session(s, backend, spec)
  local req = s:_request({ type = "sandbox_claim", info = { depth = s.depth, session = s.session_id },
    claim = spec.claim, release = spec.release })
  while true do
    for i, r in ipairs(s.inbox) do
      if r.request == req then
        table.remove(s.inbox, i)
        if r.failed then
          return nil, errors.new("sandbox_unavailable", "option 'sandbox.claim' failed: " .. tostring(r.message))
        end
        local out, why = backend.claimed(spec, r.text, r.usage, M.reporter(s))
        if not out then
          return nil, errors.new("sandbox_unavailable", why)
        end
        return out
      end
    end
    if s.closed or s.failed then
      return nil, s.failed or errors.new("cancelled", "the session was closed while its sandbox was claimed")
    end
    coroutine.yield(IDLE)
  end
end

-- Starts request ev (type "sandbox_claim") the host's way, as rlm.dispatch
-- starts a model callback: start(fn, arg, settle). What a claim gives
-- after its session stopped waiting (closed, failed) is released as it is
-- given, whether it returned or called done(): it must not outlive the
-- session (an adapter drops an answer that comes after the run's end).
function M.start(s, ev, start)
  local function given(argv, handle)
    if argv ~= nil and ev.release and not s:_wants(ev.id) then
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

-- One claim of a pool's: the sandbox starts when it returns (pool:_start).
-- Returns false when it failed at once (the pool stops filling until its
-- next take), true otherwise.
function M.pool_spawn(pool)
  local backend, spec = pool.backend, pool.spec
  local failed = false
  pool.claiming = pool.claiming + 1
  local function report(message)
    pool.counts.release_failed = pool.counts.release_failed + 1
    pool.release_error = message
  end
  util.invoke(spec.claim, { depth = 0, pool = true }, function(ok, argv, handle)
    pool.claiming = pool.claiming - 1
    local one, why
    if ok then
      one, why = backend.claimed(spec, argv, handle, report)
    else
      why = "option 'sandbox.claim' failed: " .. tostring(argv)
    end
    if not one then
      pool.counts.failed = pool.counts.failed + 1
      pool.claim_error, failed = why, true
      return
    end
    if pool.closed then
      backend.release_claim(one)
      return
    end
    if not pool:_start(one) then
      failed = true
    end
  end, false)
  return not failed
end

return M
