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

local M = {}

M.KEEPER_PROTOCOL = 1

-- The sandboxes a keeper may make (its hello's "sandbox"), and the ones a
-- session accepts unless `sandbox.allow` names more: bubblewrap alone.
-- The seccomp fallback (no namespaces: docs/security.md) must be asked
-- for; "none", or a name the host does not know, is never accepted.
M.SANDBOXES = { bubblewrap = true, seccomp = true }
M.DEFAULT_ALLOW = { "bubblewrap" }

-- What the keeper must report, ok, before the driver's ready.
M.CHECKS = { "memory_cgroup", "uids", "rlimits", "descriptors", "confinement", "context_sealed" }

-- Past the step's hard deadline (the keeper's to enforce), the host kills
-- a stream that has said nothing: its own backstop.
M.BACKSTOP_MS = 2000

-- The stream's heartbeat (rlm.core's d:heartbeat): a ping on the
-- keeper's channel after PING_MS of quiet, from the driver's hello on (the
-- start before it is sandbox.start_timeout_ms's); a ping left unanswered for
-- `sandbox.ping_timeout_ms` is a lost stream. A relay may outlive the far
-- side and hold the host's pipe open (sh -c 'cat | rlm-keeper | cat' does:
-- its first cat learns of the keeper's death only when it writes), so an
-- end that would otherwise show only at the next write shows at the ping.
M.PING_MS = 1000
M.PING_TIMEOUT_MS = 10000
local PING = '{"type":"ping"}'

-- What one start needs free on the host: the stream's loop, its three
-- pipes and the session's waitset.
local SESSION_FDS = 40

local function unavailable(message)
  return nil, errors.new("sandbox_unavailable", message)
end

-- The keeper's start message: the session's limits, and what the
-- pool-level configure holds (the keeper sends configure and self_test
-- itself, with its interpreter's sys.path and its own canaries).
function M.start_message(o)
  local sb = o.sandbox
  return json.encode({
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

-- The option (rlm.sandbox.backend.check_option): { backend = "exec",
-- argv = { program, args... } | claim = fn, release = fn, allow =,
-- ping_timeout_ms = }.
local ARGV_WANT = "a list of 1 to 256 non-empty strings without NUL (the program first)"
local argv_list = checks.list(1, 256, checks.argument, ARGV_WANT)
M.FIELDS = shape.with({
  backend = { checks.backend_name },
  argv = { argv_list },
  claim = { checks.callable },
  release = { checks.callable },
  allow = { checks.list(1, 2, function(name)
    return name == "bubblewrap" or name == "seccomp"
  end, 'a list of the sandboxes the far side may make: "bubblewrap" and/or "seccomp"') },
  ping_timeout_ms = { checks.integer(100, 3600000) },
})

function M.check_option(where, v, level)
  checks.fields(where, "sandbox", v, M.FIELDS, level + 1, (" for backend %q"):format(v.backend))
  if v.argv == nil and v.claim == nil then
    error(("%s: option 'sandbox.argv' must be %s, or option 'sandbox.claim' given, got nil"):format(where,
      ARGV_WANT), level + 1)
  elseif v.argv ~= nil and v.claim ~= nil then
    error(("%s: options 'sandbox.argv' and 'sandbox.claim' exclude each other: the claim gives the argv")
      :format(where), level + 1)
  elseif v.release ~= nil and v.claim == nil then
    error(("%s: option 'sandbox.release' needs option 'sandbox.claim'"):format(where), level + 1)
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
  return shape.read(v, { backend = "exec", argv = v.argv, claim = v.claim, release = v.release,
    allow = M.allowed(v), ping_timeout_ms = v.ping_timeout_ms or M.PING_TIMEOUT_MS })
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
  return { argv = argv, claim = sandbox.claim, release = sandbox.release, context = context_data,
    start = M.start_message(opts), max_line = sandbox.max_message_bytes + 1,
    ping_timeout_ms = sandbox.ping_timeout_ms or M.PING_TIMEOUT_MS, allow = allow }, { sys_path = {}, absent = {} }
end

-- A claimed sandbox's release: once, in a coroutine of its own (it may
-- yield as a callback under an adapter does: rlm.base.util.invoke); a
-- failure (a raise, or nil, message) goes to report(message), never to
-- the caller: close() does not raise.
local function release(claim)
  if not claim or claim.released then
    return
  end
  claim.released = true
  if not claim.release then
    return
  end
  util.invoke(claim.release, claim.handle, function(ok, message)
    if not ok and claim.report then
      claim.report(("option 'sandbox.release' failed: %s"):format(tostring(message)))
    end
  end, false)
end

-- spec for one start with what `sandbox.claim` gave (argv, and handle, the
-- value release gets: the argv when it gave none); report(message) is
-- told of a release that fails. Returns the spec, or nil and why (the
-- claim is released then).
function M.claimed(spec, argv, handle, report)
  local claim = { release = spec.release, handle = handle == nil and argv or handle, report = report }
  local out = {}
  for k, v in pairs(spec) do
    out[k] = v
  end
  out.claim_of = claim
  local why
  if not argv_list(argv) then
    why = ("option 'sandbox.claim' returned %s, not %s"):format(checks.describe(argv), ARGV_WANT)
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

-- The handle: the stream (rlm.core's Driver from core.stream) and what the
-- keeper said of itself. Its methods are the ones rlm.sandbox.backend
-- lists.
local Handle = {}
Handle.__index = Handle

function Handle:send(line)
  return self.drv:send(line)
end

function Handle:fd()
  return self.drv:fd()
end

function Handle:timeout()
  return self.drv:timeout()
end

function Handle:wait(ms, token)
  return self.drv:wait(ms, token)
end

function Handle:exec_ms()
  return self.drv:exec_ms()
end

function Handle:alive()
  return not self.ended and self.drv:alive()
end

-- The step's interrupt is the keeper's to send (SIGINT to the driver's
-- interpreter, on the far side).
function Handle:interrupt()
  return self.drv:send_keeper('{"type":"interrupt"}') ~= nil
end

-- The keeper kills at ms; the host kills the stream BACKSTOP_MS later if
-- the keeper has not said so by then.
function Handle:set_deadline(ms)
  ms = math.max(math.floor(ms), 0)
  self.drv:send_keeper(('{"type":"deadline","ms":%d}'):format(ms))
  self.deadline_at = ms > 0 and core.now_ms() + ms or nil
  self.drv:set_deadline(ms > 0 and ms + M.BACKSTOP_MS or 0)
end

function Handle:deadline_passed()
  return self.deadline_at ~= nil and core.now_ms() >= self.deadline_at
end

function Handle:kill()
  self.ended = self.ended or "killed"
  self.drv:kill()
end

function Handle:close()
  self.ended = self.ended or "closed"
  self.drv:close()
  release(self.claim_of)
end

-- Where a failed release of this sandbox is told (the session that took
-- it from a pool, rather than the pool).
function Handle:report_release(report)
  if self.claim_of then
    self.claim_of.report = report
  end
end

function Handle:peak_rss()
  return self.peak
end

function Handle:memory_mechanism()
  return self.mechanism
end

function Handle:oom_kills()
  return self.kills, self.kill_peak
end

-- The context: its message, then its bytes as they are, written from the
-- string itself; the keeper writes them into the driver's memfd and seals
-- it before it reads the next line (load_context).
function Handle:write_context(bytes)
  local ok, err = self.drv:send_keeper(('{"type":"context","bytes":%d}'):format(#bytes))
  if ok then
    ok, err = self.drv:send_raw(bytes)
  end
  if not ok then
    return nil, err
  end
  return true
end

-- Written as soon as it was queued: the stream keeps its order, and the
-- keeper seals the memfd before it reads load_context (context_sealed is
-- one of its checks).
function Handle.context_written()
  return true
end

-- A number of a keeper message; a whole one as an integer where Lua has
-- them (a JSON decoder's 3.0 would read "exit status 3.0").
local function number(v)
  if type(v) ~= "number" then
    return 0
  end
  return v == math.floor(v) and math.floor(v) or v
end

-- A keeper message: nil (noted), or the event it means.
function Handle:_keeper(line)
  local ok, msg = pcall(json.decode, line)
  if not ok or type(msg) ~= "table" or type(msg.type) ~= "string" then
    return { "broken", "rlm-keeper sent a message that is not a JSON object with a type" }
  end
  local t = msg.type
  if not self.hello then
    if t ~= "hello" then
      return { "broken", "the far side's first line is not rlm-keeper's hello" }
    end
    self.hello = msg
    self.hello_at = core.now_ms() -- for bench/'s phases
    if msg.protocol ~= M.KEEPER_PROTOCOL then
      return { "broken", ("rlm-keeper speaks keeper protocol %s, the host %d")
        :format(tostring(msg.protocol), M.KEEPER_PROTOCOL) }
    end
    self.sandbox = msg.sandbox
    if not (M.SANDBOXES[msg.sandbox] and self.allow[msg.sandbox]) then
      -- Nothing of it runs on: the keeper's start refuses it too (the
      -- start lists what the host allows).
      local names = {}
      for name in pairs(self.allow) do
        names[#names + 1] = name
      end
      table.sort(names)
      self.ended = "refused"
      return { "failed", ("rlm-keeper makes a %s sandbox (%s), and the session allows %s "
        .. "(option 'sandbox.allow')"):format(tostring(msg.sandbox), tostring(msg.detail),
        table.concat(names, ", ")) }
    end
    return nil
  elseif t == "checks" then
    self.checks = type(msg.checks) == "table" and msg.checks or {}
    return nil
  elseif t == "pong" then
    return nil -- the heartbeat's answer: C counted its bytes as heard
  end
  self.ended = t
  if t == "exit" then
    self.kills, self.kill_peak = number(msg.oom_kills), number(msg.peak)
    self.peak = math.max(self.peak, number(msg.peak))
    self.mechanism = type(msg.mechanism) == "string" and msg.mechanism or self.mechanism
    return { "exit", number(msg.status), number(msg.signal), type(msg.stderr) == "string" and msg.stderr or "" }
  elseif t == "timeout" or t == "overflow" then
    return { t }
  elseif t == "memory" then
    self.peak = math.max(self.peak, number(msg.peak))
    return { "memory", number(msg.peak) }
  elseif t == "files" then
    self.peak = math.max(self.peak, number(msg.peak))
    return { "files", number(msg.files) }
  elseif t == "failed" then
    return { "failed", "rlm-keeper: " .. tostring(msg.message) }
  end
  return { "broken", ("rlm-keeper sent a message the host does not know (%s)"):format(t) }
end

-- The next event, as rlm.core's poll gives them: the driver's lines, and
-- the keeper's word turned into the events a local sandbox has; an end of
-- the stream the keeper did not announce is "lost".
function Handle:poll(ms, max_values, held)
  while true do
    local kind, a, b, c = self.drv:poll(ms, max_values, held)
    if kind == "keeper" then
      local ev = self:_keeper(a)
      if ev then
        if ev[1] == "broken" or ev[1] == "failed" then
          self.drv:kill()
        end
        return util.unpack(ev)
      end
      ms = 0
    elseif kind == "silent" then
      self.ended = "lost"
      return "lost", ("the far side answered no ping for %d ms (sandbox.ping_timeout_ms): the stream was killed")
        :format(self.ping_timeout_ms), { ping_timeout_ms = self.ping_timeout_ms }
    elseif kind == "garbled" then
      self.ended = "garbled"
      self.drv:kill()
      return "broken", "the stream sent a line on no channel: " .. a:sub(1, 200)
    elseif (kind == "line" or kind == "query" or kind == "dense") and not self.hello then
      self.ended = "garbled"
      self.drv:kill()
      return "broken", "the far side's first line is not rlm-keeper's hello"
    elseif kind == "exit" or kind == "failed" then
      if self.ended and self.ended ~= "killed" and self.ended ~= "closed" then
        return nil -- the keeper said how it ended: that was the event
      end
      if kind == "failed" then
        return "failed", a
      end
      self.ended = "lost"
      local how = b ~= 0 and ("killed by signal " .. b) or ("exit status " .. tostring(a))
      local tail = (c or ""):gsub("%s+$", "")
      return "lost", ("the stream to the sandbox ended (%s, with no word from rlm-keeper)%s")
        :format(how, tail ~= "" and ": " .. tail:sub(-500) or ""), { status = a, signal = b, stderr = c }
    else
      if not self.beating and (kind == "line" or kind == "query" or kind == "dense") then
        -- the driver's first line: the far side has started
        self.beating = true
        self.drv:heartbeat(PING, math.min(M.PING_MS, math.max(math.floor(self.ping_timeout_ms / 2), 1)),
          self.ping_timeout_ms)
      end
      return kind, a, b, c
    end
  end
end

-- rlm.core's stream, the keeper's start at once, and the context after
-- it for a cold start (a pooled one's comes when a session takes it):
-- the lines wait in the pipe while the far side starts. The host's
-- configure and self_test (`lines`) are not sent: the keeper makes its own.
function M.start(spec)
  local drv, err = core.stream(spec.argv, spec.max_line)
  if not drv then
    release(spec.claim_of)
    return nil, err
  end
  local h = setmetatable({ drv = drv, peak = 0, mechanism = "keeper", kills = 0, kill_peak = 0,
    ping_timeout_ms = spec.ping_timeout_ms, allow = spec.allow, claim_of = spec.claim_of }, Handle)
  local ok, werr = drv:send_keeper(spec.start)
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
