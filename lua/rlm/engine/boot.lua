-- Starting a session's sandbox: the spawn (or the take of a pooled one),
-- the driver's hello, and the checks that run before any model-written
-- code (self-test, rlimits, uids). Methods of the session's Handle
-- (rlm.engine.handle), which mixes them in: its start is this file's job,
-- its wire that file's.
local core = require("rlm.core")
local backends = require("rlm.sandbox.backend")
local claim = require("rlm.engine.claim")
local selftest = require("rlm.sandbox.selftest")
local start = require("rlm.sandbox.start")
local reattach = require("rlm.engine.reattach")
local IDLE = require("rlm.engine.loop").IDLE

local M = {}

-- After its hello, the rest of the boot (self-test, context) may take this
-- long, or step_timeout_ms when that is longer.
local BOOT_TIMEOUT_MS = 30000

function M:boot_timeout_ms()
  return math.max(BOOT_TIMEOUT_MS, self.opts.step_timeout_ms)
end

-- What take_pooled returns for a pooled sandbox that exited before it
-- said a word: the take goes on to the next one, or a cold start.
local SKIPPED = {}

local function pack(...)
  return { n = select("#", ...), ... }
end

-- The driver's seeds when the session's tree keeps a journal: { hash =,
-- random = } (rlm.engine.seeds), or nil.
function M:seeds()
  local s = self.session
  local j = s.root.journal
  return j and require("rlm.engine.seeds").for_session(j.seeds, s, j.session)
end

function M:load_context_message(context_bytes)
  local o = self.opts
  local seeds = self:seeds()
  return { type = "load_context", format = self.context_format, stdout_limit = o.stdout_truncate_chars,
    rlimits = selftest.session_rlimits(o, context_bytes),
    tools = require("rlm.engine.tools").specs(o), random_seed = seeds and seeds.random }
end

