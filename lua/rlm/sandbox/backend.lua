-- The sandbox seam: what the engine asks of a sandbox backend. The engine
-- (rlm.engine.boot, rlm.sandbox.pool) reaches a sandbox only through these
-- functions and the handle that start returns; everything that knows how
-- a sandbox is made (bubblewrap, the interpreter's probe, /proc) lives in
-- the backend. docs/architecture.md says where a new backend goes.
--
-- A backend is a module table with these functions:
--
--   prepare(opts, context, wait, owner) -> spec, info | nil, err
--       Everything a start needs that does not change from one start to
--       the next (found programs, the interpreter's report), looked up
--       once. wait(helper) returns the next event of a helper process and
--       yields the engine meanwhile; owner is the session (nil for a pool).
--       err is an rlm error, kind sandbox_unavailable.
--   start(opts, spec, info, canaries) -> handle | nil, message
--       Spawns a sandbox running the driver and sends it the start's first
--       messages (configure, self_test: docs/protocol.md).
--   forget(owner)
--       A session that goes away while it prepares: others ask anew.
--   adopt(handle) -> true | false, died
--       Puts every sandbox process under its memory limit, once the
--       driver has said hello; died when it is gone.
--   vet_processes(handle) -> tree | nil (it died), kind, message
--       What a host can check of a running sandbox before any session
--       uses it: every process's uids, no descriptor of the host's.
--   check_ready(handle, rlimits, vetted_tree) -> nil | kind, message
--       After the driver's ready: its rlimits, its processes (the ones
--       vetted, when vetted_tree is given; else their uids), and that no
--       descriptor but the session's pipes reaches it.
--   describe(handle) -> { backend =, mode =, detail =, not_promised = }
--       What sandbox it made: the backend's name, its mode ("bubblewrap",
--       or rlm-keeper's "seccomp" fallback), why that one, and what the
--       mode does not promise (rlm.sandbox.exec's, for its seccomp mode). The
--       self-test is checked against the mode's promises.
--   exit_hint(output) -> string
--       What a failed start's output says about the machine ("" if
--       nothing).
--
-- The handle (rlm.core's driver object for bubblewrap; a table over a
-- stream for exec) has these methods:
--   send(line) -> ok; poll(timeout_ms, max_values) -> event...; fd();
--   interrupt(); kill(); close(); alive(); write_context(bytes) and
--   context_written(); set_deadline(ms) and deadline_passed(); send_result
--   (the reply to a sub-call); exec_ms(); peak_rss(), memory_mechanism(),
--   oom_kills().
-- Its poll may give two events besides rlm.core's: "lost", message (a
-- stream ended with no word from the far side: sandbox_lost) and
-- "broken", message (the far side broke its protocol: protocol_error).
-- Errors go by err.kind (docs/api.md); a backend never raises at run time.
local bwrap = require("rlm.sandbox.bwrap")
local exec = require("rlm.sandbox.exec")

local M = {}

M.FUNCTIONS = { "prepare", "start", "forget", "adopt", "vet_processes", "check_ready", "describe", "exit_hint" }

-- The functions backend lacks, as a list (empty when it has them all).
function M.missing(backend)
  local out = {}
  for _, name in ipairs(M.FUNCTIONS) do
    if type(backend[name]) ~= "function" then
      out[#out + 1] = name
    end
  end
  return out
end

-- The backend a session or a pool uses, by its `sandbox` option
-- (engine/options.lua checks it): bubblewrap beside the host (the
-- default), or "exec", the far side of a stream (rlm.sandbox.exec). (Both
-- loaded with this module: a start may have no descriptor free to read a
-- file with.)
local BY_NAME = { bubblewrap = bwrap, exec = exec }
function M.for_options(opts)
  local sandbox = opts.sandbox
  return sandbox and BY_NAME[sandbox.backend] or bwrap
end

return M
