-- How to run Podman on this host (docs/backends.md, "What this host
-- needs"): the flags spec/container_spec.lua and bench/container.lua give
-- it. No require of the spec's helpers: the bench loads this too
-- (spec.helpers.podman).
local M = {}

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  return (out:gsub("%s+$", ""))
end

-- podman's path, or nil.
function M.find()
  local path = sh("command -v podman || true")
  return path ~= "" and path or nil
end

-- Whether this host mixes cgroup v1 hierarchies with a v2 one (a
-- "hybrid" layout), which crun refuses whatever it is asked for.
function M.hybrid_cgroups()
  local f = io.open("/proc/self/mountinfo", "r")
  local text = f and f:read("*a") or ""
  if f then
    f:close()
  end
  return text:find(" %- cgroup2 ") ~= nil and text:find(" %- cgroup ") ~= nil
end

-- The global flags this host needs (before `run`): the runtime. nil and
-- why where none will do.
function M.global_flags()
  -- crun 1.8 (Debian 12's, Podman's default runtime) fails on a hybrid
  -- layout: "cgroups in hybrid mode not supported, drop all controllers
  -- from cgroupv2". runc takes it.
  if M.hybrid_cgroups() then
    if sh("command -v runc || true") == "" then
      return nil, "this host mixes cgroup v1 and v2, which crun refuses, and runc is not installed"
    end
    return { "--runtime", "runc" }
  end
  return {}
end

-- The rlimits every `podman run` gives: Podman asks for RLIMIT_NOFILE
-- 1048576 and RLIMIT_NPROC 4194304 by default, and where the hard limits
-- are lower and CAP_SYS_RESOURCE is not there to raise them (this VM), the
-- runtime's setrlimit fails. A case may ask for others.
M.ULIMITS = { nofile = 1024, nproc = 1024 }

function M.ulimit_flags(over)
  local out = {}
  for _, name in ipairs({ "nofile", "nproc" }) do
    local n = (over or {})[name] or M.ULIMITS[name]
    out[#out + 1] = "--ulimit"
    out[#out + 1] = ("%s=%d:%d"):format(name, n, n)
  end
  return out
end

-- The container boundary: no network, a read-only root, the memory and
-- process limits, no capability, no privilege gained by exec.
function M.boundary_flags(memory_bytes, pids)
  return { "--network=none", "--read-only", "--memory", ("%d"):format(memory_bytes), "--pids-limit",
    tostring(pids), "--cap-drop=ALL", "--security-opt", "no-new-privileges" }
end

-- What bubblewrap needs inside the container: /proc unmasked (the kernel
-- mounts a new procfs in a user namespace only where no part of the
-- container's is covered) and a seccomp profile that allows sethostname
-- (sandbox/image/seccomp.py).
function M.bwrap_flags(seccomp_profile)
  return { "--security-opt", "unmask=/proc/*", "--security-opt", "seccomp=" .. seccomp_profile }
end

return M
