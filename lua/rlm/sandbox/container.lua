-- The container backends, "podman" and "docker" (the contract:
-- rlm.sandbox.backend): a container of the sandbox image for each sandbox,
-- started by the engine with the boundary's flags (docs/backends.md), and
-- rlm-keeper in it at the far end of exec's stream. This module only
-- builds the command line and looks after the containers it names (the
-- names and whose they are: rlm.sandbox.container_names); the stream, the
-- keeper's protocol and its checks are rlm.sandbox.exec's.
--
-- No container outlives its session: each is named (the `name` prefix,
-- this host's boot, pid and start time, a token of this Lua state and a
-- count), `--rm` removes it when rlm-keeper ends at the end of its input,
-- and a remover outside the stream's process group removes it by that name
-- when the engine's client ends any other way (killed by the host's
-- teardown, or the container stuck). The first start of a Lua state removes
-- the containers its prefix names whose host is gone (killed before its
-- teardown ran), and no other: the names are the engine's list of what it
-- runs, made by hosts, never by the sandbox.
local core = require("rlm.core")
local checks = require("rlm.base.checks")
local errors = require("rlm.base.errors")
local util = require("rlm.base.util")
local exec = require("rlm.sandbox.exec")
local engine = require("rlm.sandbox.container_engine")
local names = require("rlm.sandbox.container_names")
local shape = require("rlm.sandbox.shape")

local M = {}

-- The image `make image` builds (its tag is rlm's version,
-- rlm.base.version), and where rlm-keeper is in it.
M.IMAGE = "localhost/rlm-sandbox:" .. require("rlm.base.version")
M.KEEPER = "/usr/local/bin/rlm-keeper"
M.NAME = "rlm"

-- The container's memory limit is max_rss_bytes and this: the keeper,
-- bubblewrap's two processes and the image's files in the page cache
-- (reclaimable, but charged), beside what the keeper's own poll lets the
-- REPL reach before it kills (its overshoot): past the container's limit
-- the kernel kills inside the container, which reads as a lost sandbox,
-- not memory_limit.
M.HEADROOM_BYTES = 64 * 2 ^ 20
M.HEADROOM_SHARE = 0.25

-- Processes of the whole container: the REPL's RLIMIT_NPROC (64,
-- rlm.sandbox.selftest) and the keeper, bubblewrap's two and room.
M.PIDS_LIMIT = 128

-- The rlimits an engine's --ulimit takes.
M.ULIMIT_NAMES = { "as", "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile",
  "nproc", "rss", "rtprio", "rttime", "sigpending", "stack" }
local ULIMIT_NAME = {}
for _, n in ipairs(M.ULIMIT_NAMES) do
  ULIMIT_NAME[n] = true
end

-- A word that cannot be read as a flag where the engine expects a value.
local function value_word(v)
  return type(v) == "string" and v ~= "" and not v:find("\0", 1, true) and v:sub(1, 1) ~= "-"
end

local function words(max)
  return checks.list(0, max, checks.argument, ("a list of 0 to %d non-empty strings without NUL"):format(max))
end

-- The option's fields (beside exec's allow and ping_timeout_ms).
M.FIELDS = shape.with({
  backend = { checks.backend_name },
  image = { function(v)
    return value_word(v), "an image's name (a non-empty string, not starting with '-')"
  end },
  engine = { function(v)
    return checks.argument(v), "the engine's program: a name on PATH or a path"
  end },
  global_args = { words(64) },
  runtime = { function(v)
    return value_word(v), "an OCI runtime's name or path (\"runc\", \"crun\"; not starting with '-')"
  end },
  ulimits = { function(v)
    local want = "a table of rlimit names (" .. table.concat(M.ULIMIT_NAMES, ", ")
      .. ") to integers from 0 to 2^53 - 1 (soft and hard)"
    if type(v) ~= "table" then
      return false, want
    end
    for k, n in pairs(v) do
      if not ULIMIT_NAME[k] or type(n) ~= "number" or n ~= math.floor(n) or n < 0 or n > 2 ^ 53 - 1 then
        return false, want
      end
    end
    return true, want
  end },
  extra_args = { words(256) },
  name = { function(v)
    return type(v) == "string" and #v <= 64 and v:match("^[%w][%w_.-]*$") ~= nil,
      "a container name prefix of 1 to 64 letters, digits, '_', '.', '-' (a letter or digit first)"
  end },
  seccomp_profile = { function(v)
    return v == false or checks.argument(v), "a seccomp profile's path, or false (the engine's own profile)"
  end },
  pids_limit = { checks.integer(16, 2 ^ 22) },
  keeper = { function(v)
    return checks.argument(v) and v:sub(1, 1) == "/", "rlm-keeper's absolute path in the image"
  end },
  allow = exec.FIELDS.allow,
  ping_timeout_ms = exec.FIELDS.ping_timeout_ms,
})

function M.check_option(where, v, level)
  checks.fields(where, "sandbox", v, M.FIELDS, level + 1, (" for backend %q"):format(v.backend))
