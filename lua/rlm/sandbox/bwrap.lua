-- The bubblewrap backend (the contract: rlm.sandbox.backend). Starting the
-- driver: find bubblewrap and the interpreter, learn once what of the
-- interpreter's installation the sandbox must show, spawn; and what the
-- host checks of a running sandbox from outside (/proc: its processes'
-- uids, rlimits and descriptors; its memory cgroup).
local core = require("rlm.core")
local checks = require("rlm.base.checks")
local errors = require("rlm.base.errors")
local probe = require("rlm.sandbox.probe")
local shape = require("rlm.sandbox.shape")
local util = require("rlm.base.util")

local M = {}

-- The modules the driver's guardrails allow by default; the probe imports
-- them so that every library they load is bound into the sandbox.
M.default_modules = {
  "re", "json", "math", "collections", "itertools", "functools", "operator",
  "statistics", "string", "textwrap", "unicodedata", "datetime", "time", "heapq",
  "bisect", "difflib", "random", "copy", "typing", "dataclasses", "enum",
  "fractions", "decimal", "hashlib", "base64", "csv", "pprint", "io",
}

local function unavailable(message, fields)
  return nil, errors.new("sandbox_unavailable", message, fields)
end

-- The driver's package, beside repl_driver.py (python/ in a checkout, rlm/
-- when installed). The probe packs these files into one zip with the
-- interpreter's bytecode for each (checked against its source), copied into
-- the sandbox at /rlm/driver.zip, and compiles repl_driver.py, which the
-- sandbox runs as /rlm/repl_driver.pyc: nothing is compiled per start.
M.driver_modules = {
  "_rlm_driver/__init__.py", "_rlm_driver/api.py", "_rlm_driver/codec.py", "_rlm_driver/guard.py",
  "_rlm_driver/loader.py", "_rlm_driver/main.py", "_rlm_driver/prose.py",
  "_rlm_driver/protocol.py", "_rlm_driver/screen.py",
  "_rlm_driver/selftest.py", "_rlm_driver/shield.py", "_rlm_driver/state.py",
  "_rlm_driver/step.py", "_rlm_driver/tools.py", "_rlm_driver/tree.py",
}

-- Descriptors a session's start needs free at once: the probe's and the
-- driver's loops and pipes (rlm.core checks its own share again), the
-- seccomp filter, the driver's files, the workdir and the waitset behind
-- fd().
local SESSION_FDS = 40

-- A nested session's sandbox starts only while the host keeps a quarter of
-- its descriptors (RLIMIT_NOFILE) free beside what the start needs: the
-- REPL's code asks, the host's own files and sessions come first. Looked at
-- as each child starts (one after another), so that a batch counts what its
-- first children took. nil, or the error the child ends with (the code
-- that asked sees it).
M.FD_RESERVE_SHARE = 4
local function fd_reserve_error()
  local free, limit = core.fd_free()
  if not free then
    return errors.new("sandbox_unavailable", "a nested session was not started: the host cannot count its "
      .. "free file descriptors (" .. tostring(limit) .. ")")
  end
  local reserve = math.floor(limit / M.FD_RESERVE_SHARE)
  if free - SESSION_FDS < reserve then
    return errors.new("sandbox_unavailable", ("a nested session was not started: the host has %d file "
      .. "descriptors free of %d (RLIMIT_NOFILE), keeps a quarter (%d) for itself, and a session needs %d")
      :format(free, limit, reserve, SESSION_FDS), { free_fds = free, fd_limit = limit })
  end
end

-- A session that goes away while it probes lets the others ask.
M.forget = probe.forget

-- The sys.path the driver gets: the interpreter's own, plus the directories
-- that .pth files add only when bind_pth_paths asks for them.
function M.sys_path(info, bind_pth_paths)
  return util.append({}, info.sys_path, bind_pth_paths and info.pth_paths or {})
end

