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
--   check_option(where, v, level), read_option(v) -> table
--       The `sandbox` option's fields for this backend, checked (misuse
--       raises, naming the field: rlm.base.checks.fields), and read with
--       their defaults filled in (a pool's sessions must give the same).
--
-- A backend whose sandboxes are claimed (exec's `sandbox.claim`: the
-- spec from prepare has a `claim` function) also has
--   claimed(spec, argv, handle, report) -> spec | nil, message
--       The spec of one start with what the claim gave; report(message)
--       is told of a release that fails. A session's claim is called as
--       the host's other callbacks are (rlm.engine.claim), a pool's in a
--       coroutine of its own (rlm.sandbox.claim).
--   release_claim(spec)
--       A claimed spec that will not be started.
-- and its handle report_release(report): where a failed release goes
-- from now on. The handle's close() releases the claim.
--
-- The handle (rlm.core's driver object for bubblewrap; a table over a
-- stream for exec) has these methods:
--   send(line) -> ok; poll(timeout_ms, max_values) -> event...; fd();
--   interrupt(); kill(); close(); alive(); write_context(bytes) and
--   context_written(); set_deadline(ms) and deadline_passed(); exec_ms();
--   peak_rss(), memory_mechanism(), oom_kills().
-- Its poll may give two events besides rlm.core's: "lost", message (a
-- stream ended with no word from the far side: sandbox_lost) and
-- "broken", message (the far side broke its protocol: protocol_error).
-- Errors go by err.kind (docs/api.md); a backend never raises at run time.
local bwrap = require("rlm.sandbox.bwrap")
local checks = require("rlm.base.checks")
local container = require("rlm.sandbox.container")
local exec = require("rlm.sandbox.exec")

local M = {}

M.FUNCTIONS = { "prepare", "start", "forget", "adopt", "vet_processes", "check_ready", "describe", "exit_hint",
  "check_option", "read_option" }

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
-- (check_option below): bubblewrap beside the host (the default), "exec",
-- the far side of a stream (rlm.sandbox.exec), or "podman" and "docker", a
-- container the engine starts for each sandbox (rlm.sandbox.container, over
-- exec's stream). (All loaded with this module: a start may have no
-- descriptor free to read a file with.)
local BY_NAME = { bubblewrap = bwrap, exec = exec, podman = container, docker = container }
M.NAMES = { "bubblewrap", "exec", "podman", "docker" }
function M.for_options(opts)
  local sandbox = opts.sandbox
  return sandbox and BY_NAME[sandbox.backend] or bwrap
end

-- Checks the `sandbox` option (nil, or no `backend`: bubblewrap beside the
-- host); its fields are the backend's and the ones every backend takes
-- (rlm.sandbox.shape). Misuse raises "<where>: option 'sandbox.<field>'
-- ...". level as for error() at the caller.
function M.check_option(where, v, level)
  level = level + 1
  if v == nil then
    return
  end
  if type(v) ~= "table" then
    error(("%s: option 'sandbox' must be a table { [backend = \"bubblewrap\" | \"exec\" | \"podman\" | "
      .. "\"docker\",] ... }, got %s"):format(where, checks.describe(v)), level)
  end
  local backend = v.backend == nil and bwrap or BY_NAME[v.backend]
  if not backend then
    error(("%s: option 'sandbox.backend' must be one of %s, got %s"):format(where,
      '"' .. table.concat(M.NAMES, '", "') .. '"', checks.describe(v.backend)), level)
  end
  backend.check_option(where, v, level)
end

-- The option as its backend reads it, every field set or defaulted (nil
-- is bubblewrap's); reading a read option gives the same.
function M.read_option(v)
  v = v or {}
  return (v.backend == nil and bwrap or BY_NAME[v.backend]).read_option(v)
end

return M
