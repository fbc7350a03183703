-- A warm pool (docs/api.md, "Pool"): sandboxes started ahead of the
-- sessions that take them. Each was spawned with an empty context memfd and
-- told the pool-level `configure` and `self_test` at once, so it says hello,
-- configures and tests itself while nobody reads it. Once the pool sees it
-- has said so (at stats(), at the refill after a take, or at the close of
-- a root session that has the pool), it runs the checks that do not
-- depend on the session (rlm.sandbox.start's vet: hello, cgroup, self-test
-- result, uids); the session that takes it writes and seals its context, sends
-- load_context, and runs the checks that must follow it (rlm.engine.boot).
-- One sandbox, one session: a sandbox taken is the session's, and never
-- comes back. A sandbox's job, through the backend's seam: the engine only
-- takes from it, and rlm (init.lua) checks Pool.new's options with the
-- session's (rlm.engine.options) before they reach Pool.open.
local core = require("rlm.core")
local backends = require("rlm.sandbox.backend")
local claim = require("rlm.sandbox.claim")
local protocol = require("rlm.base.protocol")
local start = require("rlm.sandbox.start")

local Pool = {}
Pool.__index = Pool

-- At most this many sandboxes in one pool (each is a few processes, a uid
-- and tens of MB while idle).
Pool.MAX_SIZE = 64

-- A session's events a pooled sandbox may hold before it is taken: hello,
-- configured, self_test_result; anything more (or its exit) means it is
-- not fit to hand out.
local MAX_EVENTS = 3

-- Waits for the interpreter probe without an engine: Pool.new is called
-- by the host, outside any session.
local function blocking_wait(helper)
  if not helper then
    local ws = core.waitset()
    ws:wait(5)
    ws:close()
    return true
  end
  while true do
    local kind, a, b, c = helper:poll(100)
    if kind then
      return kind, a, b, c
    end
  end
end

--- rlm.Pool.new{ size = N, <sandbox options> } -> Pool (rlm, init.lua,
-- checks the options and calls this with them): returns nil, err when the
-- sandbox cannot be prepared (no bubblewrap, no interpreter).
function Pool.open(o, size)
  local self = setmetatable({ opts = o, size = size, idle = {}, claiming = 0,
    counts = { spawned = 0, taken = 0, cold = 0, dead = 0, failed = 0, release_failed = 0 } }, Pool)
  local backend = backends.for_options(o)
  local spec, info = backend.prepare(o, nil, blocking_wait, self)
  if not spec then
    return nil, info
  end
  spec.context, spec.late_context = nil, true
  self.backend, self.spec, self.info = backend, spec, info
  self.max_values = protocol.max_values(o.sandbox.max_message_bytes)
  -- Lua 5.1 and LuaJIT run no __gc for a table: a proxy's does it there.
  local proxy = rawget(_G, "newproxy")
  if proxy then
    self.gc = proxy(true)
    getmetatable(self.gc).__gc = function()
      self:close()
    end
  end
  self:_fill()
  return self
end

-- Starts one sandbox; returns at once (the keeper forks). A claimed one
-- (sandbox.claim) starts when its claim returns (_claim).
function Pool:_spawn()
  if self.spec.claim then
    return self:_claim()
  end
  return self:_start(self.spec)
end

-- One claim (rlm.sandbox.claim), in a coroutine of its own: the sandbox
-- starts when it returns, and is released at once if the pool was closed
-- meanwhile. A release of its sandbox that fails is counted
-- (stats().release_failed) until a session takes it. Returns false when
-- the claim or the start failed at once (the pool stops filling until its
-- next take), true otherwise.
function Pool:_claim()
  local failed = false
  self.claiming = self.claiming + 1
  local function report()
    self.counts.release_failed = self.counts.release_failed + 1
  end
  claim.run(self.backend, self.spec, { depth = 0, pool = true }, report, function(spec)
    self.claiming = self.claiming - 1
    if not spec then
      self.counts.failed = self.counts.failed + 1
      failed = true
    elseif self.closed then
      self.backend.release_claim(spec)
    elseif not self:_start(spec) then
      failed = true
    end
  end)
  return not failed
end

