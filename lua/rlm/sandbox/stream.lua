-- The exec backend's handle (rlm.sandbox.exec starts it): the byte stream
-- to rlm-keeper on the far side (docs/protocol.md, "The stream"), the
-- keeper's messages turned into the events a local sandbox's poll gives,
-- its heartbeat and deadline backstop, and the release of a claimed
-- sandbox when the handle closes. exec.lua knows the option and the start;
-- this file knows the stream once it runs.
local core = require("rlm.core")
local json = require("rlm.base.json")
local util = require("rlm.base.util")

local M = {}

M.KEEPER_PROTOCOL = 1

-- The sandboxes a keeper may make (its hello's "sandbox"); a session
-- accepts the ones its `sandbox.allow` names (rlm.sandbox.exec).
M.SANDBOXES = { bubblewrap = true, seccomp = true }

-- Past the step's hard deadline (the keeper's to enforce), the host kills
-- a stream that has said nothing: its own backstop.
M.BACKSTOP_MS = 2000

-- The stream's heartbeat (rlm.core's d:heartbeat): a ping on the
-- keeper's channel after PING_MS of quiet, from the driver's hello on (the
-- start before it is sandbox.start_timeout_ms's); a ping left unanswered
-- for `sandbox.ping_timeout_ms` is a lost stream. A relay may outlive the
-- far side and hold the host's pipe open (sh -c 'cat | rlm-keeper | cat'
-- does: its first cat learns of the keeper's death only when it writes),
-- so an end that would otherwise show only at the next write shows at the
-- ping.
M.PING_MS = 1000
local PING = '{"type":"ping"}'
local DEADLINE = '{"type":"deadline","ms":%d}'

-- A claimed sandbox's release: once, in a coroutine of its own (it may
-- yield as a callback under an adapter does: rlm.base.util.invoke); a
-- failure (a raise, or nil, message) goes to report(message), never to
-- the caller: close() does not raise.
function M.release(claim)
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

