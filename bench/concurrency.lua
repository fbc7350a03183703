-- Figure 7, concurrent sub-calls: llm_query_batched of 64 prompts, each
-- answered by a callback that takes 50 ms (a luv timer), with the session
-- driven by the luv adapter. Each batch is timed inside the REPL
-- (time.perf_counter around the call), so the figure is the whole fan-out:
-- the batch message, 64 requests handed out, 64 answers back in their slots.
-- Floor: the same loop firing 64 timers of 50 ms started together, measured
-- by the root model's callback just before it asks for each batch.
local common = require("bench.common")

local M = {}

local SIZES = {
  full = { rounds = 20 },
  tiny = { rounds = 2 },
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
  return rows
end

return M
