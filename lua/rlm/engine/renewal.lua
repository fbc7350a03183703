-- A journal's lease renewed on a timer (rlm.engine.journal holds one):
-- while a root call or a step is in flight, and not only at step ends, so
-- that a step or a model call longer than lease_ttl is not taken over by
-- a resumer. The engine makes no store call itself: a renewal due goes out
-- of poll() as a `journal` request, which the engine does not wait for.
-- The root session's poll() looks at every call, wherever its engine
-- waits (a root call, a step, the interpreter's probe, a write), and its
-- timeout() wakes the host's loop for it.
local core = require("rlm.core")
local IDLE = require("rlm.engine.loop").IDLE
local run_error = require("rlm.engine.tape").run_error

-- Its methods take the journal whose lease it renews (which holds it).
---@class Renewal
---@field at number|nil when the next renewal is due (core.now_ms)
---@field out table|nil the renewal's request while it is out
---@field suspended boolean|nil released after a resumable error (suspend), until taken again
local Renewal = {}
Renewal.__index = Renewal

local M = {}

function M.new()
  return setmetatable({}, Renewal)
end

-- The lease was taken or renewed now: the next renewal is due a third of
-- its ttl on, less the second its clock counts in (os.time: a lease
-- renewed at 4.9 s runs out at 4 + ttl), so that two may fail or be late
-- before it runs out: every 333 ms for a ttl of 2 s, 9.7 s for 30 s.
function Renewal:renewed(j)
  local ttl = j.lease_ttl
  self.suspended = nil
  self.at = core.now_ms() + math.max(ttl - 1, ttl / 2) * 1000 / 3
end

-- At each poll() of the root: a renewal due goes out; one that came back
-- failed ends the run (lease_lost: another owner took it over). None
-- goes out while a write's request is out (its guard is the lease's value
-- as this owner last wrote it), nor after the run's entries went. true,
-- or false when the session ended.
function Renewal:tick(j)
  local req = self.out
  if req then
    if not req.done then
      return true
    end
    self.out = nil
    local box = req.box
    if type(box) ~= "table" or not box[1] then
      j.session:_fail(run_error(type(box) == "table" and box[2] or box))
      return false
    end
    return true
  end
  local at = self.at
  local s = j.session
  if not at or self.suspended or j.writing or j.ended or not j.lease or s.failed or s.closed
    or core.now_ms() < at then
    return true
  end
  req = { type = "journal", depth = 0 }
  req.run = function()
    local ok, err = j.lease:renew()
    req.box = { ok, err }
    return true
  end
  self.out = req
  self:renewed(j)
  s.scheduler:request(req)
  return true
end

-- Waits for a renewal that is out (before a write: its guard is the
-- lease's value as the renewal leaves it). true, or nil, err (the
-- session ended).
function Renewal:settle(j)
  local s = j.session
  while self.out do
    if s.failed or s.closed or not self:tick(j) then
      return nil, s.failed
    end
    if self.out then
      coroutine.yield(IDLE)
    end
  end
  return true
end

-- The run reported a resumable error (a root call failed or timed out:
-- rlm.engine.turn): the lease goes now and the entries stay, so that a
-- resume elsewhere need not wait out the ttl, and close() keeps them
-- (Journal:discard). The run going on here takes the lease again
-- (Journal:begin), unless a resume took it meanwhile.
function Renewal:suspend(j)
  if j.lease and not j.ended and not self.suspended then
    self.suspended = true
    j:run(function()
      return j.lease:release()
    end, true)
  end
end

-- Milliseconds until the next renewal is due, or ms when that is sooner
-- (-1: none).
function Renewal:timeout(j, ms)
  local at = self.at
  if not at or self.suspended or j.ended or not j.lease then
    return ms
  end
  local left = math.max(math.ceil(at - core.now_ms()), 0)
  if ms < 0 or left < ms then
    return left
  end
  return ms
end

return M
