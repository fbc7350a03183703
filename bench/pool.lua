-- Figure 10, the warm pool (rlm.Pool): Session.new{pool = p} plus the first
-- step (the scripted root model answers `x = 1`) when the pool holds a
-- self-tested sandbox; beside it, in the same run, the cold start of
-- figure 1 and its floor (bubblewrap with the same binds running an echo
-- driver). Then nested sessions drawing from the pool: one rlm_query, and
-- rlm_query_batched of 8 from one exec. Before each sample the pool is
-- let refill until every sandbox is ready, so each sample is a warm take.
local common = require("bench.common")
local core = require("rlm.core")
local rlm = require("rlm")

local M = {}

local SIZES = {
  full = { warm = 40, cold = 10, nested = 10 },
  tiny = { warm = 3, cold = 2, nested = 2 },
}

local function sleep(ms)
  local ws = core.waitset()
  ws:wait(ms)
  ws:close()
end

-- Waits until every sandbox of the pool has run its self-test (all but
-- one while a root session's own replacement is still owed).
local function settle(pool, want)
  local t0 = common.now_ms()
  while true do
    local st = pool:stats()
    if st.ready >= (want or pool.size) and st.starting == 0 then
      break
    end
    if common.now_ms() - t0 > 60000 then
      error("the pool did not refill within 60 s")
    end
    sleep(5)
  end
end

local function p90(xs)
  return common.quantile(xs, 0.9)
end

local NESTED_ONE = "```repl\nimport time\nt0 = time.perf_counter()\nassert rlm_query('q') == 'q'\n"
  .. "print('%.3f' % ((time.perf_counter() - t0) * 1000))\n```"
local NESTED_EIGHT = "```repl\nimport time\nt0 = time.perf_counter()\n"
  .. "assert rlm_query_batched(['b'] * 8) == ['b'] * 8\n"
  .. "print('%.3f' % ((time.perf_counter() - t0) * 1000))\n```"

-- n steps of `code` in one root session from the pool, the pool refilled
-- before each: the ms each step's code timed.
local function nested(env, pool, code, n)
  local out = {}
  -- The root's first step is `x = 1`: its own replacement is spawned after
  -- it, and each measured step finds the pool full.
  local opts = common.session_opts(env, { pool = pool, max_depth = 2, max_iterations = n + 2,
    max_sub_calls = 8 * n + 8, answers = { common.TRIVIAL, code } })
  local root_llm = opts.root_llm
  opts.root_llm = function(messages)
    if messages[2].content:match("^Question: ") then
      return "```repl\nFINAL(context)\n```" -- a nested session: answer at once
    end
    settle(pool, #messages > 2 and pool.size or pool.size - 1)
    return root_llm(messages)
  end
  local s = rlm.Session.new(opts)
  common.step(s)
  for _ = 1, n do
    local _, entry = common.step(s)
    out[#out + 1] = tonumber(entry.stdout:match("[%d.]+"))
  end
  s:close()
  return out
end

function M.run(env)
  local size = common.sizes(env, SIZES)
  local pool = assert(rlm.Pool.new({ size = 8, tmpdir = env.tmpdir }))
  local warm, cold = {}, {}
  for i = 1, size.warm do
    settle(pool)
    local s, ms = common.start(env, { pool = pool })
    assert(s.start == "warm", "a sample started cold")
    s:close()
    warm[#warm + 1] = ms
    if i % 4 == 0 and #cold < size.cold then
      local c, cms = common.start(env)
      c:close()
      cold[#cold + 1] = cms
    end
  end
  while #cold < size.cold do
    local c, cms = common.start(env)
    c:close()
    cold[#cold + 1] = cms
  end
  local workdir = env.scratch .. "/pool-workdir"
  os.execute("mkdir -p " .. common.quote(workdir))
  local floor, why = common.floor(env, "first", 10, common.sandbox_echo_argv(env, workdir))
  common.remove_tree(workdir)
  local floor_stats = floor and #floor > 0 and common.summary(floor) or nil
  local floor_name = "bwrap (same binds) + echo driver, spawn to first answer"

  local one = nested(env, pool, NESTED_ONE, size.nested)
  local eight = nested(env, pool, NESTED_EIGHT, size.nested)
  local stats = pool:stats()
  pool:close()

  local w = common.summary(warm)
  local row = common.time_row({ figure = "10", name = "warm pool: Session.new{pool} + first step (x = 1)",
    stats = w, floor = floor_stats, floor_missing = why, floor_name = floor_name })
  row.target, row.met = "<= 2 ms median", w.median <= 2
  row.note = ("p90 %.3g ms; pool of 8, refilled before each sample; %d takes, %d cold"):format(p90(warm),
    stats.taken, stats.cold)
  local c = common.summary(cold)
  local cold_row = common.time_row({ figure = "10", name = "  the cold start in the same run (figure 1's)",
    stats = c, floor = floor_stats, floor_missing = why, floor_name = floor_name })
  cold_row.context = true
  cold_row.note = ("p90 %.3g ms"):format(p90(cold))
  local o, e = common.summary(one), common.summary(eight)
  local one_row = common.context_row("10", "  rlm_query from the pool: one nested session", o.median, "ms",
    common.fmt_ms(o), o.n, ("p90 %.3g ms; timed in the REPL"):format(p90(one)))
  local eight_row = common.time_row({ figure = "10", name = "rlm_query_batched of 8 nested sessions from the pool",
    stats = e, floor = o, floor_name = "one nested session from the pool (row above)", max_ratio = 2 })
  eight_row.note = ("p90 %.3g ms; timed in the REPL"):format(p90(eight))
  return { row, cold_row, one_row, eight_row }
end

return M
