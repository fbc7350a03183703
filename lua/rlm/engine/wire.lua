-- The session's side of the wire: waiting for the driver (or a reply),
-- turning what it sends into messages or errors, and sending to it.
local protocol = require("rlm.base.protocol")
local json = require("rlm.base.json")
local IDLE = require("rlm.engine.loop").IDLE
local unpack = require("rlm.base.util").unpack

local M = {}

local function exit_message(status, signal, stderr)
  local how = signal ~= 0 and ("killed by signal " .. signal) or ("exit status " .. status)
  if signal == 0 and status > 128 and status < 128 + 65 then
    -- bubblewrap exits 128 + N when the process inside died of signal N.
    how = how .. (" (killed by signal %d)"):format(status - 128)
  end
  stderr = stderr and stderr:gsub("%s+$", "") or ""
  return how .. (stderr ~= "" and (": " .. stderr) or "")
end

-- The next thing the engine must handle: "reply", reply (when accept_replies),
-- "soft", kind (a soft deadline passed: the clock) or a driver event (kind,
-- ...; with `quick`, a lone llm_query as "query", prompt, id: rlm.core's
-- d:poll). It never waits in C: with nothing to do it
-- yields IDLE until poll() is called again.
function M:_wait(accept_replies, quick)
  -- What a pooled sandbox said before its session took it (rlm.pool).
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
  while true do
    local reply = accept_replies and self.scheduler:take_reply()
    if reply then
      return "reply", reply
    end
    local due = self.clock:soft_due()
    if due then
      return "soft", due
    end
    local drv = self.driver
    if not drv then
      return "closed"
    end
    if self.nested:running() then
      local child, ev = self.nested:pump()
      if child then
        return "child", child, ev
      end
    end
    -- Right after a line went to the driver, or while requests wait in the
    -- outbox, a look at the pipe would cost a system call that finds
    -- nothing: only what the driver holds already is taken (a line read
    -- with the last one), and the rest waits for whoever drives the session
    -- (fd(), or timeout(), which is 0 while the driver holds an event; the
    -- wait of rlm.blocking reads the line as it wakes). Under run() and
    -- step() that wait is next, and takes what is held first.
    local kind, a, b, c
    if not (self.sent and self.inline) then
      kind, a, b, c = drv:poll(0, self.max_values, self.sent or self.scheduler:has_out(), quick)
      if kind then
        self.sent = false
        return kind, a, b, c
      end
    end
    self.sent = false
    kind, a, b, c = self:_idle(quick)
    if kind then
      return kind, a, b, c
    end
  end
end

-- The next event of a helper process the boot runs (the interpreter probe).
-- With no helper: one turn of waiting for another session's probe.
function M:_wait_helper(helper)
  if not helper then
    coroutine.yield(IDLE)
    return true
  end
  if self.helper ~= helper then
    self.helper = helper
    self:_watch(helper)
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

-- Turns a driver event into the message it carries, when its type is one of
-- `allowed`, or into the error it means.
function M:_driver_message(allowed, kind, a, b, c)
  if kind == "line" then
    local msg, why = protocol.decode(a, allowed, self.max_values)
    if not msg then
      return self:_error("protocol_error", "the driver sent " .. why)
    end
    if msg.type == "fatal" then
      return self:_error("protocol_error", "the driver gave up: " .. tostring(msg.message))
    end
    return msg
  elseif kind == "failed" then
    -- The start (on rlm.core's thread) failed: nothing ran.
    return self:_error("sandbox_unavailable", "starting the sandbox: " .. tostring(a)
      .. require("rlm.diagnose").hint(tostring(a)))
  elseif kind == "timeout" then
    return self:_timeout_error()
  elseif kind == "memory" then
    return self:_error("memory_limit", ("the sandbox passed max_rss_bytes (%.0f bytes; peak seen %.0f bytes); "
      .. "the poll of its processes' memory killed it"):format(self.opts.max_rss_bytes, a),
      { limit = self.opts.max_rss_bytes, peak = a, mechanism = "poll" })
  elseif kind == "files" then
    return self:_error("memory_limit", ("the sandbox made more than workdir_max_files (%d) files in /session "
      .. "(%.0f seen); its tmpfs holds them in memory"):format(self.opts.workdir_max_files, a),
      { limit = self.opts.max_rss_bytes, peak = self.driver and self.driver:peak_rss() or 0,
        mechanism = "workdir files", files = a, max_files = self.opts.workdir_max_files })
  elseif kind == "dense" then
    return self:_error("protocol_error", ("the driver sent a line of %d JSON values or more; the limit is %d "
      .. "(max_message_bytes / 256)"):format(a, self.max_values))
  elseif kind == "overflow" then
    return self:_error("protocol_error", ("the driver sent a line longer than max_message_bytes (%d)")
      :format(self.opts.max_message_bytes))
  elseif kind == "exit" then
    local drv = self.driver
    local kills, peak = drv:oom_kills()
    if kills > 0 then
      local how = drv:memory_mechanism()
      return self:_error("memory_limit", ("the sandbox passed max_rss_bytes (%.0f bytes; peak %.0f bytes); "
        .. "the kernel killed it in its %s memory cgroup"):format(self.opts.max_rss_bytes, peak, how),
        { limit = self.opts.max_rss_bytes, peak = peak, mechanism = how })
    end
    if not self.started then
      -- Bubblewrap's own words say why; diagnose names what to change.
      return self:_error("sandbox_unavailable", "the sandbox exited before the driver started: "
        .. exit_message(a, b, c) .. require("rlm.sandbox.backend").for_options(self.opts).exit_hint(c))
    end
    return self:_error("driver_exited", "the driver exited: " .. exit_message(a, b, c),
      { status = a, signal = b, stderr = c })
  end
  if self.closed then
    return self:_cancelled()
  end
  return self:_error("driver_exited", "the driver is gone")
end

-- Waits for the next message of one of the `allowed` types.
function M:_expect(allowed)
  return self:_driver_message(allowed, self:_wait(false))
end

-- plain: msg holds only strings, booleans and small integers (json.encode_plain).
function M:_send(msg, plain)
  return self:_send_line((plain and json.encode_plain or json.encode)(msg))
end

-- One line of JSON to the driver.
function M:_send_line(line)
  return self:_sent(self.driver:send(line))
end

-- A lone llm_query's answer: its llm_result line, made by rlm.core.
function M:_send_text(id, text)
  return self:_sent(self.driver:send_result(id, text))
end

function M:_sent(ok)
  if not ok then
    return self:_expect({}) -- the reason it cannot take input is queued
  end
  self.sent = true
  return true
end
return M
