-- Figure 17, the podman backend (sandbox = { backend = "podman" }): a
-- session whose sandbox is a new container of the image make image builds
-- (imported into a Podman store of the figure's own, as spec/podman_spec.lua
-- does), against the local backend in the same run. Cold start as figure
-- 1's (Session.new + the first step, x = 1), the two taking turns in
-- rounds, each sample once rlm.core's teardown of the last one is over (for
-- the container: its client has exited, --rm has removed it); the first
-- session of each (the Lua state's interpreter probe; the engine's first
-- `ps` and the image's first container) shown on its own. Beside it the
-- start's phases (medians, ms from Session.new). Step round trip as figure
-- 15's, one session each, pinned to one CPU, in rounds. A warm take: a
-- pool of one container, let settle, then Session.new{pool} + the first
-- step, beside the same take from a pool of the local backend. Where
-- Podman or the image's tarball is missing, one row says so.
local common = require("bench.common")
local P = require("spec.helpers.podman")
local rlm = require("rlm")

local M = {}

local SIZES = {
  full = { rounds = 5, per_round = 2, steps = 1000, step_rounds = 5, warm = 10 },
  tiny = { rounds = 1, per_round = 1, steps = 10, step_rounds = 1, warm = 1 },
}

local function note_row(name, note)
  return { figure = "17", name = name, text = "-", note = note }
end

local function close_settled(s)
  common.close_settled(s, 10000)
end

local PHASES = {
  { "rlm-keeper's hello read by the host (podman run to the keeper's start)", function(s, t)
    return s.sandbox.driver.hello_at and s.sandbox.driver.hello_at - t.begin
  end },
  { "ready read by the host", function(_, t)
    return t.ready and t.ready - t.begin
  end },
  { "its checks over", function(_, t)
    return t.checked and t.checked - t.begin
  end },
}

-- A pool's sandboxes all started and idle: stats' ready, and no CPU left
-- to a start (its warm-up too), looked at for 50 ms.
local function settle(pool)
  local t0 = common.now_ms()
  while true do
    local st = pool:stats()
    if st.ready >= pool.size and st.starting == 0 then
      break
    end
    assert(common.now_ms() - t0 < 60000, "the pool did not refill within 60 s")
    common.sleep(5)
  end
  common.sleep(50)
end

local function warm(env, sandbox, n)
  local sb = { tmpdir = env.tmpdir }
  for k, v in pairs(sandbox or {}) do
    sb[k] = v
  end
  local pool = assert(rlm.Pool.new({ size = 1, sandbox = sb }))
  local out = {}
  local ok, err = pcall(function()
    for _ = 1, n do
      settle(pool)
      out[#out + 1] = common.warm_take(env, pool)
    end
  end)
  pool:close()
  assert(ok, err)
  return out
end

local function figure(env, size, store)
  local podman = { backend = "podman", global_args = store.global, runtime = store.runtime, ulimits = P.ULIMITS,
    name = "rlm-bench" }
  local list = {
    { name = "local", label = "the local backend" },
    { name = "podman", label = "the podman backend", sandbox = podman },
  }
  local rows = {}
  local firsts = {}
  for _, b in ipairs(list) do
    local s, ms = common.start(env, { sandbox = b.sandbox })
    close_settled(s)
    firsts[#firsts + 1] = ("%s %.3g ms"):format(b.name, ms)
    b.first = ms
  end

  local cold = { ["local"] = {}, podman = {} }
  local phases = {}
  for i = 1, #PHASES do
    phases[i] = {}
  end
  for _ = 1, size.rounds do
    for _, b in ipairs(list) do
      for _ = 1, size.per_round do
        local s, ms = common.start(env, { sandbox = b.sandbox })
        local xs = cold[b.name]
        xs[#xs + 1] = ms
        if b.sandbox then
          for i, p in ipairs(PHASES) do
            local v = p[2](s, s.sandbox.start_times)
            if v then
              phases[i][#phases[i] + 1] = v
            end
          end
        end
        close_settled(s)
      end
    end
  end
  local local_cold = common.summary(cold["local"])
  local podman_cold = common.summary(cold.podman)
  rows[#rows + 1] = common.time_row({
    figure = "17", name = "cold start, the podman backend (a new container)", stats = podman_cold, floor = local_cold,
    floor_name = "cold start, the local backend, same run",
    note = "Session.new + first step (x = 1); each sample a new container, run -i --rm --log-driver=passthrough "
      .. "and the boundary's flags; the keeper's probe cached in the image",
  })
  for i, p in ipairs(PHASES) do
    if #phases[i] > 0 then
      rows[#rows + 1] = common.context_row("17", "  phase, ms from Session.new: " .. p[1],
        common.median(phases[i]), "ms", ("%.3g ms"):format(common.median(phases[i])), #phases[i])
    end
  end
  rows[#rows + 1] = common.context_row("17", "first session of each", list[2].first, "ms",
    table.concat(firsts, ", "), 1, "the host's interpreter probe (local); the engine's first ps (the sweep of "
      .. "containers left by a killed host) and its first container (podman)")

  -- Steps: one session each, in rounds that take turns.
  local sessions, times = {}, { ["local"] = {}, podman = {} }
  for _, b in ipairs(list) do
    sessions[b.name] = common.start(env, { sandbox = b.sandbox, max_iterations = size.steps + 1 })
  end
  local unpin, why_not = common.pin()
  local ok, err = pcall(function()
    local per = math.floor(size.steps / size.step_rounds)
    for _ = 1, size.step_rounds do
      for _, b in ipairs(list) do
        for _ = 1, per do
          local t = times[b.name]
          t[#t + 1] = common.step(sessions[b.name])
        end
      end
    end
  end)
  if unpin then
    unpin()
  end
  for _, s in pairs(sessions) do
    close_settled(s)
  end
  assert(ok, err)
  rows[#rows + 1] = common.time_row({
    figure = "17", name = "step round trip, " .. list[2].label, stats = common.summary(times.podman),
    fmt = common.fmt_us, floor = common.summary(times["local"]),
    floor_name = "step round trip, the local backend, same run", max_ratio = 2,
    note = ("%s; %d rounds taking turns; the stream's pipes are the container's stdio (passthrough)")
      :format(unpin and "pinned to one CPU" or ("not pinned: " .. why_not), size.step_rounds),
  })

  -- Warm takes: a pool of one of each, let settle before each take.
  local local_warm = common.summary(warm(env, nil, size.warm))
  local podman_warm = common.summary(warm(env, podman, size.warm))
  rows[#rows + 1] = common.time_row({
    figure = "17", name = "warm pool take, the podman backend: Session.new{pool} + first step", stats = podman_warm,
    floor = local_warm, floor_name = "the same take from a pool of the local backend, same run",
    note = ("the podman cold start in the same run: %.3g ms (%.2fx this take)")
      :format(podman_cold.median, podman_cold.median / podman_warm.median),
  })
  return rows
end

function M.run(env)
  local size = common.sizes(env, SIZES)
  local version = rlm._VERSION:match("^rlm (%S+)$")
  local store, why = P.store(env.root .. "/build/rlm-sandbox-" .. version .. ".tar",
    "localhost/rlm-sandbox:" .. version, env.root)
  if not store then
    return { note_row("the podman backend: cold start, step, warm take", why) }
  end
  local ok, rows = pcall(figure, env, size, store)
  store:teardown()
  assert(ok, rows)
  return rows
end

return M
