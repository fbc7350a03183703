-- The budgets of a tree of sessions, its collaborator (the root session
-- creates it, its nested sessions share it): the sub-calls, tool calls and
-- tokens spent, max_wall_ms, cost.max_usd, the cap on sub-calls in flight
-- (max_concurrent_sub_calls, over the whole tree, whoever drives it) and
-- the room for nested sessions' sandboxes (the same cap, over the tree). The
-- budget options are the same in every session of a tree: a nested session
-- copies its parent's. And the tree's sub-call cache (rlm.engine.cache),
-- which a hit answers without spending any of them.
local cache = require("rlm.engine.cache")
local core = require("rlm.core")
local errors = require("rlm.base.errors")
local util = require("rlm.base.util")

---@class Budgets
---@field opts table the root session's options (the max_* budgets, cost)
---@field bounded boolean max_wall_ms, max_total_tokens or cost.max_usd is set: check has work
---@field t0 number|nil when the run began (max_wall_ms counts from here, over the tree)
---@field sub_calls integer sub-calls made (llm_query, rlm_query, in batches too)
---@field batches integer batches made (their batch_id)
---@field tool_calls integer host tool calls made
---@field tokens table input, output, total: what the callbacks' usages add up to
---@field in_flight integer sub-calls handed out and not yet answered
---@field held table { scheduler =, req = }: past max_concurrent_sub_calls, not yet handed out
---@field live_children integer nested sessions made and not yet closed
---@field cache Cache|nil the sub-call cache the tree shares (option sub_call_cache), or nil
local Budgets = {}
Budgets.__index = Budgets

local M = {}

function M.new(opts)
  return setmetatable({
    opts = opts,
    bounded = (opts.max_wall_ms or opts.max_total_tokens or opts.cost and opts.cost.max_usd) ~= nil,
    sub_calls = 0,
    batches = 0,
    tool_calls = 0,
    tokens = { input = 0, output = 0, total = 0 },
    in_flight = 0,
    held = {},
    live_children = 0,
    cache = opts.sub_call_cache and cache.new(opts.sub_call_cache.store or true, opts.sub_call_cache.namespace)
      or nil, -- nil, not false: the scheduler asks cache ~= nil
  }, Budgets)
end

