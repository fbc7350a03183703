-- Figure 1, cold start: Session.new plus the first step, whose scripted root
-- model answers `x = 1` at once. That is the spawn, hello, configure,
-- self-test, context load and one exec. The floor is bubblewrap with the
-- real sandbox's binds running a driver that does nothing (echo_driver.py),
-- timed from the spawn to its answer to one line.
local common = require("bench.common")

local M = {}

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
  s:close()

  local workdir = env.scratch .. "/cold-start-workdir"
  os.execute("mkdir -p " .. common.quote(workdir))
  local sandboxed = common.sandbox_echo_argv(env, workdir)
  local real, floor, bare, floor_missing = {}, {}, {}, nil
  for _ = 1, size.rounds do
    local f, why = common.floor(env, "first", size.per_round, sandboxed)
    floor_missing = why
    for _, ms in ipairs(f or {}) do
      floor[#floor + 1] = ms
    end
    for _ = 1, size.per_round do
      local session, ms = common.start(env)
      session:close()
      real[#real + 1] = ms
    end
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
  })
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
