-- A session's deadlines, its collaborator (rlm.engine.session creates it):
-- the driver's hard deadline, max_wall_ms's cut of it, the soft deadline
-- of a root call or a step, and the pause while a step waits on nested
-- sessions. The session hands it the driver's handle (the backend's, which
-- enforces the hard deadline on its keeper thread) at each call.
--
-- The clocks of one turn. The root call has root_timeout_ms, a soft
-- deadline: past it the call is given up and the turn can be run again
-- (the REPL is not touched). The REPL's work (its blocks and their
-- sub-calls) has step_timeout_ms: past it the driver is interrupted (a
-- KeyboardInterrupt in the code, the block rolled back), and only past
-- interrupt_grace_ms more is the sandbox killed. The kill is the driver's
-- hard deadline, which its keeper thread enforces even while a blocking
-- callback holds the host; the soft ones need the engine to be polled.
local core = require("rlm.core")

---@class Clock
---@field opts table the session's options (root_timeout_ms, step_timeout_ms, sandbox.interrupt_grace_ms)
---@field wall_left fun(): number|nil milliseconds left of max_wall_ms (nil: none)
---@field deadline_at number|nil when the driver's deadline fires
---@field wall_cut boolean|nil that deadline is max_wall_ms's, not the step's
---@field soft table|nil the soft deadline: { kind = "root" | "interrupt", at = }
---@field soft_left number|nil what was left of it while paused
---@field paused_left number|nil what was left of the driver's deadline while paused
local Clock = {}
Clock.__index = Clock

local M = {}

function M.new(opts, wall_left)
  return setmetatable({ opts = opts, wall_left = wall_left }, Clock)
end

-- Arms the driver's deadline ms from now (0: none), or sooner when
-- max_wall_ms ends first.
function Clock:set(drv, ms)
  local left = self.wall_left()
  self.wall_cut = ms > 0 and left ~= nil and left < ms
  if self.wall_cut then
    ms = math.max(left, 1)
  end
  self.deadline_at = ms > 0 and core.now_ms() + ms or nil
  drv:set_deadline(ms)
end

-- The root call's clocks: root_timeout_ms (soft) from `since` (the
-- request's time, when it went out before: now by default), and max_wall_ms
-- (hard) when it is set.
function Clock:arm_root(drv, since)
  local left = self.wall_left()
  self.wall_cut = left ~= nil
  self.paused_left, self.soft_left = nil, nil
  self.deadline_at = left and core.now_ms() + math.max(left, 1) or nil
  drv:set_deadline(left and math.max(left, 1) or 0)
  self.soft = { kind = "root", at = (since or core.now_ms()) + self.opts.root_timeout_ms }
end

-- A callback held the host's thread for ms while the driver's deadline ran
-- (a sandbox's start, rlm.engine.opening): the deadline, a timer of the
-- driver's loop, which did not run meanwhile, gets them back. max_wall_ms
-- counts every millisecond: its cut stays.
function Clock:held(drv, ms)
  local at = self.deadline_at
  if at and not self.wall_cut and ms > 0 then
    self:set(drv, math.max(at + ms - core.now_ms(), 1))
  end
end

-- The REPL's clocks for one turn: the interrupt at step_timeout_ms, the
-- kill interrupt_grace_ms later (or at max_wall_ms, when that is sooner).
function Clock:arm_step(drv)
  local o = self.opts
  self.paused_left, self.soft_left = nil, nil
  self:set(drv, o.step_timeout_ms + o.sandbox.interrupt_grace_ms)
  self.soft = { kind = "interrupt", at = core.now_ms() + o.step_timeout_ms }
end

function Clock:disarm(drv)
  self.soft, self.soft_left = nil, nil
  self:set(drv, 0)
end

-- The soft deadline that has passed ("root" or "interrupt"), once; or nil.
function Clock:soft_due()
  local soft = self.soft
  if soft and core.now_ms() >= soft.at then
    self.soft = nil
    return soft.kind
  end
  return nil
end

-- Milliseconds until the soft deadline (-1: none), or ms when that is sooner.
function Clock:soft_timeout(ms)
  local soft = self.soft
  if not soft then
    return ms
  end
  local left = math.max(math.ceil(soft.at - core.now_ms()), 0)
  if ms < 0 or left < ms then
    return left
  end
  return ms
end

-- While a step waits on nested sessions its clock stops: they have their
-- own steps and deadlines, and max_wall_ms bounds the whole.
function Clock:pause(drv)
  if self.deadline_at and not self.paused_left then
    self.paused_left = math.max(self.deadline_at - core.now_ms(), 1)
    if self.soft then
      self.soft_left, self.soft = math.max(self.soft.at - core.now_ms(), 0), nil
    end
    self:set(drv, 0)
  end
end

function Clock:resume(drv)
  if self.paused_left then
    local left, soft_left = self.paused_left, self.soft_left
    self.paused_left, self.soft_left = nil, nil
    self:set(drv, left)
    if soft_left then
      self.soft = { kind = "interrupt", at = core.now_ms() + soft_left }
    end
  end
end

-- The nested sessions ended: no pause to resume from.
function Clock:drop_pause()
  self.paused_left = nil
end

-- The step ran out of time: the pause is over, and when the step was
-- paused for nested sessions, the grace starts now.
function Clock:interrupted(drv)
  self.paused_left, self.soft_left = nil, nil
  if self.deadline_at == nil then
    self:set(drv, self.opts.sandbox.interrupt_grace_ms)
  end
end

return M
