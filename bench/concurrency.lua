-- Figure 7, concurrent sub-calls: llm_query_batched of 64 prompts, each
-- answered by a callback that takes 50 ms (a luv timer), with the session
-- driven by the luv adapter. Each batch is timed inside the REPL
-- (time.perf_counter around the call), so the figure is the whole fan-out:
-- the batch message, 64 requests handed out, 64 answers back in their slots.
-- Floor: the same loop firing 64 timers of 50 ms started together, measured
-- by the root model's callback just before it asks for each batch.
--
-- Beside it, what a nested session costs: rlm_query of a child that answers
-- at once, timed in the REPL, against figure 1's floor (bubblewrap with the
-- same binds and a driver that does nothing, spawn to first answer); and
-- rlm_query_batched of 8 such children.
local common = require("bench.common")
local rlm = require("rlm")

local M = {}

local SIZES = {
  full = { rounds = 20, nested = 20, batches = 5 },
  tiny = { rounds = 2, nested = 2, batches = 1 },
}

local FAN_OUT, LATENCY_MS = 64, 50

local CODE = [[
```repl
import time
t0 = time.perf_counter()
answers = llm_query_batched(['p%%d' %% i for i in range(%d)])
assert answers == ['p%%d' %% i for i in range(%d)], answers
print('%%.3f' %% ((time.perf_counter() - t0) * 1000))
```]]

