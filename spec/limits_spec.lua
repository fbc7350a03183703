-- Limits: time, budgets. Each row a case; each asserts err.kind and that
-- the host is healthy afterwards (no child, no workdir).
local H = require("helpers")
local core = require("rlm.core")
local fence = H.fence

describe("step_timeout_ms", function()
  after_each(H.assert_clean)

  -- Interrupted (SIGINT, a KeyboardInterrupt in the code): the block is
  -- rolled back, the model told, the REPL kept.
  local slow = {
    { "an infinite loop", "while True:\n    pass" },
    { "a long sleep", "import time\ntime.sleep(600)" },
    { "a driver that ignores SIGTERM", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)",
      guardrails = false },
    { "a read that never returns", "import os\nr, w = os.pipe()\nos.read(r, 1)", guardrails = false },
  }
  for _, case in ipairs(slow) do
    -- The bound: the timeout plus a second (a machine at a load of 12), still
    -- under the default interrupt_grace_ms (2 s) after which it is killed.
    it("interrupts " .. case[1] .. " within the timeout plus 1 s, and the run goes on", function()
      local timeout = 700
      local t0, t1
      local result, err = H.run({
        step_timeout_ms = timeout,
        guardrails = case.guardrails,
        root_llm = H.script({
          function()
            return fence("kept = 1"), nil
          end,
          function()
            -- From here: the first call goes out as the sandbox starts.
            t0 = core.now_ms()
            return fence("lost = 1\n" .. case[2])
          end,
          function()
            t1 = core.now_ms()
            return fence("try:\n    lost\n    seen = True\nexcept NameError:\n    seen = False\nFINAL(f'{kept} {seen}')")
          end,
        }),
      })
      assert.is_nil(err)
      assert.are.equal("1 False", result.answer)
      assert.matches("KeyboardInterrupt", result.history[2].error)
      assert.is_true(t1 - t0 < timeout + 1000, ("took %.0f ms"):format(t1 - t0))
    end)
  end

  -- Code that does not stop when interrupted is killed interrupt_grace_ms
  -- later: its state is lost, the run ends with step_timeout.
  local stubborn = {
    { "a loop that swallows the interrupt", "while True:\n    try:\n        while True:\n            pass\n"
      .. "    except:\n        pass" },
    { "a driver that ignores SIGINT", "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
      .. "while True:\n    time.sleep(0.01)", guardrails = false },
    { "a read that never returns, SIGINT ignored", "import os, signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
      .. "r, w = os.pipe()\nos.read(r, 1)", guardrails = false },
  }
  for _, case in ipairs(stubborn) do
    it("kills " .. case[1] .. " within the timeout and the grace plus 1 s", function()
      local timeout, grace = 500, 300
      local t0
      local result, err = H.run({
        step_timeout_ms = timeout,
        sandbox = { interrupt_grace_ms = grace },
        guardrails = case.guardrails,
        root_llm = function()
          t0 = core.now_ms()
          return fence(case[2])
        end,
      })
      local elapsed = core.now_ms() - t0
      assert.is_nil(result)
      assert.are.equal("step_timeout", err.kind)
      assert.are.equal(timeout, err.timeout_ms)
      assert.are.equal(grace, err.grace_ms)
      assert.is_true(elapsed < timeout + grace + 1000, ("took %.0f ms"):format(elapsed))
    end)
  end

  it("does not count a root model that blocks past it (root_timeout_ms is the root call's)", function()
    local result, err = H.run({
      step_timeout_ms = 200,
      root_llm = function()
        local t = core.now_ms()
        while core.now_ms() - t < 300 do end
        return fence("FINAL(1)")
      end,
    })
    assert.is_nil(err)
    assert.are.equal("1", result.answer)
  end)

  it("gives each step its own deadline", function()
    local result, err = H.run({
      step_timeout_ms = 1000,
      root_llm = H.script({ fence("import time\ntime.sleep(0.6)"), fence("import time\ntime.sleep(0.6)"),
        fence("FINAL('in time')") }),
    })
    assert.is_nil(err)
    assert.are.equal("in time", result.answer)
  end)
