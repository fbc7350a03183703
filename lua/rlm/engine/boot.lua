-- Starting a session's sandbox: the spawn, the driver's hello, and the
-- checks that run before any model-written code (self-test, rlimits, uids).
local core = require("rlm.core")
local protocol = require("rlm.base.protocol")
local json = require("rlm.base.json")
local sandbox = require("rlm.sandbox.bwrap")
local selftest = require("rlm.sandbox.selftest")
local IDLE = require("rlm.engine.loop").IDLE

local M = {}

-- The only places that start and stop a sandbox (core.spawn, drv:close):
-- the start is below in _boot; _teardown ends the driver, the probe helper
-- of a session that is still asking, the canaries of a start it cut short,
-- and nothing else.
function M:_teardown()
  -- Closed while it started, or before its first exec: the engine that
  -- would remove them is never resumed, and a garbage collection may be
  -- far off.
  self:_remove_canaries()
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

-- The checks a cold start and the pool's vet make alike, each as nil or
-- the error (kind, message, extra) it ends the session with.
local CGROUP_REFUSED = "a sandbox process could not be moved into its memory cgroup"

local function self_test_error(result)
  local bad = checks_failed(result.checks)
  if #bad > 0 then
    return "sandbox_violation", "the sandbox self-test failed: " .. table.concat(bad, "; "),
      { checks = result.checks }
  end
end

local function uid_error(tree, uid)
  local problem = selftest.check_uids(tree, uid)
  if problem then
    return "sandbox_violation", "the sandbox runs as the wrong uid: " .. problem
  end
end

local function fd_error(foreign)
  if #foreign > 0 then
    return "sandbox_violation", "descriptors reach the sandbox: " .. table.concat(foreign, "; ")
  end
end

-- The driver's own stamps (seconds on CLOCK_MONOTONIC): diagnostics for
-- bench/ only, never trusted for anything else.
local function driver_stamps(t)
  if type(t) ~= "table" or type(t[1]) ~= "number" or type(t[2]) ~= "number" then
    return nil
  end
  return { t[1] * 1000, t[2] * 1000 }
end

-- A hello the host can talk to: nil, or why not (protocol_error).
local function hello_problem(hello)
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
-- cgroup, the self-test's result, the uids of every process, and the
-- descriptors of bubblewrap's. `lines`
-- are those three lines. Returns
--   { tree = pids, times = ... }        all passed; the take checks that
--                                        the tree is still the same
--   { error = { kind, message, extra } } a check failed: the session that
--                                        takes it fails with this error
--   false                                it died meanwhile (not fit)
function M.vet(drv, lines, max_values)
  local function failed(kind, message, extra)
    return { error = { kind, message, extra } }
  end
  local hello, err = line_message(lines[1], { hello = true, fatal = true }, max_values)
  if not hello then
    return failed("protocol_error", err)
  end
  local problem = hello_problem(hello)
  if problem then
    return failed("protocol_error", problem)
  end
  if not drv:adopt() then
    if not drv:interpreter_runs() then
      return false
    end
    return failed("sandbox_violation", CGROUP_REFUSED)
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
  local kind, message, extra = self_test_error(result)
  if kind then
    return failed(kind, message, extra)
  end
  -- A uid cannot change without a capability no sandbox process holds, so
  -- a tree that is the same at the take runs as checked here.
  local tree = drv:tree()
  if #tree == 0 then
    return false
  end
  kind, message = uid_error(tree, drv:uid())
  if kind then
    return failed(kind, message)
  end
  -- Bubblewrap's processes hold what they will hold (it opens nothing once
  -- the driver runs); the interpreter is checked again after ready, once
  -- it has let go of its context's memfd.
  local foreign = {}
  for i = 1, #tree - 1 do
    for _, f in ipairs(drv:foreign_fds(tree[i])) do
      foreign[#foreign + 1] = f
    end
  end
  kind, message = fd_error(foreign)
  if kind then
    return failed(kind, message)
  end
  return { tree = tree, times = { exec = drv:exec_ms(), interpreter = driver_stamps(hello.t),
    configure = driver_stamps(configured.t), self_test = driver_stamps(result.t) } }
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
    tools = require("rlm.engine.tools").specs(o) }
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

