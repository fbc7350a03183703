-- Figure 10, the warm pool (rlm.Pool): Session.new{pool = p} plus the first
-- step (the scripted root model answers `x = 1`) when the pool holds a
-- self-tested sandbox; beside it, in the same run, the cold start of
-- figure 1 and its floor (bubblewrap with the same binds running an echo
-- driver). Then nested sessions drawing from the pool: one rlm_query, and
-- rlm_query_batched of 8 from one exec. Before each sample the pool is
-- let refill until every sandbox is ready and at rest
-- (common.settle_pool), so each sample is a warm take.
local common = require("bench.common")
local core = require("rlm.core")
local rlm = require("rlm")

local M = {}

local SIZES = {
  full = { warm = 40, cold = 10, nested = 10 },
  tiny = { warm = 3, cold = 2, nested = 2 },
}

local function p90(xs)
  return common.quantile(xs, 0.9)
end

local NESTED_ONE = "```repl\nimport time\nt0 = time.perf_counter()\nassert rlm_query('q') == 'q'\n"
  .. "print('%.3f' % ((time.perf_counter() - t0) * 1000))\n```"
local NESTED_EIGHT = "```repl\nimport time\nt0 = time.perf_counter()\n"
  .. "assert rlm_query_batched(['b'] * 8) == ['b'] * 8\n"
  .. "print('%.3f' % ((time.perf_counter() - t0) * 1000))\n```"


-- What each nested session's root model answers: at once, or with code
-- that runs a while in its sandbox (as a step that works, or a model that
-- takes its time, would), which shows whether the batch's sessions run side
-- by side once the CPUs are not the limit.
local CHILD_AT_ONCE = "```repl\nFINAL(context)\n```"
local CHILD_WORK_MS = 20
local CHILD_WORKS = ("```repl\nimport time\ntime.sleep(%g)\nFINAL(context)\n```"):format(CHILD_WORK_MS / 1000)

