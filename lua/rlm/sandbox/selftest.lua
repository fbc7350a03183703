-- The host's half of the start-up self-test: the rlimits the driver must
-- set on itself, read back from /proc, and the descriptors that reach the
-- sandbox. The driver's half (python/repl_driver.py, self_test) runs inside.
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

-- What the seccomp fallback does not promise, by the bubblewrap check it
-- has no counterpart of: the session's result and sandbox_ready event say
-- it (docs/security.md, "The fallback").
M.NOT_PROMISED = {
  bubblewrap = {},
  seccomp = {
    host_files = "no empty root: the REPL reads what the far side's files let any uid read "
      .. "(the image's interpreter and libraries, /etc, world-readable files)",
    own_init = "no pid namespace: the REPL sees the far side's processes in /proc (their command lines), "
      .. "though it may signal or trace none of them",
    pid_namespace = "no pid namespace (as own_init)",
    proc_hidden = "/proc is the far side's, its host-global files as readable as they are there",
    workdir_mount = "the workdir is a directory of the far side's filesystem (TMPDIR), not a tmpfs of its own: "
      .. "workdir_max_bytes is no size cap (its bytes count against max_rss_bytes, each file is capped by "
      .. "RLIMIT_FSIZE), and files the REPL writes in world-writable directories outside it (/tmp, /dev/shm) "
      .. "outlive the session there",
    network_interfaces = "the far side's network interfaces are there; no socket of any family can be made",
  },
}

local ROWS = {
  RLIMIT_AS = "Max address space",
  RLIMIT_NPROC = "Max processes",
  RLIMIT_FSIZE = "Max file size",
  RLIMIT_NOFILE = "Max open files",
  RLIMIT_CORE = "Max core file size",
  RLIMIT_CPU = "Max cpu time",
  RLIMIT_SIGPENDING = "Max pending signals",
  RLIMIT_MSGQUEUE = "Max msgqueue size",
  RLIMIT_MEMLOCK = "Max locked memory",
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

-- check_uids(pids, want) -> nil | "what is wrong": every sandbox process,
-- as the host sees it (/proc/<pid>/status), runs with real, effective, saved
-- and filesystem uid and gid `want` (the sandbox's uid on a root host, the
-- host's own otherwise), and never as 0 when the host is root. Checked here
-- because inside, bwrap's nested user namespace shows only its own ids.
function M.check_uids(pids, want)
  local problems = {}
  for _, pid in ipairs(pids) do
    local f = io.open("/proc/" .. pid .. "/status", "r")
    local text = f and f:read("*a") or ""
    if f then
      f:close()
    end
    for _, key in ipairs({ "Uid", "Gid" }) do
      local ids = text:match("\n" .. key .. ":%s*([%d%s]-)\n")
      local seen = {}
      for id in (ids or ""):gmatch("%d+") do
        seen[#seen + 1] = tonumber(id)
      end
      local fine = #seen == 4
      for _, id in ipairs(seen) do
        fine = fine and id == want and id ~= 0
      end
      if f and not fine then
        problems[#problems + 1] = ("pid %d %s %s, wanted %d"):format(pid, key, ids or "?", want)
      end
    end
  end
  return #problems > 0 and table.concat(problems, "; ") or nil
end

local function parse_limit(s)
  if s == "unlimited" then
    return -1
  end
  return tonumber(s)
end

-- check_rlimits(pid, wanted) -> nil | "what is wrong". Soft and hard must be
-- equal and no higher than asked (the host's own hard limit may be lower).
function M.check_rlimits(pid, wanted)
  local f = io.open("/proc/" .. pid .. "/limits", "r")
  if not f then
    return "cannot read /proc/" .. pid .. "/limits"
  end
  local text = f:read("*a")
  f:close()
  local problems = {}
  for name, want in pairs(wanted) do
    local soft, hard = text:match(ROWS[name] .. "%s+(%S+)%s+(%S+)")
    soft, hard = parse_limit(soft or ""), parse_limit(hard or "")
    local fine = soft ~= nil and soft == hard
      and (want < 0 and soft == -1 or want >= 0 and soft >= 0 and soft <= want)
    if not fine then
      problems[#problems + 1] = ("%s is %s/%s, wanted %.0f"):format(name, tostring(soft),
        tostring(hard), want)
    end
  end
  table.sort(problems)
  return #problems > 0 and table.concat(problems, "; ") or nil
end

return M
