-- The rlimits the driver must set on itself, whatever the backend: the
-- pool-level ones (configure) and the session's (load_context). The driver
-- reports its self-test from inside (python/_rlm_driver/selftest.py); how
-- a backend checks them from outside is its own (rlm.sandbox.bwrap reads
-- them from /proc).
local M = {}

-- What the driver's self-test must report, ok, for each sandbox mode
-- (python/_rlm_driver/selftest.py's MODES): bubblewrap's every check; the
-- seccomp fallback's (rlm-keeper where bubblewrap cannot run) the ones it
-- can hold without namespaces.
M.PROMISED = {
  bubblewrap = { "network", "host_files", "canaries", "seccomp", "own_init", "pid_namespace",
    "read_only_install", "workdir_writable", "capabilities", "descriptors", "environment", "host_sysctl",
    "device_nodes", "workdir_mount", "setuid_files", "proc_hidden" },
  seccomp = { "network", "canaries", "seccomp", "read_only_install", "workdir_writable", "capabilities",
    "descriptors", "environment", "host_sysctl", "device_nodes", "setuid_files" },
}


-- The limits for a session, -1 meaning unlimited. The address space is a
-- backstop behind the watchdog, so it leaves room for a mapped context and
-- its decoded copy; NPROC bounds threads (seccomp already forbids forks).
-- The kernel counts some budgets per host user, whatever the namespace:
-- queued signals and POSIX timers (SIGPENDING, else the host user's own
-- sigqueue and timer_create fail), message queue bytes, locked pages
-- (MEMLOCK: memfd_secret and mlock, which the poll would not see as
-- anonymous memory); NOFILE also bounds the pipes' buffers (64 KiB each,
-- F_SETPIPE_SZ is denied), which no RSS shows: 2 MiB at most.
-- RLIMIT_AS and RLIMIT_CPU depend on the session (its context, its steps):
-- session_rlimits; the rest are the same for every session (pool_rlimits),
-- which a pooled sandbox sets before a session takes it.
function M.pool_rlimits()
  return {
    RLIMIT_NPROC = 64,
    RLIMIT_FSIZE = 2 ^ 30,
    RLIMIT_NOFILE = 64,
    RLIMIT_CORE = 0,
    RLIMIT_SIGPENDING = 64,
    RLIMIT_MSGQUEUE = 0,
    RLIMIT_MEMLOCK = 0,
  }
end

function M.session_rlimits(opts, context_bytes)
  local as = -1
  if opts.max_rss_bytes > 0 then
    as = math.min(4 * opts.max_rss_bytes + 2 * context_bytes + 2 ^ 31, 2 ^ 46)
  end
  return {
    RLIMIT_AS = as,
    RLIMIT_CPU = math.ceil((opts.max_iterations + 1) * opts.step_timeout_ms / 1000) + 60,
  }
end

function M.rlimits(opts, context_bytes)
  local all = M.pool_rlimits()
  for name, v in pairs(M.session_rlimits(opts, context_bytes)) do
    all[name] = v
  end
  return all
end

return M