-- The paths the sandbox binds read-only, from the probe's report:
-- directories first, so that files inside them are not bound twice.
function M.readonly_paths(info, bind_pth_paths)
  local ro = util.append({}, M.sys_path(info, bind_pth_paths), info.files)
  if info.interpreter then
    ro[#ro + 1] = info.interpreter
  end
  ro[#ro + 1] = "/etc/ld.so.cache"
  return ro
end

local function cwd()
  local p = os.getenv("PWD")
  return p and p:sub(1, 1) == "/" and p or nil
end

-- prepare(opts, context_data, wait, owner) -> spec, info | nil, err: what
-- rlm.core's spawn takes (rlm.boot spawns it), and what the self-test needs.
function M.prepare(opts, context_data, wait, owner)
  local sb = opts.sandbox
  local free = core.fd_headroom(SESSION_FDS)
  if free < SESSION_FDS then
    return unavailable(("too few free file descriptors (EMFILE): %d free, a session needs %d to start")
      :format(free, SESSION_FDS), { free_fds = free })
  end
  local reserve_err = owner and owner.parent and fd_reserve_error()
  if reserve_err then
    return nil, reserve_err
  end
  local bwrap = core.find_program(sb.bwrap)
  if not bwrap then
    return unavailable(("bubblewrap (%q) was not found; the REPL never runs unsandboxed: install bubblewrap"
      .. " 0.8 or later (Debian and Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)")
      :format(sb.bwrap))
  end
  local python = core.find_program(sb.python)
  if not python then
    return unavailable(("the interpreter %q was not found (Debian and Ubuntu: apt-get install python3)")
      :format(sb.python))
  end
  local driver_py, ferr = probe.find_file("repl_driver.py")
  if not driver_py then
    return nil, ferr
  end
  local dir = driver_py:match("^(.*)/[^/]*$")
  local modules = util.append({}, M.default_modules, sb.allowed_modules)
  -- The package's files are read by the probe, which packs them (once per
  -- Lua state): a start that reuses its zip does not look at them again.
  if not probe.asked(python, modules, dir) then
    for _, name in ipairs(M.driver_modules) do
      local ok, why = util.file_exists(dir .. "/" .. name)
      if not ok then
        return unavailable(("the driver's %s is missing beside %s%s")
          :format(name, driver_py, why and ": " .. why or ""))
      end
    end
  end
  local info, perr = probe.report(python, modules, wait, owner, dir)
  if not info then
    return nil, perr
  end

  local ro = M.readonly_paths(info, sb.bind_pth_paths)
  local spec = {
    bwrap = bwrap,
    python = info.executable,
    driver = driver_py,
    driver_modules = M.driver_modules,
    driver_zip = info.driver_zip,
    driver_pyc = info.driver_pyc,
    ro = ro,
    context = context_data,
    max_line = sb.max_message_bytes,
    max_rss = opts.max_rss_bytes,
    rss_interval_ms = sb.rss_poll_interval_ms,
    cgroup = sb.memory_cgroup,
    workdir_bytes = sb.workdir_max_bytes,
    workdir_files = sb.workdir_max_files,
    uid_first = sb.uids.first,
    uid_count = sb.uids.count,
  }
  -- Paths of the host the sandbox must not show: the working directory and
  -- where the driver lives. One above what is bound (/, /usr) is shown by
  -- design.
  local absent = {}
  for _, here in pairs({ cwd() or false, driver_py:match("^(.*)/[^/]*$") or false }) do
    for _, path in ipairs(ro) do
      if here and (here == "/" or path:sub(1, #here + 1) == here .. "/") then
        here = nil
      end
    end
    absent[#absent + 1] = here or nil
  end
  return spec, { sys_path = M.sys_path(info, sb.bind_pth_paths), absent = absent }
end


-- rlm.core's spawn (csrc/spawn.c: bubblewrap around the driver), then the
-- given lines at once: they wait in the pipe while bubblewrap and the
-- interpreter start. Returns drv | nil, message.
function M.start(spec, lines)
  local drv, err = core.spawn(spec)
  if not drv then
    return nil, err
  end
  for _, line in ipairs(lines) do
    if not drv:send(line) then
      drv:close()
      return nil, "the driver took no input"
    end
  end
  return drv
end

-- Moves every sandbox process into its memory cgroup: true, or false and
-- whether the sandbox died meanwhile (else the kernel refused the move).
function M.adopt(drv)
  if drv:adopt() then
    return true
  end
  return false, not drv:interpreter_runs()
end

-- What the host reads of a running sandbox's processes from /proc: the
-- rows of /proc/<pid>/limits for the rlimits of rlm.sandbox.selftest.
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

-- check_uids(pids, want) -> nil | "what is wrong": every sandbox process,
-- as the host sees it (/proc/<pid>/status), runs with real, effective, saved
-- and filesystem uid and gid `want` (the sandbox's uid on a root host, the
-- host's own otherwise), and never as 0 when the host is root. Checked here
-- because inside, bwrap's nested user namespace shows only its own ids.
local function check_uids(pids, want)
  local problems = {}
  for _, pid in ipairs(pids) do
    local text = util.read_file("/proc/" .. pid .. "/status") -- nil: it has gone
    for _, key in ipairs({ "Uid", "Gid" }) do
      local ids = (text or ""):match("\n" .. key .. ":%s*([%d%s]-)\n")
      local seen = {}
      for id in (ids or ""):gmatch("%d+") do
        seen[#seen + 1] = tonumber(id)
      end
      local fine = #seen == 4
      for _, id in ipairs(seen) do
        fine = fine and id == want and id ~= 0
      end
      if text and not fine then
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
local function check_rlimits(pid, wanted)
  local text = util.read_file("/proc/" .. pid .. "/limits")
  if not text then
    return "cannot read /proc/" .. pid .. "/limits"
  end
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

local function uid_error(tree, uid)
  local problem = check_uids(tree, uid)
  if problem then
    return "sandbox_violation", "the sandbox runs as the wrong uid: " .. problem
  end
end

local function fd_error(foreign)
  if #foreign > 0 then
    return "sandbox_violation", "descriptors reach the sandbox: " .. table.concat(foreign, "; ")
  end
end

-- The uids of every process (a uid cannot change without a capability no
-- sandbox process holds, so a tree that is the same later runs as checked
-- here), and the descriptors of bubblewrap's processes: they hold what
-- they will hold (it opens nothing once the driver runs); the interpreter
-- is checked again after ready (check_ready), once it has let go of its
-- context's memfd. Returns the pids, or nil (it died), or nil, kind,
-- message.
function M.vet_processes(drv)
  local tree = drv:tree()
  if #tree == 0 then
    return nil
  end
  local kind, message = uid_error(tree, drv:uid())
  if kind then
    return nil, kind, message
  end
  local foreign = {}
  for i = 1, #tree - 1 do
    for _, f in ipairs(drv:foreign_fds(tree[i])) do
      foreign[#foreign + 1] = f
    end
  end
  kind, message = fd_error(foreign)
  if kind then
    return nil, kind, message
  end
  return tree
end

-- The checks after ready, read from /proc: the driver's rlimits, and every
-- process runs as the sandbox's uid or, for a sandbox vetted before
-- (`vetted_tree`), is one of the processes vetted; then no descriptor but
-- the session's pipes reaches the sandbox. nil, or kind, message.
function M.check_ready(drv, rlimits, vetted_tree)
  local tree = drv:tree()
  if vetted_tree and table.concat(tree, " ") ~= table.concat(vetted_tree, " ") then
    return "sandbox_violation", ("the sandbox's processes changed since the pool checked them "
      .. "(pids %s, now %s)"):format(table.concat(vetted_tree, " "), table.concat(tree, " "))
  end
  local problem = "the sandbox has no processes"
  if #tree > 0 then
    problem = check_rlimits(tree[#tree], rlimits)
  end
  if problem then
    return "sandbox_violation", "the driver's rlimits are not set: " .. problem
  end
  if not vetted_tree then
    local kind, message = uid_error(tree, drv:uid())
    if kind then
      return kind, message
    end
  end
  -- After ready: a pooled driver holds its context's memfd until then.
  -- (Of a vetted sandbox, bubblewrap's processes were checked before.)
  return fd_error(drv:foreign_fds(vetted_tree and tree[#tree] or nil))
end

-- The option { backend = "bubblewrap" } has no other field.
M.FIELDS = shape.with({ backend = { checks.backend_name } })

function M.check_option(where, v, level)
  checks.fields(where, "sandbox", v, M.FIELDS, level + 1, ' for backend "bubblewrap"')
end

function M.read_option(v)
  return shape.read(v, { backend = "bubblewrap" })
end

function M.describe()
  return { backend = "bubblewrap", mode = "bubblewrap", not_promised = {} }
end

-- Bubblewrap's own words on a failed start: what to change (rlm.diagnose).
function M.exit_hint(output)
  return require("rlm.diagnose").hint(output)
end

return M
