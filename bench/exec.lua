-- Figure 15, the exec backend: the same session with its sandbox at the far
-- end of a byte stream (rlm-keeper, docs/protocol.md "The stream"), through
-- processes that only copy bytes (sh -c 'cat | rlm-keeper | cat') and over
-- a direct pipe to rlm-keeper, against the local backend in the same run.
-- Cold start: Session.new plus the first step (x = 1), the three backends
-- taking turns in rounds, each sample once the last one's far side has
-- ended; the keeper's probe cache is filled by a first session (shown on
-- its own), as an image's build fills it (rlm-keeper --probe). Beside it,
-- the start's phases (medians, from Session.new): the keeper's hello read
-- by the host, the driver's first line (its own stamp), its hello read,
-- ready read, the first step's end. Step round trip: many steps of one
-- session per backend, pinned to one CPU as figure 2's are; the pipe
-- floors, direct and through the same two cats, measured in the same run.
-- And over TCP to a keeper that listens (rlm-keeper --listen on 127.0.0.1,
-- sandbox.connect: issue 42's direct path), each sample's keeper started
-- and listening before its Session.new, as a warm pod's is.
local common = require("bench.common")

local M = {}

local SIZES = {
  full = { rounds = 6, per_round = 5, steps = 1000, step_rounds = 5, trips = 2000 },
  tiny = { rounds = 1, per_round = 2, steps = 10, step_rounds = 1, trips = 50 },
}

-- The three ways a session's sandbox runs here.
local function backends(env)
  local keeper = env.root .. "/build/rlm-keeper"
  local cache = env.scratch .. "/keeper-cache"
  local k = common.quote(keeper) .. " --cache " .. common.quote(cache)
  return {
    { name = "local", label = "the local backend (bubblewrap beside the host)" },
    { name = "relay", label = "exec through sh -c 'cat | rlm-keeper | cat'",
      sandbox = { backend = "exec", argv = { "sh", "-c", "cat | " .. k .. " | cat" } } },
    { name = "direct", label = "exec over a direct pipe to rlm-keeper",
      sandbox = { backend = "exec", argv = { keeper, "--cache", cache } } },
    { name = "tcp", label = "exec over TCP to rlm-keeper --listen (sandbox.connect)",
      fresh = function()
        return M.listening(env, keeper, cache)
      end },
  }
end

-- A keeper listening on 127.0.0.1 (a port of the kernel's choosing, which
-- it says on stderr), its token in a file of its own: the sandbox option
-- that reaches it. It serves one session and ends with it.
local made = 0
function M.listening(env, keeper, cache)
  made = made + 1
  local dir = env.scratch .. "/listen"
  os.execute("mkdir -p " .. common.quote(dir))
  local token = ("%08x"):format(made):rep(4)
  local tok, log = ("%s/token-%d"):format(dir, made), ("%s/keeper-%d.log"):format(dir, made)
  common.write_file(tok, token .. "\n")
  os.execute(("chmod 600 %s; %s --cache %s --listen 127.0.0.1:0 --token-file %s </dev/null >/dev/null 2>%s &")
    :format(common.quote(tok), common.quote(keeper), common.quote(cache), common.quote(tok), common.quote(log)))
  local t0 = common.now_ms()
  while common.now_ms() - t0 < 10000 do
    local port = tonumber((common.read_file(log) or ""):match("listening on 127%.0%.0%.1:(%d+)"))
    if port then
      return { backend = "exec", connect = { host = "127.0.0.1", port = port, token = token } }
    end
    common.sleep(1)
  end
  error("rlm-keeper --listen said no port within 10 s: " .. tostring(common.read_file(log)))
end

local function close_settled(s)
  common.close_settled(s, 5000)
end

-- The phases of one start, ms from Session.new.
local PHASES = {
  { "rlm-keeper's hello read by the host", function(s, t)
    return s.sandbox.driver.hello_at and s.sandbox.driver.hello_at - t.begin
  end },
  { "the driver's first line (its own stamp)", function(_, t)
    return t.interpreter and t.interpreter[1] - t.begin
  end },
  { "the driver's hello read by the host", function(_, t)
    return t.hello and t.hello - t.begin
  end },
  { "ready read by the host", function(_, t)
    return t.ready and t.ready - t.begin
  end },
  { "its checks over", function(_, t)
    return t.checked and t.checked - t.begin
  end },
}

local function cold(env, size, list)
  local out = {}
  for _, b in ipairs(list) do
    out[b.name] = { total = {}, phases = {} }
    for i = 1, #PHASES do
      out[b.name].phases[i] = {}
    end
  end
  for _ = 1, size.rounds do
    for _, b in ipairs(list) do
      for _ = 1, size.per_round do
        local s, ms = common.start(env, { sandbox = b.fresh and b.fresh() or b.sandbox })
        local t = s.sandbox.start_times
        local o = out[b.name]
        o.total[#o.total + 1] = ms
        for i, p in ipairs(PHASES) do
          local v = p[2](s, t)
          if v then
            o.phases[i][#o.phases[i] + 1] = v
          end
        end
        close_settled(s)
      end
    end
  end
  return out
end

-- Steps of one session per backend, in rounds that take turns, each round
-- after a chunk of both pipe floors.
local function steps(env, size, list)
  local per = math.floor(size.steps / size.step_rounds)
  local trips = math.floor(size.trips / size.step_rounds)
  local sessions, times = {}, { floor = {}, floor_relay = {} }
  for _, b in ipairs(list) do
    sessions[b.name] = common.start(env, { sandbox = b.fresh and b.fresh() or b.sandbox,
      max_iterations = size.steps + 1 })
    times[b.name] = {}
  end
  local echo = common.echo_argv(env)
  local relayed = { "/bin/sh", "-c", "cat | " .. table.concat({ common.quote(echo[1]), echo[2], echo[3],
    common.quote(echo[4]) }, " ") .. " | cat" }
  local ok, err = pcall(function()
    for _ = 1, size.step_rounds do
      for _, ms in ipairs(common.floor(env, "pingpong", trips, echo) or {}) do
        times.floor[#times.floor + 1] = ms
      end
      for _, ms in ipairs(common.floor(env, "pingpong", trips, relayed) or {}) do
        times.floor_relay[#times.floor_relay + 1] = ms
      end
      for _, b in ipairs(list) do
        for _ = 1, per do
          local t = times[b.name]
          t[#t + 1] = common.step(sessions[b.name])
        end
      end
    end
  end)
  for _, s in pairs(sessions) do
    close_settled(s)
  end
  assert(ok, err)
  return times
end

function M.run(env)
  local size = common.sizes(env, SIZES)
  local list = backends(env)
  local rows = {}
  os.execute("mkdir -p " .. common.quote(env.scratch .. "/keeper-cache"))

  -- The first session of each: the Lua state's interpreter probe (local),
  -- the keeper's probe that fills its cache (exec).
  local firsts, first_relay = {}, 0
  for _, b in ipairs(list) do
    local s, ms = common.start(env, { sandbox = b.fresh and b.fresh() or b.sandbox })
    close_settled(s)
    firsts[#firsts + 1] = ("%s %.3g ms"):format(b.name, ms)
    first_relay = b.name == "relay" and ms or first_relay
  end

  local c = cold(env, size, list)
  local base = common.summary(c["local"].total)
  for _, b in ipairs(list) do
    if b.name ~= "local" then
      rows[#rows + 1] = common.time_row({
        figure = "15", name = "cold start, " .. b.label, stats = common.summary(c[b.name].total),
        floor = base, floor_name = "cold start, the local backend, same run", max_ratio = 1.5,
        note = "Session.new + first step (x = 1); the keeper's probe cached, as an image's build leaves it",
      })
    end
  end
  for i, p in ipairs(PHASES) do
    local cells = {}
    for _, b in ipairs(list) do
      local xs = c[b.name].phases[i]
      if #xs > 0 then
        cells[#cells + 1] = ("%s %.3g"):format(b.name, common.median(xs))
      end
    end
    local relay = c.relay.phases[i]
    if #relay > 0 then
      rows[#rows + 1] = common.context_row("15", "  phase, ms from Session.new: " .. p[1],
        common.median(relay), "ms", table.concat(cells, ", ") .. " ms", #relay)
    end
  end
  rows[#rows + 1] = common.context_row("15", "first session of each (probes: the host's, the keeper's)",
    first_relay, "ms", table.concat(firsts, ", "), 1, "the keeper's first start probes its interpreter and fills "
      .. "--cache; an image does that at build time")

  local unpin, why_not = common.pin()
  local ok, t = pcall(steps, env, size, list)
  if unpin then
    unpin()
  end
  assert(ok, t)
  local local_steps = common.summary(t["local"])
  local pinned = unpin and "pinned to one CPU" or ("not pinned: " .. why_not)
  for _, b in ipairs(list) do
    if b.name ~= "local" then
      rows[#rows + 1] = common.time_row({
        figure = "15", name = "step round trip, " .. b.label, stats = common.summary(t[b.name]),
        fmt = common.fmt_us, floor = local_steps, floor_name = "step round trip, the local backend, same run",
        max_ratio = 2, note = ("%s; %d rounds, each backend's steps after a chunk of both pipe floors")
          :format(pinned, size.step_rounds),
      })
    end
  end
  if #t.floor > 0 then
    local direct, relayed = common.summary(t.floor), common.summary(t.floor_relay)
    local row = common.time_row({ figure = "15", name = "  pipe floor: C host <-> python echo driver through two cats",
      stats = relayed, fmt = common.fmt_us, floor = direct, floor_name = "the same, a direct pipe" })
    row.context = true
    row.note = "what the relay's two extra hops each way cost at the bottom; no target"
    rows[#rows + 1] = row
  end
  return rows
end

return M
