-- Starting a session's sandbox: the spawn, the driver's hello, and the
-- checks that run before any model-written code (self-test, rlimits, uids).
local core = require("rlm.core")
local protocol = require("rlm.protocol")
local json = require("rlm.json")
local sandbox = require("rlm.sandbox")
local selftest = require("rlm.selftest")
local IDLE = require("rlm.engine").IDLE

local M = {}

-- The only places that start and stop a sandbox (core.spawn, drv:close):
-- the start is below in _boot; _teardown ends the driver, the probe helper
-- of a session that is still asking, the canaries of a start it cut short,
-- and nothing else.
function M:_teardown()
  if self.canaries then
    -- Closed while it started: the engine that would remove them is never
    -- resumed, and a garbage collection may be far off.
    self.canaries:remove()
    self.canaries = nil
  end
  if self.helper then
    sandbox.forget_probe(self)
    self.helper:close()
    self.helper = nil
  end
  if self.driver then
    local drv = self.driver
    self.driver = nil
    drv:close()
  end
end

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

-- The driver's own stamps (seconds on CLOCK_MONOTONIC): diagnostics for
-- bench/ only, never trusted for anything else.
local function driver_stamps(t)
  if type(t) ~= "table" or type(t[1]) ~= "number" or type(t[2]) ~= "number" then
    return nil
  end
  return { t[1] * 1000, t[2] * 1000 }
end

-- The messages of a start, the same for a cold start and a pooled one
-- (docs/protocol.md): `configure` and `self_test` are the pool-level part,
-- sent right at the spawn; `load_context` carries the session-level part
-- (the output cap, the tools, the rlimits that depend on the session),
-- sent at once by a cold start and when a session takes a pooled sandbox.

function M.configure_message(o, info)
  return { type = "configure",
    max_message_bytes = o.max_message_bytes, max_message_values = protocol.max_values(o.max_message_bytes),
    guardrails = o.guardrails,
    int_bits = json.INT_BITS,
    allowed_modules = #o.allowed_modules > 0 and o.allowed_modules or nil, -- {} would be an object
    sys_path = info.sys_path, rlimits = selftest.pool_rlimits() }
end

function M.self_test_message(info, canaries)
  return { type = "self_test", absent = info.absent, canaries = canaries:info() }
end

-- core.spawn, then the pool-level messages at once: they wait in the pipe
-- while bubblewrap and the interpreter start, so the driver configures and
-- tests itself with nobody reading. Returns drv | nil, message.
function M.spawn_sandbox(o, spec, info, canaries)
  local drv, err = core.spawn(spec)
  if not drv then
    return nil, err
  end
  if not (drv:send(json.encode(M.configure_message(o, info)))
      and drv:send(json.encode(M.self_test_message(info, canaries)))) then
    drv:close()
    return nil, "the driver took no input"
  end
  return drv
end

function M:_load_context_message(context_bytes)
  local o = self.opts
  return { type = "load_context", format = self.context_format, stdout_limit = o.stdout_truncate_chars,
    rlimits = selftest.session_rlimits(o, context_bytes),
    tools = require("rlm.tools").specs(o) }
end

