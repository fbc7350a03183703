-- Figure 8, the host's loop while sessions start and close: n sessions
-- started from one luv callback (the luv adapter drives each to a FINAL at
-- its first step), with a 1 ms repeating timer on the same loop measuring
-- its own lateness. The figure is the loop's longest gap (how late the
-- timer fired at worst) from the callback that starts them to the last
-- session's end; beside it, the time each close() takes on the host's
-- thread. Floor: the same timer's longest gap on the idle loop, over the
-- same length of time.
local common = require("bench.common")

local M = {}

local SIZES = {
  full = { sessions = 50, rounds = 3 },
  tiny = { sessions = 3, rounds = 1 },
}

local FINAL = "```repl\nFINAL('ok')\n```"

-- A 1 ms repeating timer; returns stop() -> the longest gap seen (ms past
-- the 1 ms it asked for).
local function gap_meter(uv)
  local t = uv.new_timer()
  local last, worst = common.now_ms(), 0
  t:start(1, 1, function()
    local now = common.now_ms()
    worst = math.max(worst, now - last - 1)
    last = now
  end)
  return function()
    t:stop()
    t:close()
    return worst
  end
end

local function merge(a, b)
  for k, v in pairs(b or {}) do
    a[k] = v
  end
  return a
end

-- n sessions started from one callback: { gap = ms, wall = ms, closes =
-- {ms...}, errors = {message...} }.
function M.measure(env, uv, n, opts)
  local adapter = require("rlm.adapters.luv")
  local rlm = require("rlm")
  local r = { closes = {}, errors = {} }
  local left, t0 = n, nil
  local stop
  local kick = uv.new_timer()
  kick:start(5, 0, function()
    kick:close()
    t0 = common.now_ms()
    for _ = 1, n do
      local s = rlm.Session.new(common.session_opts(env, merge({ answer = FINAL }, opts)))
      adapter.drive(s, function(err)
        local c0 = common.now_ms()
        s:close()
        r.closes[#r.closes + 1] = common.now_ms() - c0
        if err then
          r.errors[#r.errors + 1] = tostring(err)
        end
        left = left - 1
      end, uv)
    end
  end)
  stop = gap_meter(uv)
  local deadline = common.now_ms() + 300000
  while left > 0 and common.now_ms() < deadline do
    uv.run("once")
  end
  r.wall = common.now_ms() - (t0 or common.now_ms())
  r.gap = stop()
  uv.run("nowait")
  collectgarbage()
  collectgarbage()
  assert(left == 0, "the sessions did not end in time")
  return r
end

-- The idle loop's longest gap over ms.
function M.idle_gap(uv, ms)
  local stop = gap_meter(uv)
  local t = uv.new_timer()
  local over = false
  t:start(math.ceil(ms), 0, function()
    t:close()
    over = true
  end)
  while not over do
    uv.run("once")
  end
  local gap = stop()
  -- The closes finish on the loop: a handle still closing when the Lua
  -- state ends makes luv's own teardown crash.
  uv.run("nowait")
  return gap
end

function M.run(env)
  local ok, uv = pcall(require, "luv")
  local size = common.sizes(env, SIZES)
  local name = ("longest gap of the host's loop: %d sessions started from one luv callback"):format(size.sessions)
  if not ok then
    return { { figure = "8", name = name, text = "-", note = "luv is not installed (apt-get install lua-luv)" } }
  end
  -- The interpreter probe runs once per Lua state: not in the figure.
  M.measure(env, uv, 1)
  local gaps, floors, closes, walls = {}, {}, {}, {}
  for _ = 1, size.rounds do
    local r = M.measure(env, uv, size.sessions)
    assert(#r.errors == 0, r.errors[1])
    gaps[#gaps + 1] = r.gap
    walls[#walls + 1] = r.wall
    for _, c in ipairs(r.closes) do
      closes[#closes + 1] = c
    end
    floors[#floors + 1] = M.idle_gap(uv, r.wall)
  end
  local floor_name = "the same 1 ms timer on the idle loop, as long"
  local rows = {
    common.time_row({
      figure = "8", name = name, stats = common.summary(gaps), floor = common.summary(floors),
      floor_name = floor_name,
      note = ("median of %d rounds; %.3g s from the callback to the last session's end"):format(
        #gaps, common.median(walls) / 1000),
    }),
  }
  local c = common.summary(closes)
  rows[#rows + 1] = common.context_row("8", "close() on the host's thread, per session", c.median, "ms",
    common.fmt_ms(c) .. (", max %.3g"):format(common.quantile(closes, 1)), c.n)
  return rows
end

return M