-- Starts a sandbox from spec: its canaries first, so that their leaked
-- descriptor is there to leak into the spawn.
function Pool:_start(spec)
  local canaries = core.plant_canaries(os.getenv("HOME"), self.opts.sandbox.tmpdir)
  local at = core.now_ms()
  local drv = start.spawn(self.backend, self.opts, spec, self.info, canaries)
  if not drv then
    canaries:remove()
    self.counts.failed = self.counts.failed + 1
    return false
  end
  self.counts.spawned = self.counts.spawned + 1
  self.idle[#self.idle + 1] = { drv = drv, canaries = canaries, events = {}, spawned_at = at }
  return true
end

-- Up to size sandboxes; a spawn that fails is not retried until the next
-- take. The idle ones whose start is over are vetted first (the refill of
-- a taking session, rlm.engine), as at stats().
function Pool:_fill()
  self:_sweep()
  while not self.closed and #self.idle + self.claiming < self.size do
    if not self:_spawn() then
      return
    end
  end
end

local function discard(entry)
  entry.drv:close()
  entry.canaries:remove()
end

-- Reads what an idle sandbox has said so far, without waiting, and vets it
-- (`vet`) if its start is over and it is not vetted yet. Returns false when
-- it is not fit to hand out (it exited, failed or said more than a start
-- says).
function Pool:_drain(entry, vet)
  while true do
    local ev = { entry.drv:poll(0, self.max_values) }
    if not ev[1] then
      break
    end
    ev.n = #ev
    if ev[1] ~= "line" or #entry.events >= MAX_EVENTS then
      return false
    end
    entry.canaries:close_leaked() -- the spawn is over
    entry.events[#entry.events + 1] = ev
    if #entry.events == MAX_EVENTS then
      -- The self-test has run: its canaries are not needed on disk (a host
      -- killed now leaves none behind).
      entry.canaries:remove()
    end
  end
  if vet and entry.vetted == nil and #entry.events == MAX_EVENTS and not self:_vet(entry) then
    return false
  end
  return entry.drv:alive()
end

-- The checks of a start that do not depend on the session (rlm.boot's
-- vet), run as soon as the sandbox has said its start, so that the take
-- does not pay for them. False when it died meanwhile.
function Pool:_vet(entry)
  local lines = {}
  for i, ev in ipairs(entry.events) do
    lines[i] = ev[2]
  end
  entry.vetted = start.vet(self.backend, entry.drv, lines, self.max_values)
  if not entry.vetted then
    return false
  end
  -- The take reads the events no more: only whether more came.
  return true
end

-- The next idle sandbox that is still alive, or nil (the session starts
-- cold). Dead ones are closed and counted.
function Pool:_take()
  if self.owed then
    -- A session collected with its refill undone (rlm's close): its
    -- replacement, started here rather than in the finalizer.
    self.owed = nil
    self:_fill()
  end
  while not self.closed do
    local entry = table.remove(self.idle, 1)
    if not entry then
      break
    end
    -- Not vetted here: one whose start ended only now gets the checks of a
    -- cold start on what it said (rlm.boot), which cost the same.
    if self:_drain(entry, false) then
      self.counts.taken = self.counts.taken + 1
      return entry
    end
    self.counts.dead = self.counts.dead + 1
    discard(entry)
  end
  self.counts.cold = self.counts.cold + 1
  self:_fill()
  return nil
end

-- A sandbox _take handed out that exited before it said a word (spawned
-- while bubblewrap could not start): the session skips it (rlm.boot), and
-- it counts as dead, not taken.
function Pool:_skip(entry)
  self.counts.taken = self.counts.taken - 1
  self.counts.dead = self.counts.dead + 1
  discard(entry)
end

-- Reads what every idle sandbox said since the last look (vetting those
-- whose start is over); the dead and unfit ones are closed and counted.
function Pool:_sweep()
  local keep = {}
  for _, entry in ipairs(self.idle) do
    if self:_drain(entry, true) then
      keep[#keep + 1] = entry
    else
      self.counts.dead = self.counts.dead + 1
      discard(entry)
    end
  end
  self.idle = keep
end

--- pool:stats() -> { size, ready, starting, taken, cold, dead, failed, spawned,
-- release_failed }: ready sandboxes have run their self-test and been
-- vetted (a session that takes one that failed fails with its error);
-- starting ones have not (claims not answered yet among them).
function Pool:stats()
  self:_sweep()
  local ready, starting = 0, 0
  for _, entry in ipairs(self.idle) do
    local last = entry.events[#entry.events]
    if #entry.events == MAX_EVENTS and last and last[2]:find('"self_test_result"', 1, true) then
      ready = ready + 1
    else
      starting = starting + 1
    end
  end
  local c = self.counts
  return { size = self.size, ready = ready, starting = starting + self.claiming, taken = c.taken, cold = c.cold,
    dead = c.dead, failed = c.failed, spawned = c.spawned, release_failed = c.release_failed,
    closed = self.closed or false }
end

--- pool:close(): kills every sandbox the pool still holds and removes
-- their canaries. A sandbox a session took is that session's (its close()
-- kills it). Safe to call more than once; later takes start cold.
function Pool:close()
  self.closed = true
  local idle = self.idle
  self.idle = {}
  for _, entry in ipairs(idle) do
    discard(entry)
  end
end

Pool.__gc = Pool.close
Pool.__close = Pool.close

return Pool
