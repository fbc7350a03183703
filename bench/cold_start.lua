-- Figure 1, cold start: Session.new plus the first step, whose scripted root
-- model answers `x = 1` at once. That is the spawn, hello, configure,
-- self-test, context load and one exec. The floor is bubblewrap with the
-- real sandbox's binds running a driver that does nothing (echo_driver.py),
-- copied in as the real driver is (common.sandbox_echo_argv), timed from
-- the spawn to its answer to one line.
--
-- Beside it, the start's phases (medians), each beside the floor's part
-- where the floor has one: the session's own stamps (rlm.engine.boot's
-- start_times: the host's clock, bubblewrap's exec from the keeper, and the
-- driver's monotonic stamps in its replies), the floor's from
-- floor_pingpong's `phases` mode. The driver says hello before it imports
-- its package, so its imports are the span from the hello to its reading of
-- configure (the host moves it into its cgroup meanwhile), and the host's
-- descriptor check comes after `ready`.
local common = require("bench.common")

local M = {}

-- The phases: name, the session's span, the floor's part (index into the
-- four floor_pingpong prints, or nil: the floor does no such thing).
local PHASES = {
  { "host: Session.new to the spawn (probe cached, canaries, argv)", function(t) return t.spawn - t.begin end },
  { "spawn to bubblewrap's exec (keeper, uid, staging)", function(t) return t.exec - t.spawn end, 1 },
  { "bubblewrap's exec to the driver's first line", function(t) return t.interpreter[1] - t.exec end, 2 },
  { "driver's first line to its hello read by the host", function(t) return t.hello - t.interpreter[1] end, 3 },
  { "driver's imports, beside the host's cgroup move (hello to configure)",
    function(t) return t.configure[1] - t.hello end },
  { "configure (rlimits, sys.path)", function(t) return t.configure[2] - t.configure[1] end },
  -- The host sent self_test with configure: the driver's reply and its
  -- read of the next line.
  { "configure's end to self_test read", function(t) return t.self_test[1] - t.configure[2] end },
  { "self-test", function(t) return t.self_test[2] - t.self_test[1] end },
  -- The driver's warm-up ran here once; it now waits until the driver is
  -- idle (after ready, while the host checks), so this is the pipe alone.
  { "self-test's end to load_context read", function(t) return t.context[1] - t.self_test[2] end },
  { "context load", function(t) return t.context[2] - t.context[1] end },
  { "context's end to ready read by the host", function(t) return t.ready - t.context[2] end },
  { "ready, read by the host, to its descriptor check's end", function(t) return t.checked - t.ready end },
  { "checked to the first step's end (one exec)", function(t, total) return total - (t.checked - t.begin) end, 4 },
}

-- What floor_pingpong's four parts are.
local FLOOR_PARTS = {
  "spawn to bubblewrap's exec", "exec to the echo driver's first line",
  "that to its hello read", "one line's round trip",
}

