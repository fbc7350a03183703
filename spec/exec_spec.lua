-- The exec backend: sessions whose sandbox is rlm-keeper at the far end of
-- a byte stream (docs/backends.md, docs/protocol.md "The stream"), here
-- behind processes that only copy bytes. Real keeper, real bubblewrap,
-- real pipes; the faults are real processes killed or filtered.
local rlm = require("rlm")
local core = require("rlm.core")
local H = require("helpers")

local KEEPER = os.getenv("PWD") .. "/" .. (os.getenv("RLM_SPEC_BUILD") or "build") .. "/rlm-keeper"
-- The probe's cache, in the build tree (made again at will, like it).
local CACHE = os.getenv("PWD") .. "/build/keeper-cache"
os.execute("mkdir -p " .. CACHE)
local K = KEEPER .. " --cache " .. CACHE
local ROOT = H.sh("id -u") == "0"

local function through(cmd)
  return { backend = "exec", argv = { "sh", "-c", cmd } }
end
local RELAY = through("cat | " .. K .. " | cat")

local function opts(o)
  o = H.opts(o)
  o.sandbox = o.sandbox or RELAY
  return o
end

-- The sandbox's own uid (a root keeper claims one per sandbox), read from
-- the keeper's checks while the session runs.
local function sandbox_uid(s)
  local checks = s.driver and s.driver.checks
  return checks and checks.uids and checks.uids.detail:match("as uid (%d+)")
end

-- Whether pid runs (a zombie does not: this machine's init may be slow to
-- reap what it inherits).
local function running(pid)
  return H.sh(("env -u LD_PRELOAD ps -o stat= -p %d | grep -v '^Z'"):format(pid)) ~= ""
end

local function assert_gone(uid)
  if uid then
    assert.equals("", H.settled(function()
      return H.sh("env -u LD_PRELOAD ps -o pid= -u " .. uid .. " 2>/dev/null | tr -d ' \\n'")
    end, function(v)
      return v == ""
    end))
  end
end