-- Starts the sandbox: a pooled one when the pool has one alive, else a
-- cold start. true, or nil, err (the session has failed with it).
function M:boot()
  -- When each part of the start happened, in ms on core.now_ms()'s clock
  -- (bench/cold_start.lua shows them as phases).
  self.start_times = { begin = core.now_ms() }
  if self.attached then
    return self:take_attached()
  end
  local pool = self.opts.pool
  -- A pooled sandbox's hash seed was its spawn's, before the session: a
  -- session with seeds of its own (a journal's) starts its own.
  if pool and not self:seeds() then
    local entry = pool:_take()
    while entry do
      self.start = "warm"
      -- The replacement is spawned once this session's first step is out
      -- (the session's poll()) or it closes: a spawn costs the host's thread
      -- about as much as the whole warm start (bench/pool.lua).
      self.refill = pool
      self.canaries = entry.canaries
      local ok, err = self:take_pooled(entry)
      if ok ~= SKIPPED then
        return self:start_ended(ok, err)
      end
      self.canaries = nil
      entry = pool:_take()
    end
  end
  self.start = "cold"
  -- Planted before the spawn, so that the leaked descriptor is there to leak.
  self.canaries = core.plant_canaries(os.getenv("HOME"), self.opts.sandbox.tmpdir)
  return self:start_ended(self:cold_start(self.canaries))
end

-- The start is over: after a failed one its canaries go now; after one
-- that went well, once the first exec has gone to the driver, while it runs
-- (rlm.engine.exec), or at the end of the first turn
-- (remove_canaries). Until then the handle owns them, and teardown removes
-- them when the session closes first.
function M:start_ended(ok, err)
  if not ok then
    self:remove_canaries()
  end
  return ok, err
end

-- A pooled sandbox (rlm.pool): started and self-testing since its spawn.
-- When the pool has run M.vet on it (entry.vetted), only what depends on
-- the session is left: the context, written into its memfd and sealed now,
-- load_context, and the checks that must follow it (checks_taken). A
-- sandbox that has not said all of its start yet gets every check of a
-- cold start on what it said meanwhile (entry.events) and says next.
function M:take_pooled(entry)
  local s = self.session
  local times = self.start_times
  times.spawn = entry.spawned_at
  self.driver = entry.drv
  s.engine:watch(entry.drv)
  claim.adopt(s, entry.drv)
  local vetted = entry.vetted
  if vetted and vetted.error then
    -- Its checks failed: no context goes into it.
    return s:_error(vetted.error[1], vetted.error[2], vetted.error[3])
  end
  if not vetted and not entry.events[1] then
    -- Not a word from it yet: it may have been spawned while bubblewrap
    -- could not start (an outage), and be dying now. Its first event
    -- decides, before the context goes in: an exit or a failed start skips
    -- it, as a sandbox that died idle (rlm.pool); anything else is what
    -- the checks below read first.
    self.booting = "hello"
    s.clock:set(self.driver, self.opts.sandbox.start_timeout_ms)
    local ev = pack(s.engine:wait(false))
    if ev[1] == "exit" or ev[1] == "failed" then
      self.driver = nil
      s.engine:unwatch(entry.drv)
      self.opts.pool:_skip(entry)
      return SKIPPED
    end
    entry.events[1] = ev
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
    return s:_error("sandbox_violation", "the context could not be sealed: " .. tostring(werr))
  end
  local err
  ok, err = self:send(self:load_context_message(context_bytes))
  if not ok then
    return nil, err
  end
  if vetted then
    return self:checks_taken(vetted, context_bytes)
  end
  return self:checks(entry.canaries, context_bytes)
end

-- The rest of the checks of a vetted pooled sandbox, once load_context is
-- sent: its processes are the ones the pool checked (so their cgroup and
-- uids are as checked), and after ready, as for a cold start, the rlimits
-- (load_context lowered RLIMIT_AS and RLIMIT_CPU) and the descriptors.
function M:checks_taken(vetted, context_bytes)
  local o, times = self.opts, self.start_times
  for k, v in pairs(vetted.times) do
    times[k] = v
  end
  self.started = true
  self.booting = "boot"
  self.session.clock:set(self.driver, self:boot_timeout_ms())
  local msg, err = self:expect({ ready = true, fatal = true })
  if not msg then
    return nil, err
  end
  return self:ready(msg, selftest.rlimits(o, context_bytes), vetted.tree)
end

-- A resume reached the lingering sandbox h (rlm.engine.reattach): the
-- opening takes it instead of a start; skip: the step in flight's lines
-- it had taken.
function M:attach_to(h, skip)
  self.attached = { h = h, skip = skip }
end

-- Its REPL as it was, proven at its own start: nothing more runs in it
-- before the step in flight goes on.
function M:take_attached()
  local a = self.attached
  self.attached, self.context_data = nil, nil
  self.driver, self.start, self.started = a.h, "attach", true
  self.skip_lines = a.skip > 0 and a.skip or nil
  self.session.engine:watch(a.h)
  self.info = backends.for_options(self.opts).describe(a.h)
  self.session.clock:set(a.h, 0)
  return true
end

-- Spawns the sandbox (a cold start), then proves it as checks says.
function M:cold_start(canaries)
  local s, o = self.session, self.opts
  local context_bytes = #self.context_data
  local backend = backends.for_options(o)
  local spec, info = backend.prepare(o, self.context_data, function(helper)
    return self:wait_helper(helper)
  end, s)
  if not spec then
    return s:_fail(info)
  end
  local seeds = self:seeds()
  spec.hash_seed = seeds and seeds.hash -- the spawn's PYTHONHASHSEED (both backends read it)
  spec = reattach.start_spec(s, spec) -- a journaled run's keeper may linger
  if spec.claim then
    -- The backend's sandbox is made for this start by the host's callback
    -- (rlm.engine.claim): the session waits for it here.
    local err
    spec, err = claim.session(s, backend, spec)
    if not spec then
      return s:_fail(err)
    end
  end
  self.start_times.spawn = core.now_ms()
  local drv, serr = start.spawn(backend, o, spec, info, canaries)
  if not drv then
    return s:_error("sandbox_unavailable", "starting the sandbox: " .. tostring(serr))
  end
  self.driver = drv
  s.engine:watch(drv)
  self.context_data = nil
  local ok, err = self:send(self:load_context_message(context_bytes))
  if not ok then
    return nil, err
  end
  return self:checks(canaries, context_bytes)
end

-- Proves the sandbox before any model code can run (load_context is sent by
-- now): the driver's hello, its cgroup, its self-test against the canaries;
-- then the context is loaded, and the rlimits, uids and descriptors are
-- read back from /proc.
function M:checks(canaries, context_bytes)
  local s, o, drv, times = self.session, self.opts, self.driver, self.start_times
  self.booting = "hello"
  s.clock:set(self.driver, o.sandbox.start_timeout_ms)
  local hello, err = self:expect({ hello = true, fatal = true })
  -- It only had to be there to leak into the spawn, which runs on the
  -- driver's own thread and is over once the driver speaks.
  canaries:close_leaked()
  if not hello then
    return nil, err
  end
  times.hello, times.exec, times.interpreter = core.now_ms(), drv:exec_ms(), start.driver_stamps(hello.t)
  local problem = start.hello_problem(hello)
  if problem then
    return s:_error("protocol_error", problem)
  end
  self.started = true
  self.booting = "boot"
  s.clock:set(self.driver, self:boot_timeout_ms())
  -- The driver says hello before it imports its package: this and the
  -- messages below overlap its imports.
  local adopted, died = backends.for_options(o).adopt(drv)
  if not adopted then
    if died then
      -- It died (a pooled sandbox killed while idle): its exit says so,
      -- after what it said before.
      local kind, a, b, c
      repeat
        kind, a, b, c = s.engine:wait(false)
      until kind ~= "line"
      return self:message({}, kind, a, b, c)
    end
    return s:_error("sandbox_violation", start.CGROUP_REFUSED)
  end
  local msg
  msg, err = self:expect({ configured = true, fatal = true })
  if not msg then
    return nil, err
  end
  times.configure = start.driver_stamps(msg.t)
  msg, err = self:expect({ self_test_result = true, fatal = true })
  if not msg then
    return nil, err
  end
  times.self_test = start.driver_stamps(msg.t)
  local kind, message, extra = start.self_test_error(msg, backends.for_options(o).describe(drv).mode)
  if kind then
    return s:_error(kind, message, extra)
  end
  local rlimits = selftest.rlimits(o, context_bytes)
  msg, err = self:expect({ ready = true, fatal = true })
  if not msg then
    return nil, err
  end
  return self:ready(msg, rlimits)
end

-- The checks after ready: the driver loaded its context, its rlimits are
-- the session's, and (read from /proc) every process runs as the
-- sandbox's uid, or, for a pooled sandbox the pool vetted, is one of the
-- processes it checked (`tree`); then no descriptor but the session's
-- pipes reaches the sandbox.
function M:ready(msg, rlimits, vetted_tree)
  local s, times = self.session, self.start_times
  if msg.error then
    return s:_error("protocol_error", "the driver could not load the context: " .. msg.error)
  end
  times.context, times.ready = start.driver_stamps(msg.t), core.now_ms()
  local kind, message = backends.for_options(self.opts).check_ready(self.driver, rlimits, vetted_tree)
  if kind then
    return s:_error(kind, message)
  end
  times.checked = core.now_ms()
  -- What sandbox it is, for the result and the sandbox_ready event.
  self.info = backends.for_options(self.opts).describe(self.driver)
  self.booting = nil
  s.clock:set(self.driver, 0)
  return true
end
return M
