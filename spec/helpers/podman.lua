-- How to run Podman on this host (docs/backends.md, "What this host
-- needs"): the flags spec/container_spec.lua and bench/container.lua give
-- it. No require of the spec's helpers: the bench loads this too
-- (spec.helpers.podman).
local util = require("rlm.base.util")
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

local q, words = util.shell_quote, util.shell_words

-- A Podman store of a spec's own (--root, --runroot, --tmpdir in a
-- directory it made), with the image's tarball imported as `image`: the
-- store, or nil and why not (pending, with the reason). store.global are
-- the store's flags (what the podman backend's `global_args` takes),
-- store.runtime the runtime this host needs (its `runtime`), or nil. root:
-- the checkout (default: the working directory).
local Store = {}
Store.__index = Store

function M.store(tar, image, root)
  local podman = M.find()
  if not podman then
    return nil, "podman is not installed (make image installs it)"
  end
  local f = io.open(tar, "rb")
  if not f then
    return nil, tar .. " is missing (make image builds it)"
  end
  f:close()
  local host, why = M.global_flags()
  if not host then
    return nil, why
  end
  local dir = sh("mktemp -d /tmp/rlm-podman.XXXXXX")
  local s = setmetatable({ podman = podman, dir = dir, rootless = sh("id -u") ~= "0", runtime = host[2],
    global = { "--root", dir .. "/root", "--runroot", dir .. "/run", "--tmpdir", dir .. "/tmp",
      "--storage-driver", "overlay" } }, Store)
  s.all = {}
  for _, w in ipairs(s.global) do
    s.all[#s.all + 1] = w
  end
  for _, w in ipairs(host) do
    s.all[#s.all + 1] = w
  end
  local out = sh("env -u LD_PRELOAD " .. words({ (root or ".") .. "/sandbox/image/import", tar, image, podman }) .. " "
    .. words(s.all)
    .. " 2>&1; echo rc=$?")
  if not out:find("rc=0$") then
    s:teardown()
    return nil, "podman import failed: " .. out
  end
  return s
end

-- A shell command running podman on the store, from its directory (conmon
-- leaves "oom" in its working directory), without make check's preload.
function Store:cmd(args)
  return "cd " .. q(self.dir) .. " && exec env -u LD_PRELOAD " .. words({ self.podman }) .. " " .. words(self.all)
    .. " " .. words(args)
end

function Store:run(args)
  return sh(self:cmd(args) .. " 2>&1")
end

-- The names of the store's containers, running or not, sorted.
function Store:containers()
  local out = sh(self:cmd({ "ps", "-a", "--format", "{{.Names}}" }) .. " 2>/dev/null")
  local names = {}
  for n in out:gmatch("%S+") do
    names[#names + 1] = n
  end
  table.sort(names)
  return names
end

-- Removes the store, its containers and, rootless, the pause process that
-- holds its user namespace (its pid in our --tmpdir; it ignores SIGTERM).
function Store:teardown()
  sh(self:cmd({ "rm", "-a", "-f", "-t", "0" }) .. " >/dev/null 2>&1")
  sh(self:cmd({ "rmi", "-a", "-f" }) .. " >/dev/null 2>&1")
  if self.rootless then
    sh(self:cmd({ "unshare", "rm", "-rf", self.dir .. "/root" }) .. " >/dev/null 2>&1")
    local f = io.open(self.dir .. "/tmp/pause.pid", "r")
    local pause = f and tonumber(f:read("*a"):match("%d+") or "")
    if f then
      f:close()
    end
    if pause then
      sh("kill -9 " .. pause .. " 2>/dev/null")
    end
  end
  sh("rm -rf " .. q(self.dir))
end

return M
