-- make soak: SOAK_SESSIONS sessions (1,000 by default), each with a fault
-- drawn at random from the list below, then the host's descriptors, child
-- processes and leftover workdirs must be back where they started, and its
-- RSS must have stopped growing: malloc keeps what a 16 MB line once needed,
-- so the RSS after the first half is the baseline for the second, where a
-- leak would keep growing. Prints those figures; exits 1 when any is off.
package.path = "spec/?.lua;spec/?/init.lua;" .. package.path
local H = require("helpers")
local core = require("rlm.core")
local fence = H.fence

local N = tonumber(os.getenv("SOAK_SESSIONS") or "1000")
local SEED = tonumber(os.getenv("SOAK_SEED") or os.time())

local function rss_kb()
  return tonumber(H.sh("grep VmRSS /proc/" .. H.pid() .. "/status | awk '{print $2}'"))
end

-- name = { code (or the codes of successive turns), options, expected
-- err.kind (nil: a result) }. Past step_timeout_ms the REPL is
-- interrupted (docs/api.md): code that stops costs a turn and the run goes
-- on; only code that will not stop is killed (step_timeout). A driver
-- whose stdout is gone exits when it writes its result; a half line the
-- code wrote runs into that result.
local faults = {
  { "none", "FINAL('ok')", {}, nil },
  { "exit mid-exec", "import os\nos._exit(7)", { guardrails = false }, "driver_exited" },
  { "SIGKILL from outside", "import time\ntime.sleep(30)", { kill_from_host = true }, "driver_exited" },
  { "closed stdout", "import os, time\nos.close(1)\ntime.sleep(30)", { guardrails = false }, "driver_exited" },
  { "half a line, then a stall", "import os, time\nos.write(1, b'{\"type\": \"exec')\ntime.sleep(30)",
    { guardrails = false }, "protocol_error" },
  { "stdout flood", "import os\nfor _ in range(1000):\n    os.write(1, b'x' * 65536)", { guardrails = false },
    "protocol_error" },
  { "stderr flood", "import os\nfor _ in range(2000):\n    os.write(2, b'e' * 8192)\nFINAL('ok')",
    { guardrails = false }, nil },
  { "invalid UTF-8 line", "import os\nos.write(1, b'\\xff\\xfe garbage\\n')", { guardrails = false },
    "protocol_error" },
  { "line beyond the cap", "import os\nos.write(1, b'[' + b'1,' * 40000 + b'1]\\n')",
    { guardrails = false, sandbox = { max_message_bytes = 65536 } }, "protocol_error" },
  { "infinite loop", { "while True:\n    pass", "FINAL('ok')" }, {}, nil },
  { "loop that ignores SIGINT", "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
    { guardrails = false, sandbox = { interrupt_grace_ms = 200 } }, "step_timeout" },
  { "memory hog", "b = []\nwhile True:\n    b.append(bytearray(1 << 20))", { max_rss_bytes = 64 * 2 ^ 20 },
    "memory_limit" },
  { "sub-call budget", "for i in range(10):\n    llm_query(str(i))", { max_sub_calls = 2, fallback = false }, "sub_call_budget" },
}

local function soak_one(i, fault)
  local opts = {
    step_timeout_ms = 500,
    sandbox = { rss_poll_interval_ms = 10 },
    root_llm = H.script(type(fault[2]) == "table" and { fence(fault[2][1]), fence(fault[2][2]) }
      or { fence(fault[2]) }),
  }
  for k, v in pairs(fault[3]) do
    opts[k] = v
  end
  local kill = opts.kill_from_host
  opts.kill_from_host = nil
  if kill then
    opts.on_event = function(ev)
      if ev.type == "sandbox_ready" then
        -- The interpreter is the deepest process of the sandbox (up now;
        -- step_start may come before it).
        local tree = H.last_session.sandbox.driver:tree()
        os.execute("(sleep 0.1; kill -9 " .. tree[#tree] .. ") &")
      end
    end
  end
  local s = H.session(opts)
  H.last_session = s
  local result, err = s:run()
  s:close()
  local got = result and (result.answer == "ok" and "result" or "answer " .. tostring(result.answer))
    or err.kind
  local want = fault[4] or "result"
  if got ~= want then
    return ("session %d (%s): %s, expected %s%s"):format(i, fault[1], got, want,
      err and (": " .. err.message:sub(1, 200)) or "")
  end
end

math.randomseed(SEED)
H.run({}) -- the interpreter probe is cached after the first session
collectgarbage()
collectgarbage()
local fds0, rss0 = H.fds(), rss_kb()
local t0 = core.now_ms()
local counts, problems = {}, {}
local rss_half
for i = 1, N do
  if i == math.floor(N / 2) + 1 then
    collectgarbage()
    collectgarbage()
    rss_half = rss_kb()
  end
  local fault = faults[math.random(#faults)]
  counts[fault[1]] = (counts[fault[1]] or 0) + 1
  local problem = soak_one(i, fault)
  if problem then
    problems[#problems + 1] = problem
  end
end
H.last_session = nil
collectgarbage()
collectgarbage()
local fds1, rss1 = H.fds(), rss_kb()
local children, workdirs = H.children(), H.workdirs()

print(("soak: %d sessions in %.1f s (seed %d)"):format(N, (core.now_ms() - t0) / 1000, SEED))
for _, f in ipairs(faults) do
  print(("  %-26s %d"):format(f[1], counts[f[1]] or 0))
end
print(("descriptors: %d before, %d after"):format(#fds0, #fds1))
print(("child processes after: %d"):format(#children))
print(("workdirs left: %d"):format(#workdirs))
print(("host RSS: %d KB before, %d KB half way, %d KB after (%+d KB over the second half)")
  :format(rss0, rss_half, rss1, rss1 - rss_half))
for _, p in ipairs(problems) do
  print("unexpected: " .. p)
end
local ok = #problems == 0 and table.concat(fds0, "\n") == table.concat(fds1, "\n")
  and #children == 0 and #workdirs == 0 and rss1 - rss_half < 4 * 1024
print(ok and "soak: clean" or "soak: NOT clean")
os.execute("rm -rf " .. H.tmpdir)
os.exit(ok and 0 or 1)
