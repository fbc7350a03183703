-- Starting a session's sandbox: the spawn, the driver's hello, and the
-- checks that run before any model-written code (self-test, rlimits, uids).
local core = require("rlm.core")
local protocol = require("rlm.protocol")
local json = require("rlm.json")
local sandbox = require("rlm.sandbox")
local selftest = require("rlm.selftest")

local M = {}

-- The only places that start and stop a sandbox (core.spawn, drv:close):
-- the start is below in _boot; _teardown ends the driver, the probe helper
-- of a session that is still asking, and nothing else.
function M:_teardown()
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

function M:_start()
  -- When each part of the start happened, in ms on core.now_ms()'s clock
  -- (bench/cold_start.lua shows them as phases).
  self.start_times = { begin = core.now_ms() }
  -- Planted before the spawn, so that the leaked descriptor is there to leak.
  local canaries = core.plant_canaries(os.getenv("HOME"), self.opts.tmpdir)
  local ok, err = self:_boot(canaries)
  canaries:remove()
  return ok, err
end

-- Spawns the sandbox and proves it before any model code can run: the
-- driver's hello, the rlimits it set, its self-test against the canaries,
-- the context, and no foreign descriptor inside.
function M:_boot(canaries)
  local o = self.opts
  local context_bytes = #self.context_data
  local spec, info = sandbox.prepare(o, self.context_data, function(helper)
    return self:_wait_helper(helper)
  end, self)
  if not spec then
    return self:_fail(info)
  end
  local times = self.start_times or {}
  times.spawn = core.now_ms()
  local drv, serr = core.spawn(spec)
  if not drv then
    return self:_error("sandbox_unavailable", "starting the sandbox: " .. tostring(serr))
  end
  self.driver = drv
  self:_watch(drv)
  self.context_data = nil
  self.booting = "hello"
  self:_set_deadline(o.start_timeout_ms)
  local canary_info = canaries:info()

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
    return self:_error("sandbox_violation", "a sandbox process could not be moved into its memory cgroup")
  end
  local rlimits = selftest.rlimits(o, context_bytes)
  local ok
  ok, err = self:_send({ type = "configure", stdout_limit = o.stdout_truncate_chars,
    max_message_bytes = o.max_message_bytes, max_message_values = self.max_values,
    guardrails = o.guardrails,
    int_bits = json.INT_BITS,
    allowed_modules = #o.allowed_modules > 0 and o.allowed_modules or nil, -- {} would be an object
    sys_path = info.sys_path, rlimits = rlimits, tools = require("rlm.tools").specs(o) })
  if ok then
    ok, err = self:_send({ type = "self_test", absent = info.absent, canaries = canary_info })
  end
  if ok then
    ok, err = self:_send({ type = "load_context", format = self.context_format })
  end
  if not ok then
    return nil, err
  end
  local msg
  msg, err = self:_expect({ configured = true, fatal = true })
  if not msg then
    return nil, err
  end
  times.configure = driver_stamps(msg.t)
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
  msg, err = self:_expect({ ready = true, fatal = true })
  if not msg then
    return nil, err
  end
  if msg.error then
    return self:_error("protocol_error", "the driver could not load the context: " .. msg.error)
  end
  -- Checked now, not at the hello: the driver, done with its imports and its
  -- self-test, waits for the first step and holds only its pipes (while it
  -- imports, it has its package and the stdlib's files open for a moment).
  times.context, times.ready = driver_stamps(msg.t), core.now_ms()
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