end

-- The option with its defaults filled in: what a pool's session must give
-- the same of.
function M.read_option(v)
  local ulimits = {}
  for k, n in pairs(v.ulimits or {}) do
    ulimits[k] = n
  end
  return shape.read(v, { backend = v.backend, image = v.image or M.IMAGE, engine = v.engine or v.backend,
    global_args = v.global_args or {}, runtime = v.runtime or false, ulimits = ulimits,
    extra_args = v.extra_args or {}, name = v.name or M.NAME,
    seccomp_profile = v.seccomp_profile == nil and true or v.seccomp_profile,
    pids_limit = v.pids_limit or M.PIDS_LIMIT, keeper = v.keeper or M.KEEPER, allow = exec.allowed(v),
    ping_timeout_ms = v.ping_timeout_ms or exec.PING_TIMEOUT_MS })
end

local function unavailable(message)
  return nil, errors.new("sandbox_unavailable", message)
end

-- A path made absolute against the working directory (the engine runs
-- from a directory of its own).
local function absolute(path)
  if path:sub(1, 1) == "/" then
    return path
  end
  local pwd = os.getenv("PWD")
  return pwd and pwd:sub(1, 1) == "/" and pwd .. "/" .. path or nil
end

-- The seccomp profile that lets bubblewrap make its namespaces in the
-- container (sandbox/image/seccomp.py made it from Podman's): installed
-- beside the modules (rlm/rlm-seccomp.json), or a checkout's
-- sandbox/rlm-seccomp.json.
function M.default_profile()
  local here = util.module_dir()
  for _, candidate in ipairs({ here .. "/rlm-seccomp.json", here .. "/../../sandbox/rlm-seccomp.json" }) do
    if util.file_exists(candidate) then
      return absolute(candidate)
    end
  end
  return nil
end

-- sh quoting: the script below is made of these words only.
local q, quoted = util.shell_quote, util.shell_words

-- The whole `run` of one container named `name`.
local function run_argv(c, name)
  -- Podman's passthrough: the container's stdin and stdout are the
  -- stream's own pipes, with no conmon between (a step's round trip 80 us
  -- here, 330 through conmon), and nothing of the session written to a
  -- log on the host's disk (k8s-file, Podman's default, would); Docker's
  -- none keeps no log either.
  local a = { "run", "-i", "--rm", "--name", name, "--log-driver=" .. (c.backend == "podman" and "passthrough"
    or "none"), "--network=none", "--read-only" }
  if c.memory then
    util.append(a, { "--memory", ("%.0f"):format(c.memory), "--memory-swap", ("%.0f"):format(c.memory) })
  end
  util.append(a, { "--pids-limit", tostring(c.pids_limit), "--cap-drop=ALL", "--security-opt",
    "no-new-privileges" })
  if c.backend == "docker" and c.runtime then
    util.append(a, { "--runtime", c.runtime })
  end
  for _, n in ipairs(M.ULIMIT_NAMES) do
    local v = c.ulimits[n]
    if v then
      util.append(a, { "--ulimit", ("%s=%.0f:%.0f"):format(n, v, v) })
    end
  end
  if c.profile then
    -- What bubblewrap needs inside: /proc unmasked (a user namespace mounts
    -- a new procfs only where no part of the container's is covered), and
    -- the profile that allows its namespaces (docs/backends.md).
    util.append(a, { "--security-opt", c.backend == "podman" and "unmask=/proc/*" or "systempaths=unconfined",
      "--security-opt", "seccomp=" .. c.profile })
  end
  util.append(a, c.extra_args, { c.image, c.keeper }, c.keeper_args)
  return engine.argv(c, a)
end

-- The stream's argv for one container: sh, which runs the engine's client
-- from a directory of its own (Debian 12's conmon leaves a file `oom` in
-- its working directory: containers/conmon#504), its stdin and stdout the
-- stream's; beside it, in a session of its own (the host's teardown kills
-- the stream's process group), the remover, which waits for the client's
-- end and removes the container by its name unless the client ended with
-- status 0 (the keeper ended, and --rm removed it), then the directory.
function M.stream_argv(c, name)
  local remover = 'read st; [ "$st" = 0 ] || ' .. quoted(engine.argv(c, engine.rm_args(c, { name })))
    .. '; cd / && rm -rf "$1"; exit "${st:-137}"'
  local script = table.concat({
    "d=$(mktemp -d " .. q(c.tmpdir .. "/rlm-" .. c.backend .. ".XXXXXX") .. ") || exit 125",
    'cd "$d" || exit 125',
    "exec 5>&1",
    "{ " .. quoted(run_argv(c, name)) .. ' 4>&-; echo "$?" >&4; } 4>&1 >&5 5>&- | ' .. q(c.setsid) .. " "
      .. q(c.sh) .. " -c " .. q(remover) .. ' sh "$d" >/dev/null 2>&1 5>&-',
  }, "\n")
  return { c.sh, "-c", script }
end

-- prepare: the engine, sh and setsid found, the profile, the sweep of the
-- first start, and exec's spec with what each start's command line needs.
-- The engine's commands here (the sweep's ps and rm) share one
-- start_timeout_ms, from the prepare: a hung engine ends the start then
-- (sandbox_unavailable), and the spawn's own start_timeout_ms follows.
function M.prepare(opts, context_data, wait)
  local v = opts.sandbox
  local r = M.read_option(v)
  local c = { backend = r.backend, image = r.image, global_args = r.global_args, runtime = r.runtime or nil,
    ulimits = r.ulimits, extra_args = r.extra_args, name = r.name, pids_limit = r.pids_limit, keeper = r.keeper,
    tmpdir = absolute(r.tmpdir), keeper_args = {}, start_timeout_ms = r.start_timeout_ms }
  c.deadline = core.now_ms() + c.start_timeout_ms
  if not names.owner() then
    return unavailable("this host's boot id or its own /proc/self/stat could not be read: the containers "
      .. "could not be named")
  end
  if not c.tmpdir then
    return unavailable(("option 'sandbox.tmpdir' (%s) is not a path the engine can run from"):format(r.tmpdir))
  end
  c.engine = core.find_program(r.engine)
  if not c.engine then
    return unavailable(("the %s engine's program %q (option 'sandbox.engine') was not found"):format(r.backend,
      r.engine))
  end
  c.engine = absolute(c.engine) or c.engine
  c.sh, c.setsid = core.find_program("sh"), core.find_program("setsid")
  if not c.sh or not c.setsid then
    return unavailable(("%s was not found: the %s backend runs its client through it"):format(
      c.sh and "setsid (util-linux)" or "sh", r.backend))
  end
  if r.seccomp_profile == true then
    c.profile = M.default_profile()
    if not c.profile then
      return unavailable("the seccomp profile rlm-seccomp.json was found neither beside the rlm modules nor in "
        .. "a checkout's sandbox/ (option 'sandbox.seccomp_profile' names one)")
    end
  elseif r.seccomp_profile then
    c.profile = absolute(r.seccomp_profile)
    local ok, why = util.file_exists(c.profile or "")
    if not ok then
      return unavailable(("the seccomp profile %q (option 'sandbox.seccomp_profile') cannot be read%s")
        :format(r.seccomp_profile, why and ": " .. why or ""))
    end
  end
  if opts.max_rss_bytes > 0 then
    c.memory = opts.max_rss_bytes + math.max(M.HEADROOM_BYTES, math.floor(opts.max_rss_bytes * M.HEADROOM_SHARE))
  end
  -- The keeper's own flags for what the session names on the far side.
  if r.python ~= "python3" then
    util.append(c.keeper_args, { "--python", r.python })
  end
  if r.bwrap ~= "bwrap" then
    util.append(c.keeper_args, { "--bwrap", r.bwrap })
  end
  local ok, err = engine.sweep(c, wait)
  if not ok then
    return nil, err
  end
  local eopts = setmetatable({ sandbox = shape.read(r, { backend = "exec", argv = { c.sh }, allow = r.allow,
    ping_timeout_ms = r.ping_timeout_ms }) }, { __index = opts })
  local spec, info = exec.prepare(eopts, context_data)
  if not spec then
    return nil, info
  end
  spec.container = c
  return spec, info
end

M.forget = exec.forget

-- exec's start over a new container's command line.
function M.start(spec, lines)
  local name = names.next(spec.container.name)
  local one = {}
  for k, val in pairs(spec) do
    one[k] = val
  end
  one.argv = M.stream_argv(spec.container, name)
  local h, err = exec.start(one, lines)
  if h then
    h.container, h.engine_backend, h.exit_hint = name, spec.container.backend, M.exit_hint
  end
  return h, err
end

M.adopt = exec.adopt
M.vet_processes = exec.vet_processes
M.check_ready = exec.check_ready

-- What an engine's failed start says about the host, and the fields that
-- fix it (docs/backends.md, "On a host like this one"): a pattern of the
-- engine's or runtime's words, and what to set. One row a host problem.
M.HINTS = {
  { "setting rlimit type %d+: operation not permitted",
    "the OCI runtime could not raise an rlimit to what the engine asks, above this host's cap: set "
      .. "sandbox.ulimits (e.g. { nofile = 1024, nproc = 1024 }) and, where crun refuses the host's "
      .. "cgroups, sandbox.runtime = \"runc\"" },
  { "cgroups in hybrid mode not supported",
    "crun does not run on this host's cgroup layout: set sandbox.runtime = \"runc\" (and sandbox.ulimits "
      .. "where runc cannot set an rlimit)" },
}
function M.exit_hint(output)
  for _, row in ipairs(M.HINTS) do
    if tostring(output or ""):find(row[1]) then
      return ("; %s (docs/backends.md, \"On a host like this one\")"):format(row[2])
    end
  end
  return ""
end

-- exec's, with the backend's name and the container's.
function M.describe(h)
  local d = exec.describe(h)
  d.backend, d.container = h.engine_backend, h.container
  return d
end

return M
