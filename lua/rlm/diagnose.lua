-- rlm.diagnose: what this machine gives the sandbox, and when bubblewrap
-- cannot start, which of its needs is missing: bubblewrap itself (0.8 or
-- later, for --disable-userns), user namespaces (the kernel's switches, a
-- container's seccomp profile, AppArmor), a /proc the sandbox may mount
-- (a container's masked paths), the interpreter, and the cgroup the memory
-- limit would use. Plain Lua (io.popen and /proc), so any host may call it:
-- :checkhealth rlm (rlm.health) shows it, and hint() turns a failed start
-- into the sentence that says what to change (docs/containers.md).
local util = require("rlm.base.util")

local M = {}

local read = util.read_file

local function read_number(path)
  return tonumber((read(path) or ""):match("^%s*(%-?%d+)"))
end

local q = util.shell_quote

-- Runs a shell command; returns its exit code and its output (stdout and
-- stderr, at most 4 KiB kept).
function M.run(cmd)
  local p = io.popen(cmd .. " 2>&1 </dev/null; echo \"rc=$?\"", "r")
  if not p then
    return 127, "io.popen failed"
  end
  local out = p:read("*a") or ""
  p:close()
  local rc = tonumber(out:match("rc=(%d+)%s*$")) or 127
  out = out:gsub("rc=%d+%s*$", ""):gsub("%s+$", "")
  return rc, out:sub(1, 4096)
end

local function test_flag(flag, path)
  return M.run(("test %s %s"):format(flag, q(path))) == 0
end

-- A program on PATH (or a path), or nil.
function M.which(name)
  if name:find("/", 1, true) then
    return test_flag("-x", name) and name or nil
  end
  for dir in (os.getenv("PATH") or "/usr/bin:/bin"):gmatch("[^:]+") do
    local path = dir .. "/" .. name
    if test_flag("-x", path) and not test_flag("-d", path) then
      return path
    end
  end
  return nil
end

local function uid()
  return tonumber((read("/proc/self/status") or ""):match("\nUid:%s*(%d+)"))
end

-- The seccomp mode of this process: 0 none, 1 strict, 2 a filter (Docker,
-- Podman and systemd services run under one).
local function seccomp_mode()
  return tonumber((read("/proc/self/status") or ""):match("\nSeccomp:%s*(%d)"))
end

-- The capabilities a root host's start uses: it drops to the sandbox's uid
-- (setresgid, setresuid) in a mount namespace of the child's own, where it
-- stages the driver's files (unshare(CLONE_NEWNS), mount): csrc/spawn.c.
local ROOT_CAPS = { { "CAP_SETGID", 6 }, { "CAP_SETUID", 7 }, { "CAP_SYS_ADMIN", 21 } }

-- Which of ROOT_CAPS this process lacks in its effective set (CapEff, a
-- hex mask); empty when it has them all or /proc does not say.
function M.missing_root_caps(status)
  local hex = (status or read("/proc/self/status") or ""):match("\nCapEff:%s*(%x+)")
  local missing = {}
  if not hex then
    return missing
  end
  for _, cap in ipairs(ROOT_CAPS) do
    local at = #hex - math.floor(cap[2] / 4)
    local digit = at >= 1 and tonumber(hex:sub(at, at), 16) or 0
    if math.floor(digit / 2 ^ (cap[2] % 4)) % 2 == 0 then
      missing[#missing + 1] = cap[1]
    end
  end
  return missing
end

-- "docker", "podman", "lxc", "kubernetes", "container" or nil.
function M.container()
  if read("/.dockerenv") then
    return "docker"
  end
  if read("/run/.containerenv") then
    return "podman"
  end
  local env = os.getenv("container")
  if env and env ~= "" then
    return env
  end
  if os.getenv("KUBERNETES_SERVICE_HOST") then
    return "kubernetes"
  end
  local cg = read("/proc/1/cgroup") or ""
  if cg:find("docker") or cg:find("containerd") then
    return "docker"
  elseif cg:find("lxc") then
    return "lxc"
  end
  return nil
end

-- The kernel's switches for user namespaces: a list of what refuses them
-- to this user (empty when none does).
function M.userns_blockers()
  local blockers = {}
  local max = read_number("/proc/sys/user/max_user_namespaces")
  if max == 0 then
    blockers[#blockers + 1] = "user.max_user_namespaces is 0 (sysctl -w user.max_user_namespaces=15000)"
  end
  if uid() ~= 0 then
    if read_number("/proc/sys/kernel/unprivileged_userns_clone") == 0 then
      blockers[#blockers + 1] = "kernel.unprivileged_userns_clone is 0 "
        .. "(sysctl -w kernel.unprivileged_userns_clone=1)"
    end
    if read_number("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == 1 then
      blockers[#blockers + 1] = "AppArmor restricts unprivileged user namespaces "
        .. "(kernel.apparmor_restrict_unprivileged_userns=1: give bwrap an AppArmor profile "
        .. "that allows userns, or set it to 0)"
    end
  end
  return blockers
end

-- bubblewrap's path and version ({major, minor, patch}), or nil, why.
function M.bubblewrap(name)
  local path = M.which(name or "bwrap")
  if not path then
    return nil, ("bubblewrap (%s) is not on PATH (Debian: apt-get install bubblewrap)"):format(name or "bwrap")
  end
  local _, out = M.run(q(path) .. " --version")
  local a, b, c = out:match("(%d+)%.(%d+)%.?(%d*)")
  local version = a and { tonumber(a), tonumber(b), tonumber(c) or 0 } or nil
  return path, version, test_flag("-u", path)
end

-- The namespaces and mounts the sandbox asks bubblewrap for, around
-- `true`: exit code and output.
function M.try_bubblewrap(path)
  -- As the session spawns it: without a preload of the host's.
  return M.run("env -u LD_PRELOAD " .. q(path) .. " --unshare-all --unshare-user --disable-userns --new-session"
    .. " --die-with-parent --cap-drop ALL --ro-bind / / --proc /proc --dev /dev true")
end

-- Why bubblewrap's output `out` says it could not start, as one sentence
-- that names what to change; nil when the output is not one we know.
function M.explain(out)
  out = out or ""
  local where = M.container()
  if out:find("disable%-userns") and out:find("[Uu]nknown option") then
    return "this bubblewrap is older than 0.8 (no --disable-userns); install 0.8 or later"
  end
  if out:find("[Cc]an't mount proc") or out:find("mount proc") then
    return "the kernel refuses a new /proc here: the container masks parts of its /proc"
      .. " (Docker: --security-opt systempaths=unconfined; see docs/containers.md)"
  end
  -- The errno decides, not the step that met it: EAGAIN from clone, fork
  -- or a thread is RLIMIT_NPROC, EINVAL writing the uid map is the uid,
  -- ENOSPC is the count of namespaces; only a refusal (EPERM, EACCES) is
  -- the kernel's switches or a container's.
  if out:find("Resource temporarily unavailable", 1, true) then
    return "the process limit (RLIMIT_NPROC, ulimit -u) is reached: it counts every process and thread"
      .. " of the uid, the host's too, and a root host's sandbox inherits it for its own uid; a session"
      .. " needs a keeper thread and three processes: raise ulimit -u"
  end
  if out:find("uid map") and out:find("Invalid argument", 1, true) then
    return "the kernel refused the sandbox's uid in a uid map: uids from 2^31 up (and ids the user"
      .. " namespace cannot map) are refused; a root host takes its uids from option sandbox.uids (first"
      .. " to first + count - 1), which must stay below 2^31"
  end
  if out:find("[Cc]reating new namespace") and out:find("No space left on device", 1, true) then
    return "the kernel's count of user namespaces is used up (user.max_user_namespaces,"
      .. " or a parent namespace's): raise it, or end what holds them"
  end
  -- A root host's own start, before bubblewrap runs (csrc/spawn.c: the
  -- sandbox's uid, the staging mount namespace): a refusal there is the
  -- capabilities it needs, or a seccomp filter; never user namespaces,
  -- which bubblewrap makes later.
  if out:find("as the sandbox's uid", 1, true) and (out:find("Operation not permitted", 1, true)
    or out:find("Permission denied", 1, true)) then
    local missing, blockers = M.missing_root_caps(), M.userns_blockers()
    local as_user = #blockers == 0 and "run rlm as a user other than root (bubblewrap then needs unprivileged"
      .. " user namespaces, which this kernel allows)"
      or ("running rlm as a user other than root would need user namespaces, which are off here (%s)")
        :format(table.concat(blockers, "; "))
    if #missing > 0 then
      return ("running as root without %s (dropped, as a container's default does): as root, rlm"):format(
        table.concat(missing, ", ")) .. " starts the sandbox as a uid of its own (CAP_SETUID, CAP_SETGID) from"
        .. " a mount namespace where it stages the driver's files (CAP_SYS_ADMIN); give the process those"
        .. " capabilities, or " .. as_user .. " (see docs/containers.md)"
    end
    if seccomp_mode() == 2 then
      return ("running as root under a seccomp filter (%s) that refuses unshare(CLONE_NEWNS) or mount:"):format(
        where and ("the " .. where .. " container's") or "a service's or container's")
        .. " as root, rlm starts the sandbox from a mount namespace of its own; allow those calls, or "
        .. as_user .. " (see docs/containers.md)"
    end
    return "running as root, the kernel refused the sandbox's uid or its staging mount namespace"
      .. " (setresuid, unshare(CLONE_NEWNS), mount): " .. as_user
  end
  if out:find("[Nn]o permissions to creat") or out:find("[Cc]reating new namespace")
    or out:find("uid map") or out:find("setting up uid") or out:find("[Oo]peration not permitted") then
    local blockers = M.userns_blockers()
    if #blockers > 0 then
      return "user namespaces are off: " .. table.concat(blockers, "; ")
    end
    if seccomp_mode() == 2 and where then
      return ("the %s container's seccomp profile refuses new namespaces"):format(where)
        .. " (Docker: --security-opt seccomp=unconfined or a profile that allows clone/unshare"
        .. " of namespaces; see docs/containers.md)"
    end
    if where then
      return ("the %s container does not let processes create user namespaces"):format(where)
        .. " (see docs/containers.md)"
    end
    return "the kernel refused to create the sandbox's namespaces"
  end
  return nil
end

-- The sentence to add to a sandbox_unavailable message after bubblewrap
-- failed with output `out`: " (why)", or "" when nothing is known.
function M.hint(out)
  local why = M.explain(out)
  return why and (" (" .. why .. ")") or ""
end

-- The cgroup the memory limit would use, as the core decides it: "cgroup v2"
-- when this process's own cgroup delegates the memory controller and may be
-- written, "cgroup v1" when the v1 memory hierarchy may be written, else
-- "poll"; and why.
function M.memory_mechanism()
  local mine = read("/proc/self/cgroup") or ""
  if read("/sys/fs/cgroup/cgroup.controllers") then
    local path = mine:match("0::([^\n]*)") or "/"
    local dir = "/sys/fs/cgroup" .. (path == "/" and "" or path)
    local controllers = read(dir .. "/cgroup.subtree_control") or ""
    if controllers:find("memory", 1, true) and test_flag("-w", dir) then
      return "cgroup v2", dir .. " delegates the memory controller"
    end
    return "poll", ("cgroup v2, but %s does not delegate memory to this user (its cgroup.subtree_control: %q);"
      .. " the memory limit is a poll of the sandbox's processes (see docs/containers.md)")
      :format(dir, (controllers:gsub("%s+$", "")))
  end
  local path = mine:match("%d+:[^:\n]*memory[^:\n]*:([^\n]*)")
  if path then
    local dir = "/sys/fs/cgroup/memory" .. (path == "/" and "" or path)
    if test_flag("-w", dir) then
      return "cgroup v1", dir .. " may be written"
    end
    return "poll", ("cgroup v1, but %s may not be written (root only)"):format(dir)
  end
  return "poll", "no memory cgroup is mounted"
end

-- The interpreter's path and version string, or nil, why.
function M.python(name)
  local path = M.which(name or "python3")
  if not path then
    return nil, ("the interpreter %s is not on PATH (Debian: apt-get install python3)"):format(name or "python3")
  end
  local rc, out = M.run(q(path) .. " -I -c 'import sys; print(\"%d.%d.%d\" % sys.version_info[:3])'")
  if rc ~= 0 then
    return nil, ("%s does not run: %s"):format(path, out)
  end
  return path, out
end

-- Every check as a row { name =, level = "ok" | "warn" | "error" | "info",
-- message = }: bubblewrap, its trial run, user namespaces, seccomp, the
-- interpreter and the memory cgroup.
function M.checks(opts)
  opts = opts or {}
  local rows = {}
  local function add(name, level, message)
    rows[#rows + 1] = { name = name, level = level, message = message }
  end
  local bwrap, version, setuid = M.bubblewrap(opts.bwrap)
  if not bwrap then
    add("bubblewrap", "error", version)
  else
    local v = version and table.concat(version, ".") or "?"
    if version and (version[1] > 0 or version[2] >= 8) then
      add("bubblewrap", "ok", ("%s %s%s"):format(bwrap, v, setuid and " (setuid)" or ""))
    else
      add("bubblewrap", "error", ("%s %s is older than 0.8 (the sandbox needs --disable-userns)"):format(bwrap, v))
    end
    local rc, out = M.try_bubblewrap(bwrap)
    if rc == 0 then
      add("sandbox", "ok",
        "bubblewrap starts the sandbox's namespaces and mounts (user, pid, net, ipc, uts, cgroup; /proc)")
    else
      add("sandbox", "error", ("bubblewrap cannot start the sandbox (exit %d: %s)%s"):format(rc, out, M.hint(out)))
    end
  end
  local blockers = M.userns_blockers()
  if #blockers == 0 then
    add("user namespaces", "ok", uid() == 0 and "running as root" or "unprivileged user namespaces are allowed")
  else
    add("user namespaces", "error", table.concat(blockers, "; "))
  end
  if uid() == 0 then
    local missing = M.missing_root_caps()
    if #missing > 0 then
      add("root", "error", M.explain("spawning bwrap as the sandbox's uid: Operation not permitted"))
    else
      add("root", "ok", "running as root with CAP_SETUID, CAP_SETGID and CAP_SYS_ADMIN: the sandbox gets a uid"
        .. " of its own")
    end
  end
  local where, mode = M.container(), seccomp_mode()
  if where or mode == 2 then
    add("container", "info", ("%s; seccomp %s"):format(where and ("inside a " .. where .. " container")
      or "not in a known container", mode == 2 and "filter on (a container's or service's profile)" or "off"))
  end
  local python, pv = M.python(opts.python)
  if python then
    add("interpreter", "ok", ("%s %s"):format(python, pv))
  else
    add("interpreter", "error", pv)
  end
  local mech, why = M.memory_mechanism()
  if mech == "poll" then
    why = why .. "; the poll does not see the kernel's own memory for the sandbox (pipe buffers,"
      .. " kernel stacks, page tables: a few MiB, bounded; docs/security.md, Memory)"
  end
  add("memory limit", mech == "poll" and "warn" or "ok", ("%s: %s"):format(mech, why))
  return rows
end

return M