-- The start is over: after a failed one its canaries go now; after one
-- that went well, once the first exec has gone to the driver, while it runs
-- (rlm.turn's _exec), or at the end of the first turn (their removal costs
-- the host's thread a tenth of a millisecond: unlinks). Until then the
-- session owns them, and _teardown removes them when it closes first.
function M:_started(ok, err)
  if not ok then
    self:_remove_canaries()
  end
  return ok, err
end

function M:_remove_canaries()
  if self.canaries then
    self.canaries:remove()
    self.canaries = nil
  end
end

-- A pooled sandbox (rlm.pool): started and self-testing since its spawn.
-- When the pool has run M.vet on it (entry.vetted), only what depends on
-- the session is left: the context, written into its memfd and sealed now,
-- load_context, and the checks that must follow it (_checks_taken). A
-- sandbox that has not said all of its start yet gets every check of a
-- cold start on what it said meanwhile (entry.events) and says next.
function M:_take_sandbox(entry)
  local times = self.start_times
  times.spawn = entry.spawned_at
  self.driver = entry.drv
  self:_watch(entry.drv)
  local vetted = entry.vetted
  if vetted and vetted.error then
    -- Its checks failed: no context goes into it.
    return self:_error(vetted.error[1], vetted.error[2], vetted.error[3])
  end
  if not vetted then
    self.pre_events = entry.events
  end
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
  if vetted then
    return self:_checks_taken(vetted, context_bytes)
  end
  return self:_checks(entry.canaries, context_bytes)
end

-- The rest of the checks of a vetted pooled sandbox, once load_context is
-- sent: its processes are the ones the pool checked (so their cgroup and
-- uids are as checked), and after ready, as for a cold start, the rlimits
-- (load_context lowered RLIMIT_AS and RLIMIT_CPU) and the descriptors.
function M:_checks_taken(vetted, context_bytes)
  local o, times = self.opts, self.start_times
  for k, v in pairs(vetted.times) do
    times[k] = v
  end
  self.started = true
  self.booting = "boot"
  self:_set_deadline(self:_boot_timeout_ms())
  local msg, err = self:_expect({ ready = true, fatal = true })
  if not msg then
    return nil, err
  end
  return self:_ready(msg, selftest.rlimits(o, context_bytes), vetted.tree)
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
  local problem = hello_problem(hello)
  if problem then
    return self:_error("protocol_error", problem)
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
    return self:_error("sandbox_violation", CGROUP_REFUSED)
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
  local kind, message, extra = self_test_error(msg)
  if kind then
    return self:_error(kind, message, extra)
  end
  local rlimits = selftest.rlimits(o, context_bytes)
  msg, err = self:_expect({ ready = true, fatal = true })
  if not msg then
    return nil, err
  end
  return self:_ready(msg, rlimits)
end

-- The checks after ready: the driver loaded its context, its rlimits are
-- the session's, and (read from /proc) every process runs as the
-- sandbox's uid, or, for a pooled sandbox the pool vetted, is one of the
-- processes it checked (`tree`); then no descriptor but the session's
-- pipes reaches the sandbox.
function M:_ready(msg, rlimits, vetted_tree)
  local drv, times = self.driver, self.start_times
  if msg.error then
    return self:_error("protocol_error", "the driver could not load the context: " .. msg.error)
  end
  times.context, times.ready = driver_stamps(msg.t), core.now_ms()
  local tree = drv:tree()
  if vetted_tree and table.concat(tree, " ") ~= table.concat(vetted_tree, " ") then
    return self:_error("sandbox_violation", ("the sandbox's processes changed since the pool checked them "
      .. "(pids %s, now %s)"):format(table.concat(vetted_tree, " "), table.concat(tree, " ")))
  end
  local problem = "the sandbox has no processes"
  if #tree > 0 then
    problem = selftest.check_rlimits(tree[#tree], rlimits)
  end
  if problem then
    return self:_error("sandbox_violation", "the driver's rlimits are not set: " .. problem)
  end
  if not vetted_tree then
    local kind, message = uid_error(tree, drv:uid())
    if kind then
      return self:_error(kind, message)
    end
  end
  -- After ready: a pooled driver holds its context's memfd until then.
  -- (Of a vetted sandbox, bubblewrap's processes were checked by the pool.)
  local kind, message = fd_error(drv:foreign_fds(vetted_tree and tree[#tree] or nil))
  if kind then
    return self:_error(kind, message)
  end
  times.checked = core.now_ms()
  self.booting = nil
  self:_set_deadline(0)
  return true
end
return M