-- n samples of the floor in parts: { total = {...}, [1..4] = {...} }, or nil
-- and why.
local function floor_phases(env, n, argv)
  local exe, why = common.helper(env)
  if not exe then
    return nil, why
  end
  local ns = {}
  for x in common.capture(common.floor_command(exe, "phases", n, argv)):gmatch("%-?%d+") do
    ns[#ns + 1] = tonumber(x) / 1e6
  end
  if #ns ~= 4 * n then
    error(("floor_pingpong phases printed %d numbers, not %d"):format(#ns, 4 * n))
  end
  local out = { total = {}, {}, {}, {}, {} }
  for i = 0, n - 1 do
    local sum = 0
    for k = 1, 4 do
      out[k][#out[k] + 1] = ns[4 * i + k]
      sum = sum + ns[4 * i + k]
    end
    out.total[#out.total + 1] = sum
  end
  return out
end

-- Rounds alternate floor, rlm and bare Python samples, so that a noisy
-- neighbour lands on all three alike.
local SIZES = {
  full = { rounds = 6, per_round = 5 },
  tiny = { rounds = 1, per_round = 2 },
}

function M.run(env)
  local size = common.sizes(env, SIZES)
  local rows = {}

  -- The first session of a Lua state also asks the interpreter where its
  -- installation lives (once per process); it is shown on its own.
  local s, first_ms = common.start(env)
  common.close_reaped(s)

  local workdir = env.scratch .. "/cold-start-workdir"
  os.execute("mkdir -p " .. common.quote(workdir))
  local sandboxed = common.sandbox_echo_argv(env, workdir)
  local real, floor, bare, overlapped, floor_missing = {}, {}, {}, {}, nil
  local phases, floor_parts = {}, { {}, {}, {}, {} }
  for i = 1, #PHASES do
    phases[i] = {}
  end
  for _ = 1, size.rounds do
    local f, why = floor_phases(env, size.per_round, sandboxed)
    floor_missing = why
    if f then
      for k = 1, 4 do
        for _, ms in ipairs(f[k]) do
          floor_parts[k][#floor_parts[k] + 1] = ms
        end
      end
    end
    for _, ms in ipairs(f and f.total or {}) do
      floor[#floor + 1] = ms
    end
    for _ = 1, size.per_round do
      local session, ms = common.start(env)
      local t = session.sandbox.start_times
      common.close_reaped(session)
      real[#real + 1] = ms
      if t and t.exec and t.interpreter and t.configure and t.self_test and t.context and t.ready
          and t.checked then
        for i, p in ipairs(PHASES) do
          local x = phases[i]
          x[#x + 1] = p[2](t, ms)
        end
      end
    end
    -- Back to back: each start right after the last one's close, whose
    -- sandbox the kernel is still tearing down.
    local last = common.start(env)
    for _ = 1, size.per_round do
      last:close()
      local session, ms = common.start(env)
      last, overlapped[#overlapped + 1] = session, ms
    end
    common.close_reaped(last)
    local b = common.floor(env, "exit", size.per_round, { env.python, "-I", "-S", "-c", "pass" })
    for _, ms in ipairs(b or {}) do
      bare[#bare + 1] = ms
    end
  end
  common.remove_tree(workdir)

  rows[#rows + 1] = common.time_row({
    figure = "1", name = "cold start: Session.new + first step (x = 1)",
    stats = common.summary(real),
    floor = #floor > 0 and common.summary(floor) or nil, floor_missing = floor_missing,
    floor_name = "bwrap (same binds) + echo driver, spawn to first answer",
    max_ratio = 1.3,
    note = "the floor's driver is copied in as the real one is (--perms 0444 --file); "
      .. "it has no seccomp filter, zip, staging or uid of its own; each sample starts once the last "
      .. "one's sandbox is reaped, as each of the floor's does",
  })
  for i, p in ipairs(PHASES) do
    if #phases[i] > 0 then
      local k, name = p[3], "  phase: " .. p[1]
      local stats = common.summary(phases[i])
      if k and #floor_parts[k] > 0 then
        rows[#rows + 1] = common.time_row({ figure = "1", name = name, stats = stats,
          floor = common.summary(floor_parts[k]), floor_name = "the floor's part: " .. FLOOR_PARTS[k] })
      else
        local row = common.context_row("1", name, stats.median, "ms", common.fmt_ms(stats), stats.n)
        row.no_floor = "none: the floor does no such thing"
        rows[#rows + 1] = row
      end
    end
  end
  local o = common.summary(overlapped)
  rows[#rows + 1] = common.context_row("1", "  the same, back to back: each start right after the last one's close",
    o.median, "ms", common.fmt_ms(o), o.n, ("%s the floor; the closed sandbox's teardown (the kernel's, "
      .. "on the keeper's and the sandbox's own threads) overlaps the start"):format(#floor > 0
      and ("%.2fx"):format(o.median / common.summary(floor).median) or "no"))
  if #bare > 0 then
    local b = common.summary(bare)
    rows[#rows + 1] = common.context_row("1", "python3 -I -S -c pass, spawn to exit",
      b.median, "ms", common.fmt_ms(b), b.n)
  end
  rows[#rows + 1] = common.context_row("1", "first session of the process (+ interpreter probe)",
    first_ms, "ms", ("%.3g ms"):format(first_ms), 1,
    "the probe runs once per Lua state; only meaningful when this figure runs first")
  return rows
end

return M
