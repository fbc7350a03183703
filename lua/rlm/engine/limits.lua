-- Deadlines and budgets: the step deadline's end (the deadlines
-- themselves: the session's clock, rlm.engine.clock), max_wall_ms, tokens
-- and cost, and the host's room for nested sessions.
local core = require("rlm.core")
local util = require("rlm.base.util")

local M = {}

-- After its hello, the rest of the boot (self-test, context) may take this
-- long, or step_timeout_ms when that is longer.
local BOOT_TIMEOUT_MS = 30000

function M:_boot_timeout_ms()
  return math.max(BOOT_TIMEOUT_MS, self.opts.step_timeout_ms)
end

function M:_deadline_check()
  if self.driver and self.driver:deadline_passed() then
    self.driver:kill()
    return self:_timeout_error()
  end
  return true
end

-- What the model is told after an interrupted block.
function M:_interrupt_note()
  return ("[the step ran past step_timeout_ms (%.0f ms) and was interrupted: this block's changes were rolled "
    .. "back and the rest of the turn's blocks did not run; do less per step (smaller chunks, fewer calls)]")
    :format(self.opts.step_timeout_ms)
end

-- The step ran out of time: SIGINT to the driver (a KeyboardInterrupt in
-- the code), the call it waits on answered with `interrupted`, and any call
-- it makes from now on too; the sandbox dies at the hard deadline unless
-- the exec ends first.
function M:_interrupt()
  self.interrupted = true
  self:_drop_held()
  self:_end_children()
  self.clock:interrupted(self.driver)
  self.driver:interrupt()
  local ok, err = self:_emit({ type = "interrupt", step = self.iterations,
    timeout_ms = self.opts.step_timeout_ms, grace_ms = self.opts.interrupt_grace_ms })
  if not ok then
    return nil, err
  end
  if self.open_slots > 0 and self.open_call then
    self.open_slots = 0
    return self:_send({ type = self.open_tool and "tool_result" or "llm_result", id = self.open_call,
      interrupted = true })
  end
  return true
end

-- Milliseconds left of max_wall_ms in this run, or nil.
function M:_wall_left()
  local w, t0 = self.opts.max_wall_ms, self.tree.t0
  return w and t0 and w - (core.now_ms() - t0) or nil
end

function M:_wall_error()
  local w = self.opts.max_wall_ms
  return self:_error("cost_budget", ("the run took max_wall_ms (%.0f ms); it was stopped"):format(w),
    { wall_ms = core.now_ms() - self.tree.t0, max_wall_ms = w })
end

function M:_timeout_error()
  if self.clock.wall_cut then
    return self:_wall_error()
  end
  if self.booting == "hello" then
    return self:_error("sandbox_unavailable", ("the driver did not say hello within start_timeout_ms "
      .. "(%.0f ms); the sandbox was killed"):format(self.opts.start_timeout_ms),
      { timeout_ms = self.opts.start_timeout_ms })
  elseif self.booting then
    local ms = math.max(BOOT_TIMEOUT_MS, self.opts.step_timeout_ms)
    return self:_error("sandbox_unavailable", ("the sandbox did not finish its self-test and load the "
      .. "context within %.0f ms; it was killed"):format(ms), { timeout_ms = ms })
  end
  return self:_error("step_timeout", ("the step ran past step_timeout_ms (%.0f ms) and did not stop within "
    .. "interrupt_grace_ms (%.0f ms) of its interrupt; the sandbox was killed")
    :format(self.opts.step_timeout_ms, self.opts.interrupt_grace_ms),
    { timeout_ms = self.opts.step_timeout_ms, grace_ms = self.opts.interrupt_grace_ms })
end

-- Checked before each root turn and each sub-call.
function M:_check_budget()
  local o = self.opts
  local left = self:_wall_left()
  if left and left <= 0 then
    return self:_wall_error()
  end
  if o.max_total_tokens and self.tokens.total >= o.max_total_tokens then
    return self:_error("cost_budget", ("used %d tokens of max_total_tokens %d")
      :format(self.tokens.total, o.max_total_tokens),
      { tokens = self.tokens.total, max_total_tokens = o.max_total_tokens })
  end
  if not o.max_total_cost_usd then
    return true
  end
  local ok, spent = util.call_protected(o.cost_usd)
  if self.closed then
    return self:_cancelled()
  end
  if not ok then
    return self:_error("callback_error", "cost_usd raised: " .. tostring(spent))
  end
  -- NaN compares false with every budget, and inf or a negative is no
  -- spending: any of them would turn the budget off without a word.
  if type(spent) ~= "number" or spent ~= spent or spent < 0 or spent == math.huge then
    return self:_error("callback_error", ("cost_usd returned %s, not a finite number >= 0")
      :format(type(spent) == "number" and tostring(spent) or type(spent)))
  end
  if spent >= o.max_total_cost_usd then
    return self:_error("cost_budget", ("spent %.4f USD of max_total_cost_usd %.4f")
      :format(spent, o.max_total_cost_usd), { spent_usd = spent, max_total_cost_usd = o.max_total_cost_usd })
  end
  return true
end

-- A callback's optional second result: { input_tokens =, output_tokens = }.
function M:_add_usage(who, usage)
  if usage == nil then
    return true
  end
  local input, output = type(usage) == "table" and usage.input_tokens or nil,
    type(usage) == "table" and usage.output_tokens or nil
  local function count(n)
    return type(n) == "number" and n >= 0 and n < math.huge -- false for NaN
  end
  if not count(input) or not count(output) then
    return self:_error("callback_error", ("%s returned a usage that is not "
      .. "{ input_tokens = n, output_tokens = n } with finite n >= 0 (got %s, %s)")
      :format(who, tostring(input), tostring(output)))
  end
  local t = self.tokens
  t.input, t.output = t.input + input, t.output + output
  t.total = t.input + t.output
  return true
end

-- A nested session is made only while the run has fewer than
-- max_live_sandboxes sandboxes, its own included: why the one for this
-- call is not, as the code's error, or nil.
function M:_child_refusal()
  local cap = self.opts.max_live_sandboxes
  local live = 1 + self.tree.live_children
  if live >= cap then
    return ("rlm_query refused: the run already has %d sandboxes alive, max_live_sandboxes (%d); "
      .. "ask for fewer nested sessions at once"):format(live, cap)
  end
end

-- Hands a request to the outside world (through poll) and returns it.
return M
