-- Figure 9, host tool round trip: one exec whose code calls a host tool
-- (add(i, y=1), a Lua function) 1,000 times, each call timed inside the REPL
-- with time.perf_counter_ns; the floor is llm_query's round trip (figure 3),
-- measured in the same session, the two execs taking turns. A tool call
-- carries JSON arguments and a JSON result where llm_query carries strings;
-- both travel the same pipes and the same dispatch.
local common = require("bench.common")

local M = {}

local SIZES = {
  full = { calls = 1000, rounds = 10 },
  tiny = { calls = 100, rounds = 1 },
}

local CODE = [[
import time
clock = time.perf_counter_ns
samples = []
for i in range(%d):
    t0 = clock()
    %s
    samples.append(clock() - t0)
print(" ".join(map(str, samples)))
]]

local function samples(entry, n, into)
  local i = 0
  for ns in entry.stdout:gmatch("%d+") do
    i = i + 1
    into[#into + 1] = tonumber(ns) / 1e6
  end
  assert(i == n, "the REPL reported " .. i .. " calls")
end

function M.run(env)
  local size = common.sizes(env, SIZES)
  local tool_code = "```repl\n" .. CODE:format(size.calls, "add(i, y=1)") .. "```"
  local llm_code = "```repl\n" .. CODE:format(size.calls, "llm_query(\"q\")") .. "```"
  local answers = { common.TRIVIAL }
  for _ = 1, size.rounds do
    answers[#answers + 1] = tool_code
    answers[#answers + 1] = llm_code
  end
  local s = common.start(env, {
    answers = answers,
    tools = { add = function(x, kw)
      return x + kw.y
    end },
    max_iterations = 2 * size.rounds + 2,
    max_sub_calls = size.calls * size.rounds,
    max_tool_calls = size.calls * size.rounds,
    stdout_truncate_chars = 16 * size.calls + 1000,
  })
  local tools, llm = {}, {}
  local ok, err = pcall(function()
    for _ = 1, size.rounds do
      samples(select(2, common.step(s)), size.calls, tools)
      samples(select(2, common.step(s)), size.calls, llm)
    end
  end)
  s:close()
  assert(ok, err)
  local stats = common.summary(tools)
  return {
    common.time_row({
      figure = "9", name = ("host tool round trip, %d calls in one exec (x%d)"):format(size.calls, size.rounds),
      stats = stats, fmt = common.fmt_us, floor = common.summary(llm),
      floor_name = "llm_query round trip, same session, execs taking turns", max_ratio = 1.5,
      note = "add(i, y=1): JSON args and result; not pinned",
    }),
  }
end

return M
