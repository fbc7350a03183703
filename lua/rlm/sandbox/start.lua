-- The start of a sandbox, the same for a session's cold start and the
-- pool's spawns: its first messages, the spawn through the backend
-- (rlm.sandbox.backend), and the checks of what the driver says as it
-- starts. Plain functions, not Session methods: rlm.engine.boot and
-- rlm.sandbox.pool share them.
local json = require("rlm.base.json")
local protocol = require("rlm.base.protocol")
local selftest = require("rlm.sandbox.selftest")

local M = {}

local function checks_failed(checks)
  local bad, n = {}, 0
  for name, c in pairs(checks) do
    n = n + 1
    if not c.ok then
      bad[#bad + 1] = name .. " (" .. tostring(c.detail) .. ")"
    end
  end
  table.sort(bad)
  if n == 0 then
    bad[1] = "no checks were reported"
  end
  return bad
end

-- The checks a cold start and the pool's vet make alike, each as nil or
-- the error (kind, message, extra) it ends the session with.
M.CGROUP_REFUSED = "a sandbox process could not be moved into its memory cgroup"

-- mode: the sandbox the backend says it made (backend.describe): the
-- driver's self-test must have run for it and reported every check it
-- promises (rlm.sandbox.selftest.PROMISED).
function M.self_test_error(result, mode)
  local want = selftest.PROMISED[mode]
  if not want or result.mode ~= mode then
    return "sandbox_violation", ("the sandbox self-test ran for a %s sandbox, the backend made %s")
      :format(tostring(result.mode), tostring(mode)), { checks = result.checks }
  end
  local bad = checks_failed(result.checks)
  for _, name in ipairs(want) do
    if type(result.checks[name]) ~= "table" then
      bad[#bad + 1] = name .. " (not reported)"
    end
  end
  if #bad > 0 then
    return "sandbox_violation", "the sandbox self-test failed: " .. table.concat(bad, "; "),
      { checks = result.checks }
  end
end

-- The driver's own stamps (seconds on CLOCK_MONOTONIC): diagnostics for
-- bench/ only, never trusted for anything else.
function M.driver_stamps(t)
  if type(t) ~= "table" or type(t[1]) ~= "number" or type(t[2]) ~= "number" then
    return nil
  end
  return { t[1] * 1000, t[2] * 1000 }
end

-- A hello the host can talk to: nil, or why not (protocol_error).
function M.hello_problem(hello)
  if hello.protocol ~= protocol.VERSION then
    return ("the driver speaks protocol %s, the host %d"):format(tostring(hello.protocol), protocol.VERSION)
  end
end

-- What a line of a pooled sandbox's start says: its message, or nil and
-- why it is a protocol_error (as wire's _driver_message words it).
local function line_message(line, allowed, max_values)
  local msg, why = protocol.decode(line, allowed, max_values)
  if not msg then
    return nil, "the driver sent " .. why
  end
  if msg.type == "fatal" then
    return nil, "the driver gave up: " .. tostring(msg.message)
  end
  return msg
end

-- The checks of a start that hold whatever session takes the sandbox, run
-- by rlm.pool as soon as a pooled sandbox has said its three lines (hello,
-- configured, self_test_result), so that its take does not pay for them:
-- the hello's protocol, the move of every sandbox process into its memory
-- cgroup, the self-test's result, and the backend's vet_processes (the
-- uids of every process, the descriptors of bubblewrap's). `lines`
-- are those three lines. Returns
--   { tree = pids, times = ... }        all passed; the take checks that
--                                        the tree is still the same
--   { error = { kind, message, extra } } a check failed: the session that
--                                        takes it fails with this error
--   false                                it died meanwhile (not fit)
function M.vet(backend, drv, lines, max_values)
  local function failed(kind, message, extra)
    return { error = { kind, message, extra } }
  end
  local hello, err = line_message(lines[1], { hello = true, fatal = true }, max_values)
  if not hello then
    return failed("protocol_error", err)
  end
  local problem = M.hello_problem(hello)
  if problem then
    return failed("protocol_error", problem)
  end
  local adopted, died = backend.adopt(drv)
  if not adopted then
    if died then
      return false
    end
    return failed("sandbox_violation", M.CGROUP_REFUSED)
  end
  local configured
  configured, err = line_message(lines[2], { configured = true, fatal = true }, max_values)
  if not configured then
    return failed("protocol_error", err)
  end
  local result
  result, err = line_message(lines[3], { self_test_result = true, fatal = true }, max_values)
  if not result then
    return failed("protocol_error", err)
  end
  local kind, message, extra = M.self_test_error(result, backend.describe(drv).mode)
  if kind then
    return failed(kind, message, extra)
  end
  local tree
  tree, kind, message = backend.vet_processes(drv)
  if kind then
    return failed(kind, message)
  elseif not tree then
    return false
  end
  return { tree = tree, times = { exec = drv:exec_ms(), interpreter = M.driver_stamps(hello.t),
    configure = M.driver_stamps(configured.t), self_test = M.driver_stamps(result.t) } }
end

-- The messages of a start, the same for a cold start and a pooled one
-- (docs/protocol.md): `configure` and `self_test` are the pool-level part,
-- sent right at the spawn; `load_context` carries the session-level part
-- (the output cap, the tools, the rlimits that depend on the session),
-- sent at once by a cold start and when a session takes a pooled sandbox.

function M.configure_message(o, info)
  return { type = "configure",
    max_message_bytes = o.sandbox.max_message_bytes,
    max_message_values = protocol.max_values(o.sandbox.max_message_bytes),
    guardrails = o.guardrails,
    int_bits = json.INT_BITS,
    allowed_modules = #o.sandbox.allowed_modules > 0 and o.sandbox.allowed_modules or nil, -- {} would be an object
    sys_path = info.sys_path, rlimits = selftest.pool_rlimits() }
end

function M.self_test_message(info, canaries)
  return { type = "self_test", absent = info.absent, canaries = canaries:info() }
end

-- The backend's start, with the pool-level messages at once: they wait in
-- the pipe while the sandbox and the interpreter start, so the driver
-- configures and tests itself with nobody reading. Returns drv | nil,
-- message.
function M.spawn(backend, o, spec, info, canaries)
  return backend.start(spec, { json.encode(M.configure_message(o, info)),
    json.encode(M.self_test_message(info, canaries)) })
end

return M
