-- A session's sandbox, its collaborator (rlm.engine.session creates it):
-- the backend's handle (rlm.sandbox.backend) with what the session knows
-- of it: how it started (its start is rlm.engine.boot's methods), the
-- canaries of the self-test, the pool it came from, and the wire, which
-- turns what the driver sends into messages or errors and sends to it.
-- What it needs of its session (failing) it asks through the session's
-- methods; its waits are the session's Engine's (rlm.engine.loop), its
-- deadlines the Clock's.
local backends = require("rlm.sandbox.backend")
local json = require("rlm.base.json")
local protocol = require("rlm.base.protocol")
local unpack = require("rlm.base.util").unpack
local IDLE = require("rlm.engine.loop").IDLE

---@class Handle
---@field session Session the session it serves
---@field opts table the session's options
---@field driver userdata|nil the backend's handle while the sandbox runs
---@field helper userdata|nil the probe's helper process while it runs
---@field canaries userdata|nil the self-test's canaries until the first exec
---@field context_data string|nil the context until it is in the sandbox
---@field context_format string "text" or "json"
---@field context_writing boolean|nil a large context is being written on a thread of rlm.core's
---@field start string|nil "cold" or "warm" (from the pool)
---@field start_times table|nil when each part of the start happened (bench/)
---@field info table|nil what sandbox the start made (backend.describe): result.sandbox, sandbox_ready
---@field booting string|nil "hello", "boot" while the start is checked
---@field started boolean|nil the driver has said hello
---@field pre_events table|nil what a pooled sandbox said before it was taken, read first
---@field refill table|nil the pool that gets a replacement after the first step
---@field pool_swept boolean|nil the close looked at the pool's idle sandboxes
---@field max_values integer the most JSON values one line may hold
---@field sent boolean|nil a line just went to the driver (take skips a look at the pipe)
---@field attached table|nil a lingering sandbox a resume reached, { h =, skip = }, until the opening takes it
---@field skip_lines integer|nil the step in flight's lines a re-attached keeper had taken: not sent again
local Handle = {}
Handle.__index = Handle

local M = {}

function M.new(session, context_data, context_format)
  local o = session.opts
  return setmetatable({
    session = session,
    opts = o,
    context_data = context_data,
    context_format = context_format,
    max_values = protocol.max_values(o.sandbox.max_message_bytes), -- JSON values in one line
  }, Handle)
end

-- The only places that start and stop a sandbox (the backend's start,
-- drv:close): the start is rlm.engine.boot's; teardown ends the driver,
-- the probe helper of a session that is still asking, the canaries of a
-- start it cut short, and nothing else.
function Handle:teardown()
  -- Closed while it started, or before its first exec: the engine that
  -- would remove them is never resumed, and a garbage collection may be
  -- far off.
  self:remove_canaries()
  if self.attached then
    local h = self.attached.h
    self.attached = nil
    h:close()
  end
  if self.helper then
    backends.for_options(self.opts).forget(self.session)
    self.helper:close()
    self.helper = nil
  end
  if self.driver then
    local drv = self.driver
    self.driver = nil
    drv:close()
  end
end

-- The start is over and its canaries have done their job (the first exec
-- has gone to the driver, or the first turn ended without code): their
-- removal costs the host's thread a tenth of a millisecond (unlinks).
function Handle:remove_canaries()
  if self.canaries then
    self.canaries:remove()
    self.canaries = nil
  end
end

-- The pool ------------------------------------------------------------------

-- The pool that gets a replacement for this sandbox (rlm.sandbox.pool).
function Handle:owe_refill(pool)
  self.refill = pool
end

-- A session that took a pooled sandbox starts its replacement once its
-- first step is out and no nested session runs, or at its close; a nested
-- session leaves that to the root of its tree, so that the replacements of
-- a batch do not start while the batch runs. From a finalizer (`collected`)
-- it starts no process: the pool is owed the sandbox, and its next take
-- starts it.
function Handle:refill_pool(collected)
  local pool = self.refill
  self.refill = nil
  if collected then
    pool.owed = true
  elseif self.session.parent then
    self.session.root.sandbox:owe_refill(pool)
  else
    pool:_fill()
  end
end

-- At a root session's close, once: the pool's sandboxes whose start ended
-- meanwhile are vetted now, so that the next take does not pay for it.
function Handle:sweep_pool()
  local pool = self.opts.pool
  if pool and not self.session.parent and not self.pool_swept then
    self.pool_swept = true
    pool:_sweep()
  end
end

-- The wire ------------------------------------------------------------------

-- What a pooled sandbox said before its session took it (rlm.sandbox.pool),
-- one event at a time (kind, ...), or nothing.
function Handle:pre_event()
  local pre = self.pre_events
  if pre then
    local ev = table.remove(pre, 1)
    if not pre[1] then
      self.pre_events = nil
    end
    if ev then
      return unpack(ev, 1, ev.n)
    end
  end
end

-- What the driver has for the engine now, without waiting: a driver event
-- (kind, ...: rlm.core's d:poll), or nothing. Right after a line went to
-- the driver, or while requests wait for poll() (`waiting`), a look at the
-- pipe would cost a system call that finds nothing: only what the driver
-- holds already is taken (a line read with the last one), and the rest
-- waits for whoever drives the session (fd(), or timeout(), which is 0
-- while the driver holds an event; the wait of rlm.drive.blocking reads
-- the line as it wakes).
function Handle:take(waiting)
  local sent = self.sent
  self.sent = false
  return self.driver:poll(0, self.max_values, sent or waiting)
end

-- The next event of a helper process the start runs (the interpreter probe).
-- With no helper: one turn of waiting for another session's probe.
function Handle:wait_helper(helper)
  if not helper then
    coroutine.yield(IDLE)
    return true
  end
  if self.helper ~= helper then
    self.helper = helper
    self.session.engine:watch(helper)
  end
  while true do
    local kind, a, b, c = helper:poll(0)
    if kind then
      self.helper = nil
      return kind, a, b, c
    end
    coroutine.yield(IDLE)
  end
end

local function exit_message(status, signal, stderr)
  local how = signal ~= 0 and ("killed by signal " .. signal) or ("exit status " .. status)
  if signal == 0 and status > 128 and status < 128 + 65 then
    -- bubblewrap exits 128 + N when the process inside died of signal N.
    how = how .. (" (killed by signal %d)"):format(status - 128)
  end
  stderr = stderr and stderr:gsub("%s+$", "") or ""
  return how .. (stderr ~= "" and (": " .. stderr) or "")
end

-- Turns a driver event into the message it carries, when its type is one of
-- `allowed`, or into the error it means (the session ends with it).
function Handle:message(allowed, kind, a, b, c)
  local s, o = self.session, self.opts
  if kind == "line" then
    local msg, why = protocol.decode(a, allowed, self.max_values)
    if not msg then
      return s:_error("protocol_error", "the driver sent " .. why)
    end
    if msg.type == "fatal" then
      return s:_error("protocol_error", "the driver gave up: " .. tostring(msg.message))
    end
    return msg
  elseif kind == "failed" then
    -- The start (on rlm.core's thread) failed: nothing ran.
    return s:_error("sandbox_unavailable", "starting the sandbox: " .. tostring(a)
      .. require("rlm.diagnose").hint(tostring(a)))
  elseif kind == "timeout" then
    return self:timeout_error()
  elseif kind == "memory" then
    return s:_error("memory_limit", ("the sandbox passed max_rss_bytes (%.0f bytes; peak seen %.0f bytes); "
      .. "the poll of its processes' memory killed it"):format(o.max_rss_bytes, a),
      { limit = o.max_rss_bytes, peak = a, mechanism = "poll" })
  elseif kind == "files" then
    return s:_error("memory_limit", ("the sandbox made more than sandbox.workdir_max_files (%d) files in /session "
      .. "(%.0f seen); its tmpfs holds them in memory"):format(o.sandbox.workdir_max_files, a),
      { limit = o.max_rss_bytes, peak = self.driver and self.driver:peak_rss() or 0,
        mechanism = "workdir files", files = a, max_files = o.sandbox.workdir_max_files })
  elseif kind == "dense" then
    return s:_error("protocol_error", ("the driver sent a line of %d JSON values or more; the limit is %d "
      .. "(sandbox.max_message_bytes / 256)"):format(a, self.max_values))
  elseif kind == "overflow" then
    return s:_error("protocol_error", ("the driver sent a line longer than sandbox.max_message_bytes (%d)")
      :format(o.sandbox.max_message_bytes))
  elseif kind == "lost" then
    -- A stream to a far sandbox ended with no word from its keeper
    -- (rlm.sandbox.exec): before the driver's hello it never started.
    return s:_error(self.started and "sandbox_lost" or "sandbox_unavailable", a, b)
  elseif kind == "broken" then
    return s:_error("protocol_error", a)
  elseif kind == "exit" then
    local drv = self.driver
    local kills, peak = drv:oom_kills()
    if kills > 0 then
      local how = drv:memory_mechanism()
      return s:_error("memory_limit", ("the sandbox passed max_rss_bytes (%.0f bytes; peak %.0f bytes); "
        .. "the kernel killed it in its %s memory cgroup"):format(o.max_rss_bytes, peak, how),
        { limit = o.max_rss_bytes, peak = peak, mechanism = how })
    end
    if not self.started then
      -- Bubblewrap's own words say why; diagnose names what to change.
      return s:_error("sandbox_unavailable", "the sandbox exited before the driver started: "
        .. exit_message(a, b, c) .. backends.for_options(o).exit_hint(c))
    end
    return s:_error("driver_exited", "the driver exited: " .. exit_message(a, b, c),
      { status = a, signal = b, stderr = c })
  end
  if s.closed then
    return s:_cancelled()
  end
  return s:_error("driver_exited", "the driver is gone")
end

-- The driver's deadline passed (its keeper killed the sandbox): the
-- session ends with the error that deadline means.
function Handle:timeout_error()
  local s, o = self.session, self.opts
  if s.clock.wall_cut then
    return s:_fail(s.tree:wall_error())
  end
  local booting = self.booting
  if booting == "hello" then
    local ms = o.sandbox.start_timeout_ms
    return s:_error("sandbox_unavailable", ("the driver did not say hello within sandbox.start_timeout_ms "
      .. "(%.0f ms); the sandbox was killed"):format(ms), { timeout_ms = ms })
  elseif booting then
    local ms = self:boot_timeout_ms()
    return s:_error("sandbox_unavailable", ("the sandbox did not finish its self-test and load the "
      .. "context within %.0f ms; it was killed"):format(ms), { timeout_ms = ms })
  end
  return s:_error("step_timeout", ("the step ran past step_timeout_ms (%.0f ms) and did not stop within "
    .. "sandbox.interrupt_grace_ms (%.0f ms) of its interrupt; the sandbox was killed")
    :format(o.step_timeout_ms, o.sandbox.interrupt_grace_ms),
    { timeout_ms = o.step_timeout_ms, grace_ms = o.sandbox.interrupt_grace_ms })
end

-- A callback that blocked may have passed the driver's deadline: its
-- keeper kills the sandbox then, and the session ends as the deadline
-- says. true, or nil, err.
function Handle:deadline_check()
  local drv = self.driver
  if drv and drv:deadline_passed() then
    drv:kill()
    return self:timeout_error()
  end
  return true
end

-- Waits for the next message of one of the `allowed` types.
function Handle:expect(allowed)
  return self:message(allowed, self.session.engine:wait(false))
end

-- plain: msg holds only strings, booleans and small integers (json.encode_plain).
function Handle:send(msg, plain)
  return self:send_line((plain and json.encode_plain or json.encode)(msg))
end

-- One line of JSON to the driver; after a re-attach, the step in
-- flight's lines the keeper took before are passed over, in their order
-- (rlm.engine.reattach): the driver has them.
function Handle:send_line(line)
  local skip = self.skip_lines
  if skip then
    self.skip_lines = skip > 1 and skip - 1 or nil
    return true
  end
  return self:sent_ok(self.driver:send(line))
end

-- A line went, or the driver cannot take input: why is queued, and read.
function Handle:sent_ok(ok)
  if not ok then
    return self:expect({})
  end
  self.sent = true
  return true
end

-- Its start, rlm.engine.boot's: Handle:boot() and the checks it runs.
for k, fn in pairs(require("rlm.engine.boot")) do
  assert(Handle[k] == nil, k)
  Handle[k] = fn
end

return M