end)

describe("max_sub_calls", function()
  after_each(H.assert_clean)

  it("never passes call N+1 to the callback", function()
    local calls = 0
    local result, err = H.run({
      max_sub_calls = 3,
      fallback = false,
      root_llm = H.script({ fence("for i in range(10):\n    llm_query(str(i))") }),
      llm_query = function(p)
        calls = calls + 1
        return p
      end,
    })
    assert.is_nil(result)
    assert.are.equal("sub_call_budget", err.kind)
    assert.are.equal(3, calls)
    assert.are.equal(3, err.sub_calls)
    assert.are.equal(3, err.max_sub_calls)
  end)

  it("counts across steps", function()
    local _, err = H.run({
      max_sub_calls = 2,
      fallback = false,
      root_llm = H.script({ fence("llm_query('a')"), fence("llm_query('b')"), fence("llm_query('c')") }),
    })
    assert.are.equal("sub_call_budget", err.kind)
  end)
end)

describe("cost.max_usd", function()
  after_each(H.assert_clean)

  it("stops before a root turn once the cost is spent", function()
    local spent, turns = 0, 0
    local _, err = H.run({
      cost = { max_usd = 0.05, usd = function() return spent end },
      fallback = false,
      root_llm = function()
        turns = turns + 1
        spent = spent + 0.02
        return fence("x = 1")
      end,
    })
    assert.are.equal("cost_budget", err.kind)
    assert.are.equal(3, turns) -- 0.02, 0.04, 0.06: the fourth turn is refused
    assert.are.equal(0.05, err.max_usd)
  end)

  it("stops before a sub-call once the cost is spent", function()
    local spent, calls = 0, 0
    local _, err = H.run({
      cost = { max_usd = 0.01, usd = function() return spent end },
      fallback = false,
      root_llm = H.script({ fence("for i in range(5):\n    llm_query('q')") }),
      llm_query = function()
        calls = calls + 1
        spent = spent + 0.004
        return "a"
      end,
    })
    assert.are.equal("cost_budget", err.kind)
    assert.are.equal(3, calls)
  end)
end)

describe("max_total_tokens", function()
  after_each(H.assert_clean)

  it("adds up the usage the callbacks report, and reports it in the result", function()
    local result, err = H.run({
      root_llm = H.script({
        function() return fence("print(llm_query('q'))"), { input_tokens = 100, output_tokens = 20 } end,
        function() return fence("FINAL(1)"), { input_tokens = 150, output_tokens = 5 } end,
      }),
      llm_query = function() return "a", { input_tokens = 7, output_tokens = 3 } end,
    })
    assert.is_nil(err)
    assert.are.same({ input = 257, output = 28, total = 285 }, result.tokens)
  end)

  it("stops before the call that would start past the budget", function()
    local turns = 0
    local _, err = H.run({
      max_total_tokens = 250,
      fallback = false,
      root_llm = function()
        turns = turns + 1
        return fence("x = 1"), { input_tokens = 100, output_tokens = 0 }
      end,
    })
    assert.are.equal("cost_budget", err.kind)
    assert.are.equal(3, turns)
    assert.are.equal(300, err.tokens)
  end)

  it("refuses a malformed usage", function()
    local _, err = H.run({
      root_llm = function() return fence("FINAL(1)"), { input_tokens = "many" } end,
    })
    assert.are.equal("callback_error", err.kind)
    assert.matches("usage", err.message)
  end)
end)