function M:_start()
  -- When each part of the start happened, in ms on core.now_ms()'s clock
  -- (bench/cold_start.lua shows them as phases).
  self.start_times = { begin = core.now_ms() }
  local pool = self.opts.pool
  if pool then
    local entry = pool:_take()
    if entry then
      self.start = "warm"
      -- The replacement is spawned once this session's first step is out
      -- (rlm.engine's poll) or it closes: a spawn costs the host's thread
      -- about as much as the whole warm start (bench/pool.lua).
      self.refill = pool
      self.canaries = entry.canaries
      return self:_started(self:_take_sandbox(entry))
    end
  end
  self.start = "cold"
  -- Planted before the spawn, so that the leaked descriptor is there to leak.
  self.canaries = core.plant_canaries(os.getenv("HOME"), self.opts.tmpdir)
  return self:_started(self:_boot(self.canaries))
end

-- The start is over, well or not: its canaries go.
function M:_started(ok, err)
  if self.canaries then
    self.canaries:remove()
    self.canaries = nil
  end
  return ok, err
end

-- A pooled sandbox (rlm.pool): started and self-testing since its spawn;
-- what it said meanwhile waits in entry.events. The same checks as a cold
-- start, then the context, written into its memfd and sealed now.
function M:_take_sandbox(entry)
  local times = self.start_times
  times.spawn = entry.spawned_at
  self.driver = entry.drv
  self.pre_events = entry.events
  self:_watch(entry.drv)
  -- The context first, so that its load overlaps the checks below: written
  -- and sealed before load_context goes, and no model code runs before
  -- every check has passed.
  local context_bytes = #self.context_data
  local ok, werr = entry.drv:write_context(self.context_data)
  self.context_data = nil
  while ok == false do
    -- A large context is written on a thread of rlm.core's: the host's
    -- loop goes on meanwhile (timeout() asks to be polled again soon).
    self.context_writing = true
    coroutine.yield(IDLE)
    ok, werr = entry.drv:context_written()
  end
  self.context_writing = nil
  if not ok then
    return self:_error("sandbox_violation", "the context could not be sealed: " .. tostring(werr))
  end
  local err
  ok, err = self:_send(self:_load_context_message(context_bytes))
  if not ok then
    return nil, err
  end
  return self:_checks(entry.canaries, context_bytes)
end

-- Spawns the sandbox (a cold start), then proves it as _checks says.
function M:_boot(canaries)
  local o = self.opts
  local context_bytes = #self.context_data
  local spec, info = sandbox.prepare(o, self.context_data, function(helper)
    return self:_wait_helper(helper)
  end, self)
  if not spec then
    return self:_fail(info)
  end
  self.start_times.spawn = core.now_ms()
  local drv, serr = M.spawn_sandbox(o, spec, info, canaries)
  if not drv then
    return self:_error("sandbox_unavailable", "starting the sandbox: " .. tostring(serr))
  end
  self.driver = drv
  self:_watch(drv)
  self.context_data = nil
  local ok, err = self:_send(self:_load_context_message(context_bytes))
  if not ok then
    return nil, err
  end
  return self:_checks(canaries, context_bytes)
end

-- Proves the sandbox before any model code can run (load_context is sent by
-- now): the driver's hello, its cgroup, its self-test against the canaries;
-- then the context is loaded, and the rlimits, uids and descriptors are
-- read back from /proc.
function M:_checks(canaries, context_bytes)
  local o, drv, times = self.opts, self.driver, self.start_times
  self.booting = "hello"
  self:_set_deadline(o.start_timeout_ms)
  local hello, err = self:_expect({ hello = true, fatal = true })
  -- It only had to be there to leak into the spawn, which runs on the
  -- driver's own thread and is over once the driver speaks.
  canaries:close_leaked()
  if not hello then
    return nil, err
  end
  times.hello, times.exec, times.interpreter = core.now_ms(), drv:exec_ms(), driver_stamps(hello.t)
  if hello.protocol ~= protocol.VERSION then
    return self:_error("protocol_error", ("the driver speaks protocol %s, the host %d")
      :format(tostring(hello.protocol), protocol.VERSION))
  end
  self.started = true
  self.booting = "boot"
  self:_set_deadline(self:_boot_timeout_ms())
  -- The driver says hello before it imports its package: this and the
  -- messages below overlap its imports.
  if not drv:adopt() then
    if not drv:interpreter_runs() then
      -- It died (a pooled sandbox killed while idle): its exit says so,
      -- after what it said before.
      local kind, a, b, c
      repeat
        kind, a, b, c = self:_wait(false)
      until kind ~= "line"
      return self:_driver_message({}, kind, a, b, c)
    end
    return self:_error("sandbox_violation", "a sandbox process could not be moved into its memory cgroup")
  end
  local msg
  msg, err = self:_expect({ configured = true, fatal = true })
  if not msg then
    return nil, err
  end
  times.configure = driver_stamps(msg.t)
  msg, err = self:_expect({ self_test_result = true, fatal = true })
  if not msg then
    return nil, err
  end
  times.self_test = driver_stamps(msg.t)
  local bad = checks_failed(msg.checks)
  if #bad > 0 then
    return self:_error("sandbox_violation", "the sandbox self-test failed: " .. table.concat(bad, "; "),
      { checks = msg.checks })
  end
  local rlimits = selftest.rlimits(o, context_bytes)
  msg, err = self:_expect({ ready = true, fatal = true })
  if not msg then
    return nil, err
  end
  if msg.error then
    return self:_error("protocol_error", "the driver could not load the context: " .. msg.error)
  end
  times.context, times.ready = driver_stamps(msg.t), core.now_ms()
  local tree = drv:tree()
  local problem = "the sandbox has no processes"
  if #tree > 0 then
    problem = selftest.check_rlimits(tree[#tree], rlimits)
  end
  if problem then
    return self:_error("sandbox_violation", "the driver's rlimits are not set: " .. problem)
  end
  problem = selftest.check_uids(tree, drv:uid())
  if problem then
    return self:_error("sandbox_violation", "the sandbox runs as the wrong uid: " .. problem)
  end
  -- After ready: a pooled driver holds its context's memfd until then.
  local foreign = drv:foreign_fds()
  if #foreign > 0 then
    return self:_error("sandbox_violation", "descriptors reach the sandbox: " .. table.concat(foreign, "; "))
  end
  times.checked = core.now_ms()
  self.booting = nil
  self:_set_deadline(0)
  return true
end
return M
