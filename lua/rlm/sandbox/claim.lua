-- A sandbox made for each start by the host's callbacks (the exec
-- backend's `sandbox.claim` and `sandbox.release`: docs/backends.md): a
-- Kubernetes SandboxClaim created and waited on, a container started. The
-- claim gives the stream's argv; the release, when the sandbox is closed,
-- deletes what the claim made (the backend's handle does that at its
-- close, rlm.sandbox.exec).
--
-- This is the sandbox layer's part: what a claim's answer becomes (the
-- spec of one start), and a claim outside any session, the pool's. A
-- pool has no loop of its own: its claim runs in a coroutine of its own
-- (rlm.base.util.invoke), which a yield leaves to whoever resumes it (the
-- host's loop), and the sandbox starts when the claim returns. A session's
-- claim is a request handed out through its poll() (rlm.engine.claim).
local util = require("rlm.base.util")

local M = {}

-- What a claim answered (ok, argv, handle: as a callback's settle gets
-- them; ok false: argv is why it failed) as the spec of one start from
-- spec: the spec, or nil and why (sandbox_unavailable's message; what the
-- claim made is released then). report(message) is told of a release of
-- this sandbox that fails, from now on.
function M.answered(backend, spec, ok, argv, handle, report)
  if not ok then
    return nil, "option 'sandbox.claim' failed: " .. tostring(argv)
  end
  return backend.claimed(spec, argv, handle, report)
end

-- Runs spec.claim(info) outside any session, in a coroutine of its own,
-- and calls done(spec) with the spec of the start it gave, or done(nil,
-- why) (a claim that failed, or gave what the backend refuses: released
-- already). done may come before run returns (a claim that does not
-- yield), or later, from whatever resumes the claim.
function M.run(backend, spec, info, report, done)
  util.invoke(spec.claim, info, function(ok, argv, handle)
    return done(M.answered(backend, spec, ok, argv, handle, report))
  end, false)
end

return M
