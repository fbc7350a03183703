-- Figure 11, the first answer with a model that takes its time (issue 30):
-- from rlm.Session.new to the end of the first step when the root model
-- answers `x = 1` after 50 ms or 300 ms. Under step() the stand-in blocks
-- (a wait on nothing, as a blocking HTTP client blocks the host); under the
-- luv adapter (rlm.adapters.luv) it returns and answers later from a luv
-- timer, and the first step's end is the root model's second call. Each
-- from a cold start and from a pool of 1 taken warm.
--
-- The floor is what overlapping the model's first call with the sandbox's
-- start could reach: max(start, model latency) + one step, the start and
-- the step measured in the same run, the same way (step() or luv, cold or
-- warm) with a root model that answers at once: the start from
-- Session.new to the host's last check of the sandbox (start_times.checked),
-- the step from there to the first step's end; the latency is the stand-in's
-- own, timed inside it. Beside it, in the note, the sum of the three: where
-- an engine that waits for the sandbox before it calls the model sits.
local common = require("bench.common")
local rlm = require("rlm")

local M = {}

local SIZES = {
  full = { rounds = 10 },
  tiny = { rounds = 1 },
}

-- The model latencies, in ms; 0 measures the floor's start and step.
local LATENCIES = { 0, 50, 300 }

local FINISH = "```repl\nFINAL('done')\n```"

