-- The exec backend (the contract: rlm.sandbox.backend): the sandbox on the
-- far side of a byte stream. The host starts `sandbox.argv` as a local
-- process with no sandbox of its own (sh -c 'cat | rlm-keeper | cat',
-- podman exec -i, kubectl exec -i pod -- rlm-keeper) and speaks the
-- stream protocol with rlm-keeper at its end (docs/protocol.md, "The
-- stream"): the driver's lines and the keeper's own on channels of their
-- own, the context as raw bytes. It relies on nothing but the stream: the
-- checks only the far side can make come from the keeper, and a missing
-- or failed one fails the start (sandbox_violation).
local core = require("rlm.core")
local checks = require("rlm.base.checks")
local errors = require("rlm.base.errors")
local json = require("rlm.base.json")
local protocol = require("rlm.base.protocol")
local selftest = require("rlm.sandbox.selftest")
local util = require("rlm.base.util")
local bwrap = require("rlm.sandbox.bwrap")
local shape = require("rlm.sandbox.shape")
local stream = require("rlm.sandbox.stream")
local release = stream.release

local M = {}

M.KEEPER_PROTOCOL = stream.KEEPER_PROTOCOL

-- The sandboxes a session accepts of a keeper unless `sandbox.allow` names
-- more: bubblewrap alone (the ones a keeper may make: rlm.sandbox.stream).
-- The seccomp fallback (no namespaces: docs/security.md) must be asked
-- for; "none", or a name the host does not know, is never accepted.
M.SANDBOXES = stream.SANDBOXES
M.DEFAULT_ALLOW = { "bubblewrap" }

-- What the keeper must report, ok, before the driver's ready.
M.CHECKS = { "memory_cgroup", "uids", "rlimits", "descriptors", "confinement", "context_sealed" }

M.BACKSTOP_MS, M.PING_MS = stream.BACKSTOP_MS, stream.PING_MS

-- A ping left unanswered this long is a lost stream, unless
-- `sandbox.ping_timeout_ms` says otherwise (rlm.sandbox.stream).
M.PING_TIMEOUT_MS = 10000

-- What one start needs free on the host: the stream's loop, its three
-- pipes and the session's waitset.
local SESSION_FDS = 40

local function unavailable(message)
  return nil, errors.new("sandbox_unavailable", message)
end

-- The longest a keeper lingers after its stream ends (its own bound too).
M.LINGER_MAX_MS = 600000

-- The keeper's start message: the session's limits, and what the
-- pool-level configure holds (the keeper sends configure and self_test
-- itself, with its interpreter's sys.path and its own canaries); with
-- `linger` ({ ms, id, token, fence }: rlm.sandbox.linger), the keeper
-- outlives its stream for ms (docs/protocol.md, "Lingering").
function M.start_message(o, linger)
  local sb = o.sandbox
  return json.encode({ linger = linger,
    sandboxes = sb.allow or M.DEFAULT_ALLOW,
    type = "start", protocol = M.KEEPER_PROTOCOL,
    max_message_bytes = sb.max_message_bytes, max_message_values = protocol.max_values(sb.max_message_bytes),
    guardrails = o.guardrails, int_bits = json.INT_BITS,
    allowed_modules = sb.allowed_modules, rlimits = selftest.pool_rlimits(),
    modules = util.append({}, bwrap.default_modules, sb.allowed_modules), bind_pth_paths = sb.bind_pth_paths,
    max_rss_bytes = o.max_rss_bytes, rss_poll_interval_ms = sb.rss_poll_interval_ms,
    workdir_max_bytes = sb.workdir_max_bytes, workdir_max_files = sb.workdir_max_files,
    memory_cgroup = sb.memory_cgroup, uid_first = sb.uids.first, uid_count = sb.uids.count,
  })
end

-- The start message `text` (start_message's) with the driver's
-- PYTHONHASHSEED, a journaled session's (spec.hash_seed, set by
-- rlm.engine.boot after prepare): its last field.
function M.seeded(text, hash_seed)
  if not hash_seed then
    return text
  end
  return text:sub(1, -2) .. (',"hash_seed":%d}'):format(hash_seed)
end

-- The option (rlm.sandbox.backend.check_option): { backend = "exec",
-- argv = { program, args... } | connect = { host =, port =, token = } |
-- claim = fn, release = fn, allow =, ping_timeout_ms = }.
local ARGV_WANT = "a list of 1 to 256 non-empty strings without NUL (the program first)"
local argv_list = checks.list(1, 256, checks.argument, ARGV_WANT)

-- A listening keeper's address and its token (rlm-keeper --listen,
-- docs/backends.md): an IP literal (names are not looked up: a pod's
-- address is one), a port, and the 32 hex digits of its --token-file.
local CONNECT_WANT = "{ host = an IPv4 or IPv6 address, port = 1 to 65535, token = 32 of [0-9a-f] }"
local function ip_literal(host)
  if type(host) ~= "string" then
    return false
  end
  local a, b, c, d = host:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
  if a then
    return tonumber(a) < 256 and tonumber(b) < 256 and tonumber(c) < 256 and tonumber(d) < 256
  end
  return #host >= 2 and #host <= 45 and host:find(":", 1, true) ~= nil and host:find("^[%x:%.]+$") ~= nil
end
local function connect_table(v)
  if type(v) ~= "table" then
    return false, CONNECT_WANT
  end
  for k in pairs(v) do
    if k ~= "host" and k ~= "port" and k ~= "token" then
      return false, CONNECT_WANT
    end
  end
  local port, token = v.port, v.token
  return ip_literal(v.host) and type(port) == "number" and port == math.floor(port) and port >= 1
    and port <= 65535 and type(token) == "string" and #token == 32 and token:find("^[0-9a-f]+$") ~= nil,
    CONNECT_WANT
end
M.connect_table = connect_table
M.FIELDS = shape.with({
  backend = { checks.backend_name },
  argv = { argv_list },
  connect = { connect_table },
  claim = { checks.callable },
  release = { checks.callable },
  allow = { checks.list(1, 2, function(name)
    return name == "bubblewrap" or name == "seccomp"
  end, 'a list of the sandboxes the far side may make: "bubblewrap" and/or "seccomp"') },
  ping_timeout_ms = { checks.integer(100, 3600000) },
  linger_ms = { checks.integer(1, M.LINGER_MAX_MS) },
  attach_argv = { argv_list },
})

function M.check_option(where, v, level)
  checks.fields(where, "sandbox", v, M.FIELDS, level + 1, (" for backend %q"):format(v.backend))
  local given = {}
  for _, name in ipairs({ "argv", "connect", "claim" }) do
    if v[name] ~= nil then
      given[#given + 1] = name
    end
  end
  if #given == 0 then
    error(("%s: option 'sandbox.argv' must be %s, or option 'sandbox.connect' or 'sandbox.claim' given, got nil")
      :format(where, ARGV_WANT), level + 1)
  elseif #given > 1 then
    error(("%s: options 'sandbox.%s' and 'sandbox.%s' exclude each other: one says how the stream is reached%s")
      :format(where, given[1], given[2], v.claim ~= nil and " (the claim gives an argv or a connect)" or ""),
      level + 1)
  elseif v.release ~= nil and v.claim == nil then
    error(("%s: option 'sandbox.release' needs option 'sandbox.claim'"):format(where), level + 1)
  elseif v.connect ~= nil and v.linger_ms ~= nil and v.attach_argv == nil then
    -- no argv to put --attach after: say where the keeper is reached again
    error(("%s: option 'sandbox.linger_ms' with option 'sandbox.connect' needs option 'sandbox.attach_argv' "
      .. "(kubectl exec -i POD -- rlm-keeper --attach)"):format(where), level + 1)
  end
end

-- The sandboxes v allows, sorted, the default filled in.
function M.allowed(v)
  local allow = {}
  for i, name in ipairs(v.allow or M.DEFAULT_ALLOW) do
    allow[i] = name
  end
  table.sort(allow)
  return allow
end

-- The option as this backend reads it, defaults filled in (a pool's
-- sessions must give the same).
function M.read_option(v)
  return shape.read(v, { backend = "exec", argv = v.argv, connect = v.connect, claim = v.claim, release = v.release,
    allow = M.allowed(v), ping_timeout_ms = v.ping_timeout_ms or M.PING_TIMEOUT_MS, linger_ms = v.linger_ms,
    attach_argv = v.attach_argv })
end

-- argv with its program found (a name on PATH, or a path): the list, or
-- nil and why not (what names it says where it came from).
local function resolve(argv, what)
  local out = util.append({}, argv)
  local program = core.find_program(out[1])
  if not program then
    return nil, ("the exec backend's program %q (%s[1]) was not found"):format(out[1], what)
  end
  out[1] = program
  return out
end

-- The start's spec: the stream's argv (none yet where a claim gives it),
-- the keeper's start, the context (nil for a pool's), and what a claim
-- needs.
function M.prepare(opts, context_data)
  local free = core.fd_headroom(SESSION_FDS)
  if free < SESSION_FDS then
    return unavailable(("too few free file descriptors (EMFILE): %d free, a session needs %d to start")
      :format(free, SESSION_FDS))
  end
  local sandbox = opts.sandbox
  local argv
  if sandbox.argv then
    local why
    argv, why = resolve(sandbox.argv, "option 'sandbox.argv'")
    if not argv then
      return unavailable(why)
    end
  end
  local allow = {}
  for _, name in ipairs(sandbox.allow or M.DEFAULT_ALLOW) do
    allow[name] = true
  end
  return { argv = argv, connect = sandbox.connect, claim = sandbox.claim, release = sandbox.release,
    context = context_data, start = M.start_message(opts), max_line = sandbox.max_message_bytes + 1, opts = opts,
    start_timeout_ms = sandbox.start_timeout_ms,
    ping_timeout_ms = sandbox.ping_timeout_ms or M.PING_TIMEOUT_MS, allow = allow }, { sys_path = {}, absent = {} }
end


-- spec for one start with what `sandbox.claim` gave (an argv, or a
-- connect table; and handle, the value release gets: what it gave when it
-- gave none); report(message) is told of a release that fails. Returns the
-- spec, or nil and why (the claim is released then).
function M.claimed(spec, argv, handle, report)
  local claim = { release = spec.release, handle = handle == nil and argv or handle, report = report }
  local out = {}
  for k, v in pairs(spec) do
    out[k] = v
  end
  out.claim_of = claim
  local why
  if type(argv) == "table" and argv[1] == nil and next(argv) ~= nil then
    if connect_table(argv) then
      out.connect = argv
    else
      why = ("option 'sandbox.claim' returned %s, not %s"):format(checks.describe(argv), CONNECT_WANT)
    end
  elseif not argv_list(argv) then
    why = ("option 'sandbox.claim' returned %s, not %s, or %s"):format(checks.describe(argv), ARGV_WANT,
      CONNECT_WANT)
  else
    out.argv, why = resolve(argv, "what option 'sandbox.claim' returned")
  end
  if why then
    release(claim)
    return nil, why
  end
  return out
end

-- A claimed spec that will not be started (its pool closed meanwhile).
function M.release_claim(spec)
  release(spec.claim_of)
end

function M.forget() end

-- rlm.core's stream, the keeper's start at once, and the context after
-- it for a cold start (a pooled one's comes when a session takes it):
-- the lines wait in the pipe while the far side starts. The host's
-- configure and self_test (`lines`) are not sent: the keeper makes its own.
function M.start(spec)
  local drv, err
  local c = spec.connect
  if c then
    drv, err = core.stream_connect(c.host, c.port, c.token, spec.max_line, math.ceil(spec.start_timeout_ms))
  else
    drv, err = core.stream(spec.argv, spec.max_line)
  end
  if not drv then
    release(spec.claim_of)
    return nil, err
  end
  local h = stream.handle(drv, spec)
  local ok, werr = drv:send_keeper(M.seeded(spec.start, spec.hash_seed))
  if ok and spec.context then
    ok, werr = h:write_context(spec.context)
  end
  if not ok then
    h:close()
    return nil, werr or "the stream took no input"
  end
  return h
end

-- The far side moves its own processes into their memory cgroup and
-- reports it with its checks (check_ready).
function M.adopt()
  return true
end

-- Nothing of a far sandbox is seen from here before its ready: the pool's
-- vet has no tree to keep, and check_ready reads the keeper's checks.
function M.vet_processes()
  return {}
end

function M.check_ready(h)
  local reported = h.checks
  if not reported then
    return "sandbox_violation", "rlm-keeper reported no checks before the driver's ready"
  end
  local bad = {}
  for _, name in ipairs(M.CHECKS) do
    local c = reported[name]
    if type(c) ~= "table" then
      bad[#bad + 1] = name .. " (not reported)"
    elseif c.ok ~= true then
      bad[#bad + 1] = ("%s (%s)"):format(name, tostring(c.detail))
    end
  end
  if #bad > 0 then
    return "sandbox_violation", "the far side's checks failed: " .. table.concat(bad, "; ")
  end
end

-- What the seccomp fallback does not promise, by the bubblewrap check it
-- has no counterpart of: the session's result and sandbox_ready event say
-- it (docs/security.md, "The fallback").
local NOT_PROMISED = {
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

-- The mode the keeper said it makes (its hello), which the self-test is
-- checked against, and what that mode does not promise.
function M.describe(h)
  local hello = h.hello or {}
  return { backend = "exec", mode = h.sandbox, detail = type(hello.detail) == "string" and hello.detail or nil,
    not_promised = NOT_PROMISED[h.sandbox] or {} }
end

function M.exit_hint()
  return ""
end

return M
