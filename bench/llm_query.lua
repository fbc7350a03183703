-- Figure 3, llm_query round trip: one exec whose code calls llm_query in a
-- loop, answered by an echo callback in Lua. Each call is timed inside the
-- REPL (time.perf_counter_ns around the call), so the figure is the whole
-- trip: the driver's JSON, the pipes, the host's decoding, the callback and
-- the way back. Floors: the same pipe ping-pong as figure 2, and a "new TCP
-- connection per call" design (tcp_echo.py, outside the sandbox).
--
-- The target is against what the call stands for: a sub-call to a hosted
-- model waits 100 ms or more for it (network and inference: 10^4 to 10^5
-- times this round trip), so the round trip must stay under 0.1% of that,
-- 100 us. The floors say what the trip costs beside a bare pipe; they are
-- not targets (one reading and writing of each line, bench/RESULTS.md).
--
-- This machine's pipe latency drifts by several times within a minute, so
-- the floors are measured during the exec: every `chunk` calls, the callback
-- itself runs a slice of both floors before it answers. Those calls are left
-- out of the samples, and the floors' time out of the wall time. All of it
-- runs pinned to one CPU (see common.pin); the same without pinning is shown
-- beside it.
local common = require("bench.common")

local M = {}

local SIZES = {
  full = { calls = 10000, rounds = 10, trips = 10000, tcp = 10000 },
  tiny = { calls = 100, rounds = 2, trips = 100, tcp = 20 },
}

local CODE = [[
import time
clock = time.perf_counter_ns
samples = []
for i in range(%d):
    t0 = clock()
    llm_query("q")
    samples.append(clock() - t0)
print(" ".join(map(str, samples)))
]]

local PIPE_FLOOR = "C host <-> python echo driver, one line each way"

-- A real sub-call's least cost (ms), and the share of it the round trip may
-- take.
local SUB_CALL_MS, MAX_SHARE = 100, 0.001

-- One exec of size.calls calls: { calls =, floor =, tcp =, per_call =,
-- missing = }, times in ms.
local function measure(env, size)
  local chunk = math.floor(size.calls / size.rounds)
  local r = { floor = {}, tcp = {}, calls = {} }
  local n, aside = 0, 0
  local function measure_floors()
    local t0 = common.now_ms()
    local f, why = common.floor(env, "pingpong", math.floor(size.trips / size.rounds), common.echo_argv(env))
    r.missing = why
    for _, ms in ipairs(f or {}) do
      r.floor[#r.floor + 1] = ms
    end
    for _, ns in ipairs(common.python_json(env, "tcp_echo.py", { math.floor(size.tcp / size.rounds) })) do
      r.tcp[#r.tcp + 1] = ns / 1e6
    end
    aside = aside + common.now_ms() - t0
  end

  local s = common.start(env, {
    answers = { common.TRIVIAL, "```repl\n" .. CODE:format(size.calls) .. "```" },
    llm_query = function(prompt)
      n = n + 1
      if n % chunk == 0 then
        measure_floors()
      end
      return prompt
    end,
    max_iterations = 2,
    max_sub_calls = size.calls,
    stdout_truncate_chars = 16 * size.calls + 1000,
  })
  local ok, wall, entry = pcall(common.step, s)
  s:close()
  assert(ok, wall)

  local i = 0
  for ns in entry.stdout:gmatch("%d+") do
    i = i + 1
    if i % chunk ~= 0 then
      r.calls[#r.calls + 1] = tonumber(ns) / 1e6
    end
  end
  assert(i == size.calls, "the REPL reported " .. i .. " calls")
  r.per_call = (wall - aside) / (size.calls - size.rounds)
  return r
end

function M.run(env)
  local size = common.sizes(env, SIZES)
  local unpin, why_not = common.pin()
  local ok, r = pcall(measure, env, size)
  if unpin then
    unpin()
  end
  assert(ok, r)
  local loose = measure(env, size)

  local stats, tcp_stats = common.summary(r.calls), common.summary(r.tcp)
  local faster = tcp_stats.median / stats.median
  local trip = common.time_row({
    figure = "3", name = ("llm_query round trip, %d calls in one exec"):format(size.calls),
    stats = stats, fmt = common.fmt_us,
    floor = #r.floor > 0 and common.summary(r.floor) or nil, floor_missing = r.missing,
    floor_name = PIPE_FLOOR,
    note = ("%s; %d rounds, the %d calls that measured the floors left out; %.3f%% of a %d ms sub-call"):format(
      unpin and "all pinned to one CPU" or ("not pinned: " .. why_not), size.rounds, size.rounds,
      100 * stats.median / SUB_CALL_MS, SUB_CALL_MS),
  })
  trip.target = ("<= %g us (%g%% of a %d ms sub-call)"):format(SUB_CALL_MS * MAX_SHARE * 1000, MAX_SHARE * 100,
    SUB_CALL_MS)
  trip.met = stats.median <= SUB_CALL_MS * MAX_SHARE
  local rows = {
    trip,
    {
      figure = "3", name = "llm_query vs a new TCP connection per call",
      value = stats.median, unit = "ms", n = stats.n, text = common.fmt_us(stats),
      floor = { name = "python client -> python echo server, 127.0.0.1, connect per call",
        value = tcp_stats.median, n = tcp_stats.n, text = common.fmt_us(tcp_stats) },
      ratio = faster, ratio_text = ("%.2fx faster"):format(faster),
    },
    common.context_row("3", "llm_query: the exec's wall time / calls", r.per_call, "ms",
      ("%.1f us"):format(r.per_call * 1000), 1, "the floors' time taken out"),
  }
  local loose_stats, loose_tcp = common.summary(loose.calls), common.summary(loose.tcp)
  local row = common.time_row({
    figure = "3", name = "llm_query round trip, not pinned", stats = loose_stats, fmt = common.fmt_us,
    floor = #loose.floor > 0 and common.summary(loose.floor) or nil, floor_missing = loose.missing,
    floor_name = PIPE_FLOOR .. ", not pinned",
  })
  row.context = true
  row.note = ("as the scheduler places them; no target; TCP per call %s, %.2fx llm_query's")
    :format(common.fmt_us(loose_tcp), loose_tcp.median / loose_stats.median)
  rows[#rows + 1] = row
  return rows
end

return M