-- One session's options: the root model answers TRIVIAL after latency_ms
-- (blocking, or through done() from a luv timer), then FINISH; the
-- latencies it took go to lat. first_end(), when given, is called as the
-- second root call starts.
local function options(env, pool, latency_ms, lat, uv, first_end)
  local calls = 0
  local function answered(t0)
    lat[#lat + 1] = common.now_ms() - t0
  end
  local root_llm
  if uv then
    root_llm = function(_, done)
      calls = calls + 1
      if calls > 1 then
        first_end()
        return FINISH
      end
      local t0 = common.now_ms()
      if latency_ms == 0 then
        answered(t0)
        return common.TRIVIAL
      end
      -- From now, not from the loop's cached time (the start ran since).
      uv.update_time()
      local t = uv.new_timer()
      t:start(latency_ms, 0, function()
        t:close()
        answered(t0)
        done(common.TRIVIAL)
      end)
    end
  else
    root_llm = function()
      calls = calls + 1
      if calls > 1 then
        return FINISH
      end
      local t0 = common.now_ms()
      if latency_ms > 0 then
        common.sleep(latency_ms)
      end
      answered(t0)
      return common.TRIVIAL
    end
  end
  return common.session_opts(env, { pool = pool, root_llm = root_llm })
end

-- One sample under step(): (ms to the first step's end, ms to checked).
local function blocking_sample(env, pool, latency_ms, lat)
  local t0 = common.now_ms()
  local s = rlm.Session.new(options(env, pool, latency_ms, lat))
  local entry, err = s:step()
  local ms = common.now_ms() - t0
  local checked = s.sandbox.start_times and s.sandbox.start_times.checked
  common.close_reaped(s)
  assert(checked, "the session has no start_times.checked")
  assert(entry and not entry.error, "the first step failed: " .. tostring(err or (entry and entry.error)))
  assert(not pool or s.sandbox.start == "warm", "a pooled sample started cold")
  return ms, checked - t0
end

-- One sample under the luv adapter, the session driven to its end.
local function luv_sample(env, pool, latency_ms, lat, uv, adapter)
  local t0, t_end, over, failure = common.now_ms(), nil, false, nil
  local s = rlm.Session.new(options(env, pool, latency_ms, lat, uv, function()
    t_end = common.now_ms()
  end))
  adapter.drive(s, function(err)
    failure, over = err and tostring(err), true
  end, uv)
  while not over do
    uv.run("once")
  end
  uv.run("nowait")
  local checked = s.sandbox.start_times and s.sandbox.start_times.checked
  common.close_reaped(s)
  assert(not failure, failure)
  assert(checked, "the session has no start_times.checked")
  assert(t_end, "the root model was not called a second time")
  assert(not pool or s.sandbox.start == "warm", "a pooled sample started cold")
  return t_end - t0, checked - t0
end

-- The row of one case (way, start, latency): its floor from base, the
-- samples of the same way and start with a model that answers at once.
local function row_for(way, start_name, latency_ms, m, base)
  local start, step = common.summary(base.start).median, common.summary(base.step).median
  local lat = common.summary(m.lat).median
  local floor = { median = math.max(start, lat) + step, n = #base.start }
  local sum = start + lat + step
  local row = common.time_row({
    figure = "11",
    name = ("first step's end, root model answering in %d ms: %s, %s"):format(latency_ms, start_name, way),
    stats = common.summary(m.total), floor = floor, max_ratio = 1.1,
    floor_name = ("max(%s, model latency) + one step"):format(start_name == "cold" and "cold start"
      or "warm take"),
  })
  row.note = ("the sum start + latency + step is %.4g ms (%.2fx the floor); start %.3g ms and step %.3g ms "
    .. "(medians, model answering at once, n=%d), latency %.4g ms (the stand-in's own); p90 %.4g ms")
    :format(sum, sum / floor.median, start, step, #base.start, lat, common.quantile(m.total, 0.9))
  return row
end

function M.run(env)
  local size = common.sizes(env, SIZES)
  local ok, uv = pcall(require, "luv")
  local adapter = ok and require("rlm.adapters.luv") or nil
  local pool = assert(rlm.Pool.new({ size = 1, sandbox = { tmpdir = env.tmpdir } }))

  -- samples[way][start][latency] = { total = {}, lat = {}, start = {}, step = {} }
  local ways = { { name = "step() (a blocking model)", key = "blocking" } }
  if adapter then
    ways[2] = { name = "luv adapter (the model answers from a timer)", key = "luv" }
  end
  local samples = {}
  for _, way in ipairs(ways) do
    samples[way.key] = {}
    for _, start in ipairs({ "cold", "warm" }) do
      samples[way.key][start] = {}
      for _, latency_ms in ipairs(LATENCIES) do
        samples[way.key][start][latency_ms] = { total = {}, lat = {}, start = {}, step = {} }
      end
    end
  end

  -- Rounds, each one sample of every case, so that a noisy neighbour lands
  -- on all of them alike.
  for _ = 1, size.rounds do
    for _, way in ipairs(ways) do
      for _, start in ipairs({ "cold", "warm" }) do
        for _, latency_ms in ipairs(LATENCIES) do
          -- The pool at rest before every sample, the cold ones too: the
          -- replacement of the last warm take boots meanwhile.
          common.settle_pool(pool)
          local p = start == "warm" and pool or nil
          local m = samples[way.key][start][latency_ms]
          local total, checked
          if way.key == "luv" then
            total, checked = luv_sample(env, p, latency_ms, m.lat, uv, adapter)
          else
            total, checked = blocking_sample(env, p, latency_ms, m.lat)
          end
          m.total[#m.total + 1] = total
          m.start[#m.start + 1] = checked
          m.step[#m.step + 1] = total - checked
        end
      end
    end
  end
  pool:close()

  local rows = {}
  for _, way in ipairs(ways) do
    for _, start in ipairs({ "cold", "warm" }) do
      local base = samples[way.key][start][0]
      for _, latency_ms in ipairs(LATENCIES) do
        if latency_ms > 0 then
          rows[#rows + 1] = row_for(way.name, start == "cold" and "cold" or "pool of 1 taken warm", latency_ms,
            samples[way.key][start][latency_ms], base)
        end
      end
      local t = common.summary(base.total)
      local row = common.context_row("11", ("  the same, model answering at once: %s, %s"):format(
        start == "cold" and "cold" or "pool of 1 taken warm", way.name), t.median, "ms", common.fmt_ms(t), t.n,
        ("start (Session.new to the sandbox checked) %.3g ms, then the first step %.3g ms: the floors' parts")
          :format(common.summary(base.start).median, common.summary(base.step).median))
      rows[#rows + 1] = row
    end
  end
  if not adapter then
    rows[#rows + 1] = { figure = "11", name = "first step's end under the luv adapter", text = "-",
      note = "luv is not installed (apt-get install lua-luv)" }
  end
  return rows
end

return M