-- A resume by re-attach (rlm.engine.reattach): what the run had spent at
-- its last step boundary (the journal head's counts), the steps done not
-- being run again to count it.
function Budgets:restore(counts)
  local function n(v)
    return type(v) == "number" and v >= 0 and math.floor(v) or 0 -- JSON's numbers: integers
  end
  local t = type(counts.tokens) == "table" and counts.tokens or {}
  self.sub_calls, self.batches, self.tool_calls = n(counts.sub_calls), n(counts.batches), n(counts.tool_calls)
  self.tokens = { input = n(t.input), output = n(t.output), total = n(t.total) }
end

-- The run begins: max_wall_ms counts from now.
function Budgets:start_clock()
  self.t0 = core.now_ms()
end

-- Milliseconds left of max_wall_ms in this run, or nil.
function Budgets:wall_left()
  local w, t0 = self.opts.max_wall_ms, self.t0
  return w and t0 and w - (core.now_ms() - t0) or nil
end

function Budgets:wall_error()
  local w = self.opts.max_wall_ms
  return errors.new("cost_budget", ("the run took max_wall_ms (%.0f ms); it was stopped"):format(w),
    { wall_ms = core.now_ms() - self.t0, max_wall_ms = w })
end

-- Checked before each root turn and each sub-call: nil, or the error the
-- run ends with. It may call cost.usd (which may close the session).
function Budgets:check()
  if not self.bounded then
    return nil
  end
  local o = self.opts
  local left = self:wall_left()
  if left and left <= 0 then
    return self:wall_error()
  end
  if o.max_total_tokens and self.tokens.total >= o.max_total_tokens then
    return errors.new("cost_budget", ("used %d tokens of max_total_tokens %d")
      :format(self.tokens.total, o.max_total_tokens),
      { tokens = self.tokens.total, max_total_tokens = o.max_total_tokens })
  end
  local cost = o.cost
  if not (cost and cost.max_usd) then
    return nil
  end
  local ok, spent = util.call_protected(cost.usd)
  if not ok then
    return errors.new("callback_error", "cost.usd raised: " .. tostring(spent))
  end
  -- NaN compares false with every budget, and inf or a negative is no
  -- spending: any of them would turn the budget off without a word.
  if type(spent) ~= "number" or spent ~= spent or spent < 0 or spent == math.huge then
    return errors.new("callback_error", ("cost.usd returned %s, not a finite number >= 0")
      :format(type(spent) == "number" and tostring(spent) or type(spent)))
  end
  if spent >= cost.max_usd then
    return errors.new("cost_budget", ("spent %.4f USD of cost.max_usd %.4f")
      :format(spent, cost.max_usd), { spent_usd = spent, max_usd = cost.max_usd })
  end
  return nil
end

-- A callback's optional second result: { input_tokens =, output_tokens = }.
-- nil, or the callback_error a usage of another shape is.
function Budgets:add_usage(who, usage)
  if usage == nil then
    return nil
  end
  local input, output = type(usage) == "table" and usage.input_tokens or nil,
    type(usage) == "table" and usage.output_tokens or nil
  local function count(n)
    return type(n) == "number" and n >= 0 and n < math.huge -- false for NaN
  end
  if not count(input) or not count(output) then
    return errors.new("callback_error", ("%s returned a usage that is not "
      .. "{ input_tokens = n, output_tokens = n } with finite n >= 0 (got %s, %s)")
      :format(who, tostring(input), tostring(output)))
  end
  local t = self.tokens
  t.input, t.output = t.input + input, t.output + output
  t.total = t.input + t.output
  return nil
end

-- max_sub_calls is spent.
function Budgets:sub_calls_spent()
  return self.sub_calls >= self.opts.max_sub_calls
end

-- One more sub-call: its index in the run.
function Budgets:count_sub_call()
  self.sub_calls = self.sub_calls + 1
  return self.sub_calls
end

-- One more batch: its batch_id.
function Budgets:count_batch()
  self.batches = self.batches + 1
  return self.batches
end

-- max_tool_calls is spent.
function Budgets:tool_calls_spent()
  return self.tool_calls >= self.opts.max_tool_calls
end

-- One more tool call: its index in the run.
function Budgets:count_tool_call()
  self.tool_calls = self.tool_calls + 1
  return self.tool_calls
end

-- Whether one more sub-call may be in flight now.
function Budgets:has_room()
  return self.in_flight < self.opts.max_concurrent_sub_calls
end

-- A sub-call that is in flight from now (answered at once: release it after).
function Budgets:take_room()
  self.in_flight = self.in_flight + 1
end

-- A request of scheduler's: counted in flight (req.counted) when there is
-- room, and true; else held back until one in flight answers, and false.
function Budgets:admit(scheduler, req)
  if not self:has_room() then
    self.held[#self.held + 1] = { scheduler = scheduler, req = req }
    return false
  end
  self.in_flight, req.counted = self.in_flight + 1, true
  return true
end

-- A counted sub-call is over: the next held one, of any session of the
-- tree, is counted now and returned (scheduler, req) for its scheduler to
-- hand out.
function Budgets:release()
  self.in_flight = self.in_flight - 1
  local h = self.held[1] and table.remove(self.held, 1)
  if h then
    self.in_flight, h.req.counted = self.in_flight + 1, true
    return h.scheduler, h.req
  end
end

-- Forgets the requests scheduler has held back.
function Budgets:drop_held(scheduler)
  local held = self.held
  for i = #held, 1, -1 do
    if held[i].scheduler == scheduler then
      table.remove(held, i)
    end
  end
end

-- A nested session is made only while the run has fewer than
-- max_concurrent_sub_calls nested sessions alive (a session queues its own
-- children past it: rlm.engine.nested; this holds the tree, grandchildren
-- included): why the one for this call is not, as the code's error, or nil.
function Budgets:child_refusal()
  local cap = self.opts.max_concurrent_sub_calls
  local live = self.live_children
  if live >= cap then
    return ("rlm_query refused: the run already has %d nested sessions alive, max_concurrent_sub_calls (%d); "
      .. "ask for fewer nested sessions at once"):format(live, cap)
  end
end

-- A nested session's sandbox counts from its making to its close.
function Budgets:child_made()
  self.live_children = self.live_children + 1
end

function Budgets:child_closed()
  self.live_children = self.live_children - 1
end

return M