-- n steps of `code` in one root session from the pool, the pool refilled
-- before each: the ms each step's code timed, and per step the CPU time
-- (ms) of the host's thread from the root model's answer to the step's end
-- less the pool's refill (and this function's own reads of /proc), of the
-- nested sessions' sandboxes from their take to their close, and of the
-- root's own sandbox. The nested sessions' root model answers child_answer
-- (CHILD_AT_ONCE unless given).
local function nested(env, pool, code, n, child_answer)
  local out, cpu = {}, { host = {}, children = {}, root = {} }
  local thread_ms = core.thread_cpu_ms
  local host0, children, refill = 0, 0, 0
  -- The replacements' spawns come after the batch (a refill), on the same
  -- thread: counted apart.
  local fill = pool._fill
  pool._fill = function(p)
    local c0 = thread_ms()
    fill(p)
    refill = refill + thread_ms() - c0
  end
  -- A nested sandbox's CPU from its take to its close; these reads of
  -- /proc are on the host's thread, and left out of its count.
  local at_take = setmetatable({}, { __mode = "k" })
  local take = pool._take
  pool._take = function(p)
    local entry = take(p)
    if entry then
      local c0 = thread_ms()
      at_take[entry.drv] = common.tree_cpu_ms(entry.drv)
      refill = refill + thread_ms() - c0
    end
    return entry
  end
  local close = rlm.Session.close
  local function counting_close(s)
    if s.parent and s.sandbox.driver and at_take[s.sandbox.driver] then
      local c0 = thread_ms()
      children = children + common.tree_cpu_ms(s.sandbox.driver) - at_take[s.sandbox.driver]
      refill = refill + thread_ms() - c0
    end
    return close(s)
  end
  rlm.Session.close = counting_close
  -- The root's first step is `x = 1`: its own replacement is spawned after
  -- it, and each measured step finds the pool full.
  local opts = common.session_opts(env, { pool = pool, max_depth = 2, max_iterations = n + 2,
    max_sub_calls = 8 * n + 8, answers = { common.TRIVIAL, code } })
  local root_llm = opts.root_llm
  opts.root_llm = function(messages)
    if messages[2].content:match("^Question: ") then
      return child_answer or CHILD_AT_ONCE -- a nested session
    end
    common.settle_pool(pool, #messages > 2 and pool.size or pool.size - 1)
    local answer = root_llm(messages)
    host0, children, refill = thread_ms(), 0, 0
    return answer
  end
  local s = rlm.Session.new(opts)
  local ok, err = pcall(function()
    common.step(s)
    for _ = 1, n do
      local root0 = common.tree_cpu_ms(s.sandbox.driver)
      local _, entry = common.step(s)
      out[#out + 1] = tonumber(entry.stdout:match("[%d.]+"))
      cpu.host[#cpu.host + 1] = thread_ms() - host0 - refill
      cpu.children[#cpu.children + 1] = children
      cpu.root[#cpu.root + 1] = common.tree_cpu_ms(s.sandbox.driver) - root0
    end
  end)
  rlm.Session.close = close
  s:close()
  pool._fill, pool._take = nil, nil
  if not ok then
    error(err, 0)
  end
  return out, cpu
end

function M.run(env)
  local size = common.sizes(env, SIZES)
  local pool = assert(rlm.Pool.new({ size = 8, sandbox = { tmpdir = env.tmpdir } }))
  local warm, cold, warm_cpu = {}, {}, {}
  -- A cold start as figure 1 takes it: nothing else of ours running (the
  -- last take's replacement booted, the last sandbox reaped).
  local function cold_start()
    common.settle_pool(pool)
    local c, cms = common.start(env)
    common.close_reaped(c)
    cold[#cold + 1] = cms
  end
  for i = 1, size.warm do
    common.settle_pool(pool)
    warm[#warm + 1], warm_cpu[#warm_cpu + 1] = common.warm_take(env, pool)
    if i % 4 == 0 and #cold < size.cold then
      cold_start()
    end
  end
  while #cold < size.cold do
    cold_start()
  end
  local workdir = env.scratch .. "/pool-workdir"
  os.execute("mkdir -p " .. common.quote(workdir))
  local floor, why = common.floor(env, "first", 10, common.sandbox_echo_argv(env, workdir))
  common.remove_tree(workdir)
  local floor_stats = floor and #floor > 0 and common.summary(floor) or nil
  local floor_name = "bwrap (same binds) + echo driver, spawn to first answer"

  local one, one_cpu = nested(env, pool, NESTED_ONE, size.nested)
  local eight, eight_cpu = nested(env, pool, NESTED_EIGHT, size.nested)
  local one_work = nested(env, pool, NESTED_ONE, size.nested, CHILD_WORKS)
  local eight_work = nested(env, pool, NESTED_EIGHT, size.nested, CHILD_WORKS)
  local stats = pool:stats()
  pool:close()

  local w = common.summary(warm)
  local row = common.time_row({ figure = "10", name = "warm pool: Session.new{pool} + first step (x = 1)",
    stats = w, floor = floor_stats, floor_missing = why, floor_name = floor_name })
  row.target, row.met = "<= 2 ms median", w.median <= 2
  row.note = ("p90 %.3g ms; the host's thread uses %.3g ms of it (CPU time, median); pool of 8, refilled "
    .. "before each sample; %d takes, %d cold"):format(p90(warm), common.summary(warm_cpu).median, stats.taken,
    stats.cold)
  local c = common.summary(cold)
  local cold_row = common.time_row({ figure = "10", name = "  the cold start in the same run (figure 1's)",
    stats = c, floor = floor_stats, floor_missing = why, floor_name = floor_name })
  cold_row.context = true
  cold_row.note = ("p90 %.3g ms"):format(p90(cold))
  local o, e = common.summary(one), common.summary(eight)
  local one_row = common.context_row("10", "  rlm_query from the pool: one nested session", o.median, "ms",
    common.fmt_ms(o), o.n, ("p90 %.3g ms; timed in the REPL"):format(p90(one)))
  -- The batch's floor on this machine: its CPU time (the host's thread, the
  -- 8 nested sandboxes, the root's) over its CPUs, or the host's thread
  -- alone (it serves the 8 one after another), whichever is longer.
  local med = function(xs)
    return common.summary(xs).median
  end
  local host, kids, rootd = med(eight_cpu.host), med(eight_cpu.children), med(eight_cpu.root)
  local p = io.popen("nproc")
  local cores = tonumber(p:read("*l") or "") or 1
  p:close()
  local cpu_floor = { median = math.max(host, (host + kids + rootd) / cores), n = #eight_cpu.host }
  local eight_row = common.time_row({ figure = "10", name = "rlm_query_batched of 8 nested sessions from the pool",
    stats = e, floor = cpu_floor, floor_name = ("the batch's CPU time: max(host thread, all / %d CPUs)"):format(cores),
    max_ratio = 1.5 })
  eight_row.note = ("p90 %.3g ms; timed in the REPL; %.2fx one nested session (the row above); CPU per batch "
    .. "(medians): host thread %.3g ms, 8 nested sandboxes %.3g ms, root's sandbox %.3g ms; one nested "
    .. "session's host thread uses %.3g ms, its sandbox %.3g ms")
    :format(p90(eight), e.median / o.median, host, kids, rootd, med(one_cpu.host), med(one_cpu.children))
  local ow, ew = common.summary(one_work), common.summary(eight_work)
  local work_row = common.time_row({ figure = "10",
    name = ("rlm_query_batched of 8 from the pool, each session's code running %d ms (time.sleep)")
      :format(CHILD_WORK_MS),
    stats = ew, floor = ow, floor_name = ("one such nested session from the pool (its code running %d ms)")
      :format(CHILD_WORK_MS), max_ratio = 1.3 })
  work_row.note = ("p90 %.3g ms; timed in the REPL; with work that does not need the CPUs, the sessions of a "
    .. "batch run side by side"):format(p90(eight_work))
  return { row, cold_row, one_row, eight_row, work_row }
end

return M