-- The handle: the stream (rlm.core's Driver from core.stream) and what the
-- keeper said of itself. Its methods are the ones rlm.sandbox.backend
-- lists.
local Handle = {}
Handle.__index = Handle

-- A connect table's address as the messages say it: 10.0.0.1:7070,
-- [fd00::1]:7070.
function M.peer(c)
  return (c.host:find(":", 1, true) and "[%s]:%d" or "%s:%d"):format(c.host, c.port)
end

-- The handle over drv for spec (rlm.sandbox.exec's: its ping_timeout_ms,
-- the sandboxes it allows, its claim, a linger's durable); an attach's
-- (rlm.sandbox.linger) sets the numbering's base.
function M.handle(drv, spec)
  if spec.durable then
    drv:linger() -- its close waits for the keeper, which ends on its own
  end
  return setmetatable({ drv = drv, peak = 0, mechanism = "keeper", kills = 0, kill_peak = 0,
    ping_timeout_ms = spec.ping_timeout_ms, allow = spec.allow, claim_of = spec.claim_of,
    durable = spec.durable, seq_base = 0, uncounted = 0, sent = 0,
    peer = spec.connect and M.peer(spec.connect) }, Handle)
end

-- A line for the driver, counted: an attach says how many of them the
-- keeper took (its "taken"), so a resume knows whether its step arrived.
function Handle:send(line)
  local deadline = self:_deadline_due()
  local ok, err
  if deadline then
    ok, err = self.drv:send_keeper(deadline, line) -- one write: one wake-up of the keeper
  else
    ok, err = self.drv:send(line)
  end
  if ok then
    self.sent = self.sent + 1
  end
  return ok, err
end

function Handle:fd()
  self:_flush()
  return self.drv:fd()
end

function Handle:timeout()
  self:_flush()
  return self.drv:timeout()
end

function Handle:wait(ms, token)
  self:_flush()
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
  self:_flush()
  return self.drv:send_keeper('{"type":"interrupt"}') ~= nil
end

-- The keeper kills at ms; the host kills the stream BACKSTOP_MS later if
-- the keeper has not said so by then. Each keeper message is a write and
-- a wake-up of the far side (a step sets three: the root call's, the
-- exec's and none after it), so: none is said only when the keeper may
-- have one armed, and a deadline goes with the next line the host
-- writes (the exec's, in the same write) or before the host next waits on
-- the stream, whichever is first, as what is left of it then: the keeper
-- kills at the same moment.
function Handle:set_deadline(ms)
  ms = math.max(math.floor(ms), 0)
  self.deadline_at = ms > 0 and core.now_ms() + ms or nil
  self.deadline_owed = self.deadline_at
  if ms == 0 and self.keeper_armed ~= false then
    self.drv:send_keeper(DEADLINE:format(0))
    self.keeper_armed = false
  end
  self.drv:set_deadline(ms > 0 and ms + M.BACKSTOP_MS or 0)
end

-- The deadline message owed to the keeper, if one is: taken.
function Handle:_deadline_due()
  local at = self.deadline_owed
  if not at then
    return nil
  end
  self.deadline_owed = nil
  self.keeper_armed = true
  return DEADLINE:format(math.max(math.ceil(at - core.now_ms()), 1))
end

-- Says the deadline owed, before a wait or a keeper message.
function Handle:_flush()
  local deadline = self:_deadline_due()
  if deadline then
    self.drv:send_keeper(deadline)
  end
end

function Handle:deadline_passed()
  return self.deadline_at ~= nil and core.now_ms() >= self.deadline_at
end

function Handle:kill()
  self.ended = self.ended or "killed"
  self.drv:kill()
end

function Handle:close()
  if self.durable and not self.ended then
    -- the session's end: the keeper ends with its input, no linger
    self.drv:send_keeper('{"type":"close"}')
  end
  self.ended = self.ended or "closed"
  self.drv:close()
  M.release(self.claim_of)
end

-- Where a failed release of this sandbox is told (the session that took
-- it from a pool, rather than the pool).
function Handle:report_release(report)
  if self.claim_of then
    self.claim_of.report = report
  end
end

-- The keeper's lines received so far (its numbering, which an attach's
-- `seen` gives back: the lines after it are replayed).
function Handle:received()
  return self.seq_base + self.drv:received() - self.uncounted
end

-- The driver's lines this handle sent (and, after an attach, the ones the
-- keeper had taken before it): a journal compares a step's number with an
-- attach's `taken`.
function Handle:sent_lines()
  return self.sent
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
  self:_flush()
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
    if t == "refused" and self.peer then
      -- a listening keeper's answer to a claim it does not take
      self.ended = "refused"
      return { "failed", ("rlm-keeper at %s refused the claim: %s"):format(self.peer, tostring(msg.message)) }
    elseif t ~= "hello" then
      return { "broken", "the far side's first line is not rlm-keeper's hello" }
    end
    self.hello = msg
    self.hello_at = core.now_ms() -- for bench/'s phases
    if msg.protocol ~= M.KEEPER_PROTOCOL then
      return { "broken", ("rlm-keeper speaks keeper protocol %s, the host %d")
        :format(tostring(msg.protocol), M.KEEPER_PROTOCOL) }
    end
    if self.durable and msg.linger ~= true then
      self.ended = "refused"
      return { "failed", "this rlm-keeper cannot linger (option 'sandbox.linger_ms'): an older one" }
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
  if t == "fenced" then
    -- Lost to this host, not killed: the sandbox is the new owner's now
    -- (a kill of a local keeper's stream would end it under them).
    self.ended = t
    return { "lost", ("rlm-keeper: an owner with fence %s took the sandbox (this one's is %s)")
      :format(tostring(number(msg.fence)), tostring(self.durable and self.durable.fence)) }
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
  self:_flush()
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
      if self.peer then
        -- a connection's end says itself (rlm.core's stream_connect)
        return "lost", ("the stream to the sandbox ended with no word from rlm-keeper: %s"):format(c or ""),
          { address = self.peer }
      end
      local how = b ~= 0 and ("killed by signal " .. b) or ("exit status " .. tostring(a))
      local tail = (c or ""):gsub("%s+$", "")
      return "lost", ("the stream to the sandbox ended (%s, with no word from rlm-keeper)%s%s")
        :format(how, tail ~= "" and ": " .. tail:sub(-500) or "", self.exit_hint and self.exit_hint(tail) or ""),
        { status = a, signal = b, stderr = c }
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

return M