describe("the exec backend", function()
  it("survives a step timeout with its variables", function()
    local result, err = H.run(opts({
      step_timeout_ms = 500,
      root_llm = H.script({
        H.fence("kept = 42"),
        H.fence("import time\nwhile True: time.sleep(0.01)"),
        H.fence("FINAL(str(kept))"),
      }),
    }))
    assert.is_nil(err)
    assert.equals("42", result.answer)
    assert.matches("KeyboardInterrupt", result.history[2].error)
  end)

  -- (After a first session: libuv's process-wide signal pipe is made by
  -- the first loop of the process, and stays.)
  it("answers over a 5 MB context with an llm_query through sh -c 'cat | rlm-keeper | cat'", function()
    local uid
    H.assert_no_leaks(function()
      local s
      s = rlm.Session.new(opts({
        context = ("0123456789abcde\n"):rep(5 * 2 ^ 16),
        root_llm = H.script({
          H.fence("n = len(context)\nprint(llm_query('size ' + str(n)))"),
          function()
            uid = sandbox_uid(s)
            return H.fence("FINAL(str(n))")
          end,
        }),
      }))
      local result, err = s:run()
      s:close()
      assert.is_nil(err)
      assert.equals("5242880", result.answer)
      assert.equals("echo: size 5242880\n", result.history[1].stdout)
      assert.equals(1, result.sub_calls)
    end)
    if ROOT then
      assert.is_string(uid)
      assert_gone(uid)
    end
  end)

  it("ends with memory_limit when the far side allocates past max_rss_bytes", function()
    local uid
    local s
    s = rlm.Session.new(opts({
      max_rss_bytes = 200 * 2 ^ 20,
      root_llm = H.script({ function()
        uid = sandbox_uid(s)
        return H.fence("x = bytearray(800 * 2**20)\nprint(len(x))")
      end }),
    }))
    local _, err = s:run()
    s:close()
    assert.equals("memory_limit", err.kind)
    assert_gone(ROOT and uid)
  end)

  -- The keeper killed while the host writes (the sub-call's answer goes
  -- out after the kill) and while the host only waits on the step: a relay
  -- that outlives the keeper (the first cat, blocked on the host's input)
  -- learns of its death at the host's next write, and in the second case
  -- the host writes nothing but the heartbeat's ping. The step sleeps 60 s
  -- under a 120 s step_timeout_ms: neither can end it in time.
  local lost_cases = {
    { "while the host writes", function(pid)
      os.execute(("kill -9 %d"):format(pid))
    end },
    { "while the host only waits", function(pid)
      os.execute(("(sleep 0.3; kill -9 %d) &"):format(pid))
    end },
  }
  for _, case in ipairs(lost_cases) do
    it("ends with sandbox_lost when the keeper is killed mid-step " .. case[1] .. ", and leaves nothing behind",
      function()
        local uid, pid
        local s
        local t0 = core.now_ms()
        s = rlm.Session.new(opts({
          step_timeout_ms = 120000,
          root_llm = H.script({ H.fence("print(llm_query('now'))\nimport time\ntime.sleep(60)") }),
          llm_query = function()
            uid = sandbox_uid(s)
            pid = s.driver.hello.pid
            case[2](pid)
            return "ok"
          end,
        }))
        local _, err = s:run()
        s:close()
        local took = core.now_ms() - t0
        assert.equals("sandbox_lost", err.kind)
        assert.is_true(took < 15000, ("took %.0f ms"):format(took))
        assert_gone(ROOT and uid)
        assert.is_false(running(pid))
      end)
  end

  it("ends with sandbox_lost at sandbox.ping_timeout_ms when the far side stops answering", function()
    local uid, pid
    local s
    local t0
    s = rlm.Session.new(opts({
      step_timeout_ms = 120000,
      sandbox = { backend = "exec", argv = RELAY.argv, ping_timeout_ms = 1000 },
      root_llm = H.script({ H.fence("print(llm_query('now'))\nimport time\ntime.sleep(60)") }),
      llm_query = function()
        uid = sandbox_uid(s)
        pid = s.driver.hello.pid
        -- stopped, not dead: every pipe stays open, nothing answers
        os.execute(("kill -STOP %d"):format(pid))
        t0 = core.now_ms()
        return "ok"
      end,
    }))
    local _, err = s:run()
    s:close()
    local took = core.now_ms() - t0
    assert.equals("sandbox_lost", err.kind)
    assert.matches("answered no ping for 1000 ms", err.message, 1, true)
    assert.equals(1000, err.ping_timeout_ms)
    assert.is_true(took >= 1000 and took < 15000, ("took %.0f ms"):format(took))
    -- the host killed the stream's process group, the stopped keeper in it
    assert.is_false(H.settled(function()
      return running(pid)
    end, function(v)
      return not v
    end))
    assert_gone(ROOT and uid)
  end)

  it("ends with sandbox_unavailable at start_timeout_ms when the far side never says hello", function()
    local t0 = core.now_ms()
    local _, err = H.run(opts({ sandbox = through("cat > /dev/null"), start_timeout_ms = 500 }))
    assert.equals("sandbox_unavailable", err.kind)
    assert.matches("did not say hello within start_timeout_ms", err.message)
    assert.is_true(core.now_ms() - t0 < 5000)
  end)

  it("takes a driver line that imitates a keeper message as the driver's (protocol_error)", function()
    local _, err = H.run(opts({
      guardrails = false,
      root_llm = H.script({ H.fence("import os\nos.write(1, b'K{\"type\":\"exit\",\"status\":0}\\n')") }),
    }))
    assert.equals("protocol_error", err.kind)
    assert.matches("the driver sent", err.message)
  end)

  -- A relay that changes what the keeper says of its checks.
  local checks_cases = {
    { "omits its checks", "grep --line-buffered -v '^K{\"type\":\"checks\"'", "reported no checks" },
    { "fails a check", "sed -u '/^K{\"type\":\"checks\"/s/\"uids\":{\"ok\":true/\"uids\":{\"ok\":false/'",
      "checks failed: uids" },
    { "leaves one out", "sed -u '/^K{\"type\":\"checks\"/s/\"rlimits\"/\"other\"/'", "rlimits (not reported)" },
  }
  for _, case in ipairs(checks_cases) do
    it("fails closed (sandbox_violation) when the far side " .. case[1], function()
      local _, err = H.run(opts({ sandbox = through(K .. " | " .. case[2]) }))
      assert.equals("sandbox_violation", err.kind)
      assert.matches(case[3], err.message, 1, true)
    end)
  end

  it("answers through a throttled pipe (a relay that passes bytes slowly)", function()
    local slow = "python3 -c 'import os,sys,time\nwhile True:\n b=os.read(0,4096)\n if not b: break\n"
      .. " time.sleep(0.002); os.write(1,b)'"
    local result, err = H.run(opts({
      sandbox = through(slow .. " | " .. K .. " | " .. slow),
      context = ("x"):rep(2 ^ 18),
      root_llm = H.script({ H.fence("FINAL(str(len(context)))") }),
    }))
    assert.is_nil(err)
    assert.equals("262144", result.answer)
  end)

  it("gives rlm.Pool's sessions their sandboxes through the stream", function()
    local pool = assert(rlm.Pool.new({ size = 1, sandbox = RELAY, tmpdir = H.tmpdir }))
    local result, err = H.run({ pool = pool, context = "pooled context",
      root_llm = H.script({ H.fence("FINAL(context.upper())") }) })
    pool:close()
    assert.is_nil(err)
    assert.equals("POOLED CONTEXT", result.answer)
  end)

  local misuse = {
    { { backend = "exec" }, "option 'sandbox.argv' must be" },
    { { backend = "exec", argv = {} }, "option 'sandbox.argv' must be" },
    { { backend = "exec", argv = { "" } }, "option 'sandbox.argv' must be" },
    { { backend = "docker", image = "x" }, "option 'sandbox.backend' must be" },
    { { backend = "exec", argv = { "sh" }, image = "x" }, "has no field 'image'" },
    { { backend = "exec", argv = { "sh" }, ping_timeout_ms = 50 }, "option 'sandbox.ping_timeout_ms' must be" },
    { { backend = "exec", argv = { "sh" }, ping_timeout_ms = 1.5e3 + 0.5 }, "option 'sandbox.ping_timeout_ms' must be" },
    { "exec", "option 'sandbox' must be" },
  }
  for _, case in ipairs(misuse) do
    it("raises naming the field on " .. (case[2]:match("'[^']+'") or case[2]), function()
      local ok, e = pcall(rlm.Session.new, opts({ sandbox = case[1] }))
      assert.is_false(ok)
      assert.matches(case[2], e, 1, true)
    end)
  end

  it("says which program was not found", function()
    local _, err = H.run(opts({ sandbox = { backend = "exec", argv = { "no-such-program-rlm" } } }))
    assert.equals("sandbox_unavailable", err.kind)
    assert.matches("sandbox.argv", err.message, 1, true)
  end)
end)