describe("max_rss_bytes", function()
  after_each(H.assert_clean)

  it("kills an allocation loop as fast as Python goes, in a cgroup where it can", function()
    local limit = 256 * 2 ^ 20
    local result, err = H.run({
      max_rss_bytes = limit,
      sandbox = { rss_poll_interval_ms = 10 },
      root_llm = H.script({ fence("b = []\nwhile True:\n    b.append(bytearray(1 << 20))") }),
    })
    assert.is_nil(result)
    assert.are.equal("memory_limit", err.kind)
    assert.are.equal(limit, err.limit)
    assert.matches(err.mechanism, err.message, 1, true)
    print(("\n# %s: memory_limit by %s, limit %d MB, peak %.0f MB"):format(H.lua_name(), err.mechanism,
      limit / 2 ^ 20, err.peak / 2 ^ 20))
    if err.mechanism == "poll" then
      print("# no cgroup could be made here; the poll enforced the limit")
    else
      assert.is_true(err.peak <= limit, "the cgroup let the peak pass the limit")
    end
  end)

  it("kills an allocation loop by the poll when asked not to use a cgroup", function()
    local limit = 256 * 2 ^ 20
    local result, err = H.run({
      max_rss_bytes = limit,
      sandbox = { memory_cgroup = false, rss_poll_interval_ms = 10 },
      root_llm = H.script({ fence("b = []\nwhile True:\n    b.append(bytearray(1 << 20))") }),
    })
    assert.is_nil(result)
    assert.are.equal("memory_limit", err.kind)
    assert.are.equal("poll", err.mechanism)
    assert.is_true(err.peak > limit)
    print(("\n# %s: memory_limit by poll, limit %d MB, peak %.0f MB (overshoot %.0f MB)"):format(
      H.lua_name(), limit / 2 ^ 20, err.peak / 2 ^ 20, (err.peak - limit) / 2 ^ 20))
  end)

  it("counts memory held by threads", function()
    local _, err = H.run({
      guardrails = false, -- threading is not among the REPL's modules
      max_rss_bytes = 128 * 2 ^ 20,
      sandbox = { rss_poll_interval_ms = 10 },
      root_llm = H.script({ fence([[
import threading
hold = []
def grab():
    for _ in range(100):
        hold.append(bytearray(1 << 20))
ts = [threading.Thread(target=grab) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
import time
time.sleep(5)]]) }),
    })
    assert.are.equal("memory_limit", err.kind)
  end)

  -- An idle sandbox's polls read only its processes' run times (a process
  -- that has not run has grown nothing; a full measure comes at least every
  -- 20 polls). One that sleeps through a poll and then allocates has run:
  -- the next poll measures in full. With polls 2 s apart, a poll that took
  -- the sleep's unchanged run times for the wake's would leave the 600 MB
  -- to the full measure 40 s on, and the step would time out first.
  it("measures in full the poll after a sleeping process wakes and allocates", function()
    local limit = 128 * 2 ^ 20
    local result, err = H.run({
      max_rss_bytes = limit,
      step_timeout_ms = 12000,
      sandbox = { memory_cgroup = false, rss_poll_interval_ms = 2000 },
      root_llm = H.script({
        fence("import time\ntime.sleep(2.5)\nhold = bytearray(600 << 20)\ntime.sleep(30)"),
        fence("FINAL('not killed')"),
      }),
    })
    assert.is_nil(result)
    assert.are.equal("memory_limit", err.kind)
    assert.are.equal("poll", err.mechanism)
  end)

  -- The watchdog sleeps between polls in one wait on the launcher's exit
  -- and close()'s word: a close() must not wait out the poll's interval
  -- (here a minute) before the keeper tears the sandbox down.
  it("lets close() end the sandbox at once, its next poll a minute away", function()
    local result, err = H.run({ sandbox = { rss_poll_interval_ms = 60000 } })
    assert.is_nil(err)
    assert.are.equal("done", result.answer)
    local t0 = core.now_ms()
    assert.are.equal(0, H.settled(core.teardowns, function(n)
      return n == 0
    end, 20000))
    assert.is_true(core.now_ms() - t0 < 3000, "the teardown took " .. (core.now_ms() - t0) .. " ms")
  end)

  it("can be turned off", function()
    local result, err = H.run({
      max_rss_bytes = 0,
      root_llm = H.script({ fence("b = bytearray(300 << 20)\nFINAL(len(b) >> 20)") }),
    })
    assert.is_nil(err)
    assert.are.equal("300", result.answer)
  end)
end)