-- rounds batches in one session, at most `cap` sub-calls in flight:
-- { batches = {ms...}, floors = {ms...} }.
local function measure(env, uv, adapter, rounds, cap)
  local r = { batches = {}, floors = {} }
  local code = CODE:format(FAN_OUT, FAN_OUT)

  local function after(ms, fn)
    local t = uv.new_timer()
    t:start(ms, 0, function()
      t:close()
      fn()
    end)
  end

  -- 64 timers of 50 ms started together; fn(ms) when the last has fired.
  local function floor(fn)
    local t0, left = common.now_ms(), FAN_OUT
    for _ = 1, FAN_OUT do
      after(LATENCY_MS, function()
        left = left - 1
        if left == 0 then
          fn(common.now_ms() - t0)
        end
      end)
    end
  end

  local turn, over, failure = 0, false, nil
  local opts = common.session_opts(env, {
    max_concurrent_sub_calls = cap,
    max_sub_calls = rounds * FAN_OUT,
    max_iterations = rounds + 1,
    root_llm = function(_, done)
      turn = turn + 1
      if turn > rounds then
        return "```repl\nFINAL('done')\n```"
      end
      floor(function(ms)
        r.floors[#r.floors + 1] = ms
        done(code)
      end)
    end,
    llm_query = function(prompt, done)
      after(LATENCY_MS, function()
        done(prompt)
      end)
    end,
    on_event = function(ev)
      if ev.type == "exec_result" then
        if ev.error then
          failure = ev.error
        else
          r.batches[#r.batches + 1] = tonumber(ev.stdout:match("[%d.]+"))
        end
      end
    end,
  })
  adapter.run(opts, function(err)
    failure = failure or (err and tostring(err))
    over = true
  end, uv)
  while not over do
    uv.run("once")
  end
  uv.run("nowait")
  assert(not failure, failure)
  assert(#r.batches == rounds, "expected " .. rounds .. " batches, got " .. #r.batches)
  return r
end

local NESTED = [[
```repl
import time
ts = []
for i in range(%d):
    t0 = time.perf_counter()
    assert rlm_query('q%%d' %% i) == 'q%%d' %% i
    ts.append((time.perf_counter() - t0) * 1000)
for i in range(%d):
    t0 = time.perf_counter()
    assert len(rlm_query_batched(['b'] * 8)) == 8
    ts.append(-(time.perf_counter() - t0) * 1000)
print(' '.join('%%.3f' %% t for t in ts))
```]]

-- n nested sessions one after another, then `batches` batches of 8:
-- { one = {ms...}, eight = {ms...} }.
local function measure_nested(env, size)
  local opts = common.session_opts(env, {
    max_depth = 2,
    max_sub_calls = size.nested + 8 * size.batches,
    answers = { NESTED:format(size.nested, size.batches), "```repl\nFINAL('done')\n```" },
  })
  local root_llm = opts.root_llm
  opts.root_llm = function(messages)
    if messages[2].content:match("^Question: ") then
      return "```repl\nFINAL(context)\n```" -- a nested session: answer at once
    end
    return root_llm(messages)
  end
  local s = rlm.Session.new(opts)
  local entry, err = s:step()
  s:close()
  assert(entry and not entry.error, tostring(err or (entry and entry.error)))
  local r = { one = {}, eight = {} }
  for t in entry.stdout:gmatch("%S+") do
    local ms = tonumber(t)
    if ms >= 0 then
      r.one[#r.one + 1] = ms
    else
      r.eight[#r.eight + 1] = -ms
    end
  end
  return r
end

local function nested_rows(env, size)
  local workdir = env.scratch .. "/concurrency-workdir"
  os.execute("mkdir -p " .. common.quote(workdir))
  local floor, why = common.floor(env, "first", 10, common.sandbox_echo_argv(env, workdir))
  common.remove_tree(workdir)
  local r = measure_nested(env, size)
  local floor_stats = floor and #floor > 0 and common.summary(floor) or nil
  local floor_name = "bwrap (same binds) + echo driver, spawn to first answer"
  local one = common.time_row({
    figure = "7", name = "rlm_query: a nested session that answers at once, one after another",
    stats = common.summary(r.one), floor = floor_stats, floor_missing = why, floor_name = floor_name,
  })
  one.context = true
  one.note = "timed in the REPL: spawn, self-test, context, one root turn and exec, teardown"
  local eight = common.time_row({
    figure = "7", name = "rlm_query_batched of 8 such nested sessions",
    stats = common.summary(r.eight), floor = floor_stats, floor_missing = why, floor_name = floor_name,
  })
  eight.context = true
  eight.note = ("%.2fx the one-at-a-time median per session; they start side by side on %s CPUs")
    :format(eight.value / 8 / one.value, common.capture({ "nproc" }):gsub("%s+", ""))
  return { one, eight }
end

function M.run(env)
  local ok, uv = pcall(require, "luv")
  local name = ("llm_query_batched of %d sub-calls of %d ms, all in flight"):format(FAN_OUT, LATENCY_MS)
  if not ok then
    return { { figure = "7", name = name, text = "-", note = "luv is not installed (apt-get install lua-luv)" } }
  end
  local adapter = require("rlm.adapters.luv")
  local size = common.sizes(env, SIZES)
  local all = measure(env, uv, adapter, size.rounds, FAN_OUT)
  local capped = measure(env, uv, adapter, size.rounds, 8)
  local floor_name = ("%d luv timers of %d ms started together, same loop"):format(FAN_OUT, LATENCY_MS)
  local rows = {
    common.time_row({
      figure = "7", name = name .. " (max_concurrent_sub_calls = 64)",
      stats = common.summary(all.batches), floor = common.summary(all.floors),
      floor_name = floor_name, max_ratio = 1.2,
      note = "timed in the REPL around the call; the luv adapter drives the session",
    }),
  }
  local row = common.time_row({
    figure = "7", name = "the same at the default max_concurrent_sub_calls = 8",
    stats = common.summary(capped.batches), floor = common.summary(capped.floors),
    floor_name = floor_name,
  })
  row.context = true
  row.note = ("8 waves: the cap at work; %.2fx of 8 x the floor"):format(
    row.value / (8 * row.floor.value))
  rows[#rows + 1] = row
  for _, r in ipairs(nested_rows(env, size)) do
    rows[#rows + 1] = r
  end
  return rows
end

return M
