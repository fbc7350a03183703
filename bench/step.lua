-- Figure 2, step round trip: many steps of one session whose scripted root
-- model answers `x = 1` at once, each timed around s:step(). The floor is a
-- plain C host ping-ponging one short line with a Python echo driver over
-- pipes (floor_pingpong.c, echo_driver.py). Steps and floor take turns in
-- rounds, and both run pinned to one CPU (see common.pin); the same without
-- pinning is shown beside it.
local common = require("bench.common")

local M = {}

local SIZES = {
  full = { steps = 2000, trips = 10000, rounds = 10 },
  tiny = { steps = 20, trips = 100, rounds = 2 },
}

local FLOOR_NAME = "C host <-> python echo driver, one line each way"

-- (step times, floor times, floor times with JSON, why there is no floor,
-- and per round { steps = its step times, floor = its floor times })
local function measure(env, size)
  local per_round = math.floor(size.steps / size.rounds)
  local trips = math.floor(size.trips / size.rounds)
  local times, floor, json_floor, missing, rounds = {}, {}, {}, nil, {}
  local s = common.start(env, { max_iterations = size.steps + 1 })
  local ok, err = pcall(function()
    for r = 1, size.rounds do
      rounds[r] = { steps = {}, floor = {} }
      local f, why = common.floor(env, "pingpong", trips, common.echo_argv(env))
      missing = why
      for _, ms in ipairs(f or {}) do
        floor[#floor + 1] = ms
        rounds[r].floor[#rounds[r].floor + 1] = ms
      end
      for _, ms in ipairs(common.floor(env, "pingpong", trips, common.echo_argv(env, "json")) or {}) do
        json_floor[#json_floor + 1] = ms
      end
      for _ = 1, per_round do
        local ms = common.step(s)
        times[#times + 1] = ms
        rounds[r].steps[#rounds[r].steps + 1] = ms
      end
    end
  end)
  s:close()
  assert(ok, err)
  return times, floor, json_floor, missing, rounds
end

-- Flat steps: the steps of the first `k` rounds against those of the last
-- `k`, each round's median over its own floor's (the floor chunk that ran
-- just before it), so that the load of the shared machine, which swings
-- the medians of single windows both ways, cancels out; every step window
-- follows a floor chunk alike. (growth, first steps' median, last steps',
-- first floors', last floors', k, steps per round)
local function flatness(rounds)
  local k = math.max(1, math.floor(#rounds * 0.3))
  local function side(from, to)
    local norm, steps, floors = {}, {}, {}
    for r = from, to do
      local sm, fm = common.median(rounds[r].steps), common.median(rounds[r].floor)
      norm[#norm + 1] = sm / fm
      steps[#steps + 1], floors[#floors + 1] = sm, fm
    end
    return common.median(norm), common.median(steps), common.median(floors)
  end
  local n1, s1, f1 = side(1, k)
  local n2, s2, f2 = side(#rounds - k + 1, #rounds)
  return n2 / n1, s1, s2, f1, f2, k, #rounds[1].steps
end

function M.run(env)
  local size = common.sizes(env, SIZES)
  local unpin, why_not = common.pin()
  local ok, times, floor, json_floor, missing, rounds = pcall(measure, env, size)
  if unpin then
    unpin()
  end
  assert(ok, times)
  local loose, loose_floor = measure(env, size)

  local rows = {
    common.time_row({
      figure = "2", name = ("step round trip, %d steps in one session"):format(#times),
      stats = common.summary(times), fmt = common.fmt_us,
      floor = #floor > 0 and common.summary(floor) or nil, floor_missing = missing,
      floor_name = FLOOR_NAME, max_ratio = 1.5,
      note = ("%s; %d rounds of %d floor trips then %d steps"):format(
        unpin and "both pinned to one CPU" or ("not pinned: " .. why_not), size.rounds,
        math.floor(size.trips / size.rounds), math.floor(size.steps / size.rounds)),
    }),
  }
  -- Flat steps: root_llm gets the one conversation, appended to, never a
  -- copy of it, so the last steps cost what the first did.
  if #floor > 0 then
    local growth, s1, s2, f1, f2, k, per = flatness(rounds)
    local flat = common.context_row("2", ("steps 1-%d vs the last %d, each round against its floor"):format(k * per,
      k * per), growth, "x", ("%.1f us -> %.1f us"):format(s1 * 1000, s2 * 1000), 2 * k * per,
      ("the median over the last %d rounds of (a round's median step / its floor chunk's median) over the same "
        .. "for the first %d; floors %.1f us -> %.1f us; the conversation grows, a step must not")
        :format(k, k, f1 * 1000, f2 * 1000))
    flat.context, flat.ratio = nil, flat.value
    flat.ratio_text = ("%.2fx"):format(flat.value)
    flat.target, flat.met = "<= 1.2x the first", flat.value <= 1.2
    rows[#rows + 1] = flat
  end
  if #json_floor > 0 then
    local j = common.summary(json_floor)
    rows[#rows + 1] = common.context_row("2", "floor variant: echo driver json.loads + dumps",
      j.median, "ms", common.fmt_us(j), j.n)
  end
  local row = common.time_row({
    figure = "2", name = "step round trip, not pinned", stats = common.summary(loose), fmt = common.fmt_us,
    floor = #loose_floor > 0 and common.summary(loose_floor) or nil, floor_missing = missing,
    floor_name = FLOOR_NAME .. ", not pinned",
  })
  row.context = true
  row.note = "as the scheduler places them; no target"
  rows[#rows + 1] = row
  return rows
end

return M
