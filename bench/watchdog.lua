-- Figure 5, the memory limit: code that allocates as fast as Python can (1 MB
-- bytearrays appended to a list) under max_rss_bytes. Measured for the poll
-- alone at two intervals, and for the default setup, where a memory cgroup
-- (when the host may make one) runs beside the 50 ms poll. Reported: the
-- overshoot (err.peak, the peak the mechanism saw, less the limit) and the
-- time to kill (the step's start to the memory_limit error). Their
-- references come from the allocation rate measured in the same run (a
-- bounded loop in a fresh sandbox): an ideal poller can miss rate x
-- interval, and nothing kills before the limit is reached.
local common = require("bench.common")

local M = {}

local MB = common.MB

local SIZES = {
  full = { limit_mb = 256, calibrate_mb = 160, samples = 5 },
  tiny = { limit_mb = 96, calibrate_mb = 16, samples = 1 },
}

local CALIBRATE = [[
import time
t0 = time.perf_counter()
b = []
for i in range(%d):
    b.append(bytearray(1 << 20))
print((time.perf_counter() - t0) * 1000)
b = None
]]

local RUNAWAY = "b = []\nwhile True:\n    b.append(bytearray(1 << 20))\n"

local function fence(code)
  return "```repl\n" .. code .. "```"
end

-- MB per ms that the loop allocates, in a fresh driver like the runaway's.
local function allocation_rate(env, mb)
  local s, _, entry = common.start(env, { answer = fence(CALIBRATE:format(mb)), max_rss_bytes = 0 })
  s:close()
  local ms = tonumber(entry.stdout)
  return mb / ms
end

-- One runaway: (err, ms from the step's start to the error, the sandbox's
-- memory before the loop).
local function runaway(env, opts)
  local o = { answers = { common.TRIVIAL, fence(RUNAWAY) } }
  for k, v in pairs(opts) do
    o[k] = v
  end
  local s = common.start(env, o)
  local sandbox = common.sandboxes()
  local before = #sandbox == 1 and common.tree_rss(sandbox[1]) or 0
  local t0 = common.now_ms()
  local entry, err = s:step()
  local ms = common.now_ms() - t0
  s:close()
  assert(not entry, "the runaway loop was not stopped")
  assert(err.kind == "memory_limit", "expected memory_limit, got " .. tostring(err))
  return err, ms, before
end

-- "cgroup v1 5/5" or "poll 3/5, cgroup v1 2/5".
local function mechanisms(seen, n)
  local names, out = {}, {}
  for name in pairs(seen) do
    names[#names + 1] = name
  end
  table.sort(names)
  for _, name in ipairs(names) do
    out[#out + 1] = ("%s %d/%d"):format(name, seen[name], n)
  end
  return table.concat(out, ", ")
end

local function setup_rows(env, size, rate, setup, rows)
  local limit = size.limit_mb * MB
  local over, kill, reach, seen = {}, {}, {}, {}
  for i = 1, size.samples do
    local err, ms, before = runaway(env, setup.opts)
    over[i] = (err.peak - err.limit) / MB
    kill[i] = ms
    reach[i] = (limit - before) / MB / rate
    local m = tostring(err.mechanism)
    seen[m] = (seen[m] or 0) + 1
  end
  local o, k, r = common.summary(over), common.summary(kill), common.summary(reach)
  local note = ("max_rss_bytes %d MB; ended by %s; no target"):format(size.limit_mb,
    mechanisms(seen, size.samples))
  local row = {
    figure = "5", name = setup.name .. ": overshoot (peak - limit)",
    value = o.median, unit = "MB", n = o.n,
    text = ("+%.0f MB (peak %.0f MB), max +%.0f"):format(o.median, size.limit_mb + o.median,
      common.quantile(over, 1)),
    note = note,
  }
  if setup.interval then
    local ideal = rate * setup.interval
    row.floor = { name = "reference: allocation rate x interval, the most an ideal poller misses",
      value = ideal, n = size.samples,
      text = ("%.0f MB (%.2f MB/ms x %d ms)"):format(ideal, rate, setup.interval) }
    row.ratio, row.ratio_text = o.median / ideal, ("%.2fx"):format(o.median / ideal)
  else
    row.no_floor = "reference: 0 MB, the kernel refuses the page past the limit"
  end
  rows[#rows + 1] = row
  row = common.time_row({
    figure = "5", name = setup.name .. ": time to kill",
    stats = k, floor = r, floor_name = "reference: time that rate needs to fill the limit",
  })
  row.note = note
  rows[#rows + 1] = row
end

function M.run(env)
  local size = common.sizes(env, SIZES)
  local limit = size.limit_mb * MB
  local rates = {}
  for i = 1, size.samples do
    rates[i] = allocation_rate(env, size.calibrate_mb)
  end
  local rate = common.median(rates) -- MB/ms

  -- With a cgroup beside it, the poll would race the kernel: it is measured
  -- alone, then the default setup.
  local has_cgroup = common.has_option("sandbox", { memory_cgroup = false })
  local setups = {}
  for _, interval in ipairs({ 10, 50 }) do
    local opts = { max_rss_bytes = limit, sandbox = { rss_poll_interval_ms = interval } }
    if has_cgroup then
      opts.sandbox.memory_cgroup = false
    end
    setups[#setups + 1] = { name = ("poll alone, every %d ms"):format(interval), interval = interval, opts = opts }
  end
  if has_cgroup then
    setups[#setups + 1] = {
      name = "default: cgroup + poll every 50 ms",
      opts = { max_rss_bytes = limit, sandbox = { rss_poll_interval_ms = 50 } },
    }
  end
  local rows = {}
  for _, setup in ipairs(setups) do
    setup_rows(env, size, rate, setup, rows)
  end
  if not has_cgroup then
    rows[#rows + 1] = common.context_row("5", "memory cgroup", nil, nil, "not implemented", 0)
  end
  return rows
end

return M
