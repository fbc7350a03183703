-- The root model's first call overlaps the sandbox's start (issue 30): it
-- goes out while the sandbox boots and self-tests, handed out at the
-- engine's first wait whoever drives it (under run() the sandbox is spawned
-- by then, unless its interpreter is being probed); its reply is read only
-- after every check of the start has passed, and a start that fails drops
-- it. Each case runs real sandboxes; the slow, stuck and weakened starts
-- are bubblewrap behind a wrapper script (as spec/selftest_spec.lua's).
local H = require("helpers")
local L = require("helpers.luv") -- true (require's) when luv is not installed
local has_luv = type(L) == "table"
local core = require("rlm.core")
local rlm = require("rlm")

local fence = H.fence
local bin = H.tmpdir .. "-first-call-bin"
local real_bwrap = core.find_program("bwrap")

-- A bwrap of its own: `body` is the shell script's text after its #! line.
local function wrapper(name, body)
  local path = bin .. "/" .. name
  local f = assert(io.open(path, "w"))
  f:write("#!/bin/sh\n", body, "\n")
  f:close()
  os.execute("chmod +x " .. path)
  return path
end

-- A start 300 ms slower than bubblewrap's own; one that never says hello
-- (the launcher is the sleep itself: the kill ends it); one whose sandbox
-- leaks a variable of the host's (its self-test fails: environment).
local function slow_bwrap(ms)
  return wrapper("slow" .. ms, ("sleep %.3f\nexec %s \"$@\""):format(ms / 1000, real_bwrap))
end
local function stuck_bwrap()
  return wrapper("stuck", "exec sleep 30")
end
local function weak_bwrap()
  return wrapper("weak", ("exec %s --setenv AWS_SECRET_ACCESS_KEY leaked \"$@\""):format(real_bwrap))
end

local function sleep(ms)
  local ws = assert(core.waitset())
  ws:wait(ms)
  ws:close()
end

-- What the start had reached when the root model was called.
local function start_of(s)
  return { spawned = s.sandbox.driver ~= nil, hello = s.sandbox.started == true, checked = s.sandbox.info ~= nil }
end

-- on_event's types, in order, and when sandbox_ready came.
local function recorder()
  local r = { types = {} }
  r.on_event = function(ev)
    r.types[#r.types + 1] = ev.depth == 0 and ev.type or (ev.session .. " " .. ev.type)
    if ev.type == "sandbox_ready" and ev.depth == 0 then
      r.ready_at = core.now_ms()
    elseif ev.type == "run_end" and ev.depth == 0 then
      r.tokens = ev.tokens
    end
  end
  return r
end

-- Drives s to its end under rlm.adapters.luv; returns err, result.
local function drive(s, limit_ms)
  local out
  require("rlm.adapters.luv").drive(s, function(err, result)
    out = { err = err, result = result }
  end, L.uv)
  L.run_until(function()
    return out ~= nil
  end, limit_ms)
  return out.err, out.result
end

-- A root model that blocks the host's thread for ms, then answers `text`
-- (as a blocking HTTP client would); on_call() first.
local function blocking(ms, text, usage, on_call)
  return function()
    if on_call then
      on_call()
    end
    sleep(ms)
    return text, usage
  end
end

-- A root model that answers `text` ms later from a luv timer (under an
-- adapter); on_call() first.
local function later(ms, text, usage, on_call)
  return function(_, done)
    if on_call then
      on_call()
    end
    L.after(ms, function()
      done(text, usage)
    end)
  end
end

local function setup_bin()
  os.execute("mkdir -p " .. bin)
end
local function teardown_bin()
  os.execute("rm -rf " .. bin)
end

describe("the first root call under run()", function()
  setup(setup_bin)
  teardown(teardown_bin)
  after_each(H.assert_clean)

  it("goes out once the sandbox is spawned, before its hello and checks; its code runs after them", function()
    -- The interpreter probed first (a process's first start waits for that
    -- with nothing spawned, the call out meanwhile).
    local warm = H.session({ root_llm = H.script({ fence("FINAL('warm')") }) })
    assert.are.equal("warm", (assert(warm:run())).answer)
    warm:close()
    local s, at_call, events = nil, nil, recorder()
    s = H.session({
      on_event = events.on_event,
      root_llm = H.script({ function()
        at_call = start_of(s)
        return fence("FINAL(context.upper())")
      end }),
    })
    local result, err = s:run()
    s:close()
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("HELLO WORLD", result.answer)
    assert.are.same({ spawned = true, hello = false, checked = false }, at_call)
    assert.are.same({ "session_start", "step_start", "sandbox_ready", "root_response", "exec_result", "final",
      "run_end" }, events.types)
  end)

  it("ends with the failed self-test's error, the model's reply dropped unread and its tokens counted", function()
    local called, events = false, recorder()
    local s = H.session({
      sandbox = { bwrap = weak_bwrap() },
      on_event = events.on_event,
      root_llm = blocking(50, fence("FINAL('ran')"), { input_tokens = 7, output_tokens = 3 }, function()
        called = true
      end),
    })
    local result, err = s:run()
    s:close()
    assert.is_nil(result)
    assert.are.equal("sandbox_violation", err.kind)
    assert.matches("environment", err.message, 1, true)
    assert.is_true(called)
    assert.are.same({}, err.history)
    assert.are.same({ "session_start", "step_start", "run_end" }, events.types)
    assert.are.same({ input = 7, output = 3, total = 10 }, events.tokens)
  end)

  it("ends a start that never says hello at start_timeout_ms while the model answers", function()
    local called, events = false, recorder()
    local s = H.session({
      sandbox = { bwrap = stuck_bwrap(), start_timeout_ms = 300 },
      on_event = events.on_event,
      root_llm = blocking(100, fence("FINAL('ran')"), nil, function()
        called = true
      end),
    })
    local result, err = s:run()
    s:close()
    assert.is_nil(result)
    assert.are.equal("sandbox_unavailable", err.kind)
    assert.matches("did not say hello within sandbox.start_timeout_ms (300 ms)", err.message, 1, true)
    assert.is_true(called)
    assert.are.same({ "session_start", "step_start", "run_end" }, events.types)
  end)

  -- The hello came in time and waited in the pipe while the callback held
  -- the host's thread: the start's deadline, a timer of the driver's loop,
  -- would fire before the loop read it.
  it("does not count a blocking call past start_timeout_ms against the start", function()
    local result, err = H.run({
      sandbox = { start_timeout_ms = 1000 },
      root_llm = H.script({ function()
        sleep(1500)
        return fence("FINAL(context)")
      end }),
    })
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("hello world", result.answer)
  end)

  it("ends as cancelled when closed from the call, and runs no code", function()
    local s, events = nil, recorder()
    s = H.session({
      on_event = events.on_event,
      root_llm = H.script({ function()
        s:close()
        return fence("FINAL('ran')")
      end }),
    })
    local result, err = s:run()
    assert.is_nil(result)
    assert.are.equal("cancelled", err.kind)
    assert.is_nil(s.sandbox.driver)
    -- The callback runs in run()'s loop, outside the engine: a close there
    -- ends the run where the engine waited, with no run_end (as under an
    -- adapter).
    assert.are.same({ "session_start", "step_start" }, events.types)
  end)

  -- The first poll() hands the call out; a host that only meant to start
  -- the sandbox early and runs it with run() next must not wait on it.
  it("is asked by run() when a poll() before it handed it out and nobody answered", function()
    local calls = 0
    local s = H.session({
      root_timeout_ms = 5000,
      root_llm = H.script({ function()
        calls = calls + 1
        return fence("FINAL(context)")
      end }),
    })
    local ev = s:poll()
    assert.are.equal("root_llm", ev.type)
    local result, err = s:run()
    s:close()
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("hello world", result.answer)
    assert.are.equal(1, calls)
    assert.is_false(s:reply(ev.id, "late")) -- answered by run()
  end)

  it("asks a nested session's root model while that session's sandbox starts", function()
    local s, at_call, events = nil, nil, recorder()
    s = H.session({
      max_depth = 2,
      on_event = events.on_event,
      root_llm = function(_, info)
        if info.depth == 1 then
          at_call = start_of(s.nested.children[1])
          return fence("FINAL(context.upper())")
        end
        return #s.conversation.history == 0 and fence("print(rlm_query('q', 'inner'))") or fence("FINAL('outer')")
      end,
    })
    local result, err = s:run()
    s:close()
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("INNER\n", result.history[1].stdout)
    assert.are.same({ spawned = true, hello = false, checked = false }, at_call)
    local child = {}
    for _, t in ipairs(events.types) do
      child[#child + 1] = t:match("^1%.1 (.*)$")
    end
    assert.are.same({ "session_start", "step_start", "sandbox_ready", "root_response", "exec_result", "final",
      "run_end" }, child)
  end)

  it("asks the model of a session from a pool before the taken sandbox is checked", function()
    local pool = assert(rlm.Pool.new({ size = 1, sandbox = { tmpdir = H.tmpdir } }))
    H.settled(function()
      return pool:stats()
    end, function(st)
      return st.ready == 1
    end)
    local s, at_call, events = nil, nil, recorder()
    s = H.session({
      pool = pool,
      on_event = events.on_event,
      root_llm = H.script({ function()
        at_call = start_of(s)
        at_call.start = s.sandbox.start
        return fence("FINAL(context)")
      end }),
    })
    local result, err = s:run()
    s:close()
    pool:close()
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("hello world", result.answer)
    assert.are.same({ spawned = true, hello = true, checked = false, start = "warm" }, at_call)
    assert.are.same({ "session_start", "step_start", "sandbox_ready", "root_response", "exec_result", "final",
      "run_end" }, events.types)
  end)
end)

H.describe_luv("the first root call under the luv adapter", function()
  setup(setup_bin)
  teardown(teardown_bin)
  after_each(H.assert_clean)

  -- The model answers at once, so its reply waits through the whole start,
  -- and the loop does not spin meanwhile (timeout() is not 0 for it).
  it("goes out before the sandbox's hello; its reply waits for the checks, then its code runs", function()
    local s, at_call, events = nil, nil, recorder()
    s = H.session({
      on_event = events.on_event,
      root_llm = function()
        at_call = start_of(s)
        return fence("FINAL(context.upper())")
      end,
    })
    local polls, poll = 0, s.poll
    s.poll = function(...)
      polls = polls + 1
      return poll(...)
    end
    local err, result = drive(s)
    s:close()
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("HELLO WORLD", result.answer)
    assert.are.same({ hello = false, checked = false }, { hello = at_call.hello, checked = at_call.checked })
    assert.are.same({ "session_start", "step_start", "sandbox_ready", "root_response", "exec_result", "final",
      "run_end" }, events.types)
    assert.is_true(polls < 100, ("%d polls"):format(polls))
  end)

  it("ends with the failed self-test's error while the call is out, and runs no code", function()
    local called, events = false, recorder()
    local s = H.session({
      sandbox = { bwrap = weak_bwrap() },
      on_event = events.on_event,
      root_llm = later(200, fence("FINAL('ran')"), nil, function()
        called = true
      end),
    })
    local err = drive(s)
    s:close()
    assert.are.equal("sandbox_violation", err.kind)
    assert.matches("environment", err.message, 1, true)
    assert.is_true(called)
    assert.are.same({ "session_start", "step_start", "run_end" }, events.types)
    -- The reply that comes later is no longer wanted.
    local late = nil
    L.after(250, function()
      late = s:reply(1, "late")
    end)
    L.run_until(function()
      return late ~= nil
    end)
    assert.is_false(late)
  end)

  it("counts the tokens of a reply that came before the self-test failed", function()
    local events = recorder()
    local s = H.session({
      sandbox = { bwrap = weak_bwrap() },
      on_event = events.on_event,
      root_llm = function()
        return fence("FINAL('ran')"), { input_tokens = 5, output_tokens = 1 }
      end,
    })
    local err = drive(s)
    s:close()
    assert.are.equal("sandbox_violation", err.kind)
    assert.are.same({ input = 5, output = 1, total = 6 }, events.tokens)
    assert.are.same({ "session_start", "step_start", "run_end" }, events.types)
  end)

  it("ends a start that never says hello at start_timeout_ms while the model answers", function()
    local called, t0 = false, core.now_ms()
    local s = H.session({
      sandbox = { bwrap = stuck_bwrap(), start_timeout_ms = 300 },
      root_llm = later(100, fence("FINAL('ran')"), nil, function()
        called = true
      end),
    })
    local err = drive(s)
    s:close()
    assert.are.equal("sandbox_unavailable", err.kind)
    assert.matches("did not say hello within sandbox.start_timeout_ms (300 ms)", err.message, 1, true)
    assert.is_true(called)
    assert.is_true(core.now_ms() - t0 < 10000)
  end)

  it("does not count a callback that blocks the loop past start_timeout_ms against the start", function()
    local s = H.session({
      sandbox = { start_timeout_ms = 1000 },
      root_llm = H.script({ function()
        sleep(1500)
        return fence("FINAL(context)")
      end }),
    })
    local err, result = drive(s)
    s:close()
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("hello world", result.answer)
  end)

  -- The model never answers: the call is given up root_timeout_ms after
  -- it went out, which is soon after the slow start's end, not
  -- root_timeout_ms after it.
  it("counts root_timeout_ms from the call, not from the sandbox's readiness", function()
    local events = recorder()
    local s = H.session({
      sandbox = { bwrap = slow_bwrap(1500) },
      root_timeout_ms = 1000,
      on_event = events.on_event,
      root_llm = function() end, -- never calls done
    })
    local err = drive(s)
    local t_err = core.now_ms()
    s:close()
    assert.are.equal("callback_error", err.kind)
    assert.is_true(err.resumable)
    assert.are.equal(1000, err.timeout_ms)
    -- Counted from the sandbox's readiness, it would be 1,000 ms after it.
    local after_ready = t_err - events.ready_at
    assert.is_true(after_ready < 600, ("the call was given up %.0f ms after the sandbox was ready"):format(after_ready))
  end)

  it("ends as cancelled when closed with the start and the call both in flight", function()
    local called, events = false, recorder()
    local s = H.session({
      sandbox = { bwrap = slow_bwrap(300) },
      on_event = events.on_event,
      root_llm = later(200, fence("FINAL('ran')"), nil, function()
        called = true
      end),
    })
    L.after(50, function()
      s:close()
    end)
    local err = drive(s)
    assert.are.equal("cancelled", err.kind)
    assert.is_true(called)
    -- (A close from outside the engine ends it where it waited: no run_end.)
    assert.are.same({ "session_start", "step_start" }, { events.types[1], events.types[2] })
    for _, t in ipairs(events.types) do
      assert.is_true(t ~= "sandbox_ready" and t ~= "root_response" and t ~= "exec_result", t)
    end
    sleep(200) -- the model's answer comes to a closed session
    L.uv.run("nowait")
  end)

  it("asks the model of a session from a pool before the taken sandbox is checked", function()
    local pool = assert(rlm.Pool.new({ size = 1, sandbox = { tmpdir = H.tmpdir } }))
    H.settled(function()
      return pool:stats()
    end, function(st)
      return st.ready == 1
    end)
    local s, at_call = nil, nil
    s = H.session({
      pool = pool,
      root_llm = later(50, fence("FINAL(context)"), nil, function()
        at_call = start_of(s)
        at_call.start = s.sandbox.start
      end),
    })
    local err, result = drive(s)
    s:close()
    pool:close()
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("hello world", result.answer)
    assert.are.same({ spawned = true, checked = false, start = "warm" },
      { spawned = at_call.spawned, checked = at_call.checked, start = at_call.start })
  end)

  it("asks a nested session's root model while that session's sandbox starts", function()
    local s, at_call = nil, nil
    s = H.session({
      max_depth = 2,
      root_llm = function(_, done)
        if done.depth == 1 then
          at_call = start_of(s.nested.children[1])
          L.after(20, function()
            done(fence("FINAL(context.upper())"))
          end)
          return
        end
        return #s.conversation.history == 0 and fence("print(rlm_query('q', 'inner'))") or fence("FINAL('outer')")
      end,
    })
    local err, result = drive(s)
    s:close()
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("INNER\n", result.history[1].stdout)
    assert.are.same({ hello = false, checked = false }, { hello = at_call.hello, checked = at_call.checked })
  end)
end)

-- Session.new to the first step's end with a slow start (bubblewrap 300 ms
-- late) and a model that takes 300 ms: about the longer of the two plus a
-- step, where in series it was their sum. The bound leaves 150 ms of the
-- 300 the overlap saves to the machine's noise.
describe("the first step's end with a slow start and a slow model", function()
  setup(setup_bin)
  teardown(teardown_bin)
  after_each(H.assert_clean)

  -- Long enough that the overlap (a model's time saved) stands out of a
  -- loaded machine's noise.
  local MODEL_MS = 800

  local function first_step(way, bwrap, model_ms)
    local t0, t_end = core.now_ms(), nil
    local calls = 0
    local s = H.session({
      sandbox = { bwrap = bwrap },
      root_llm = function(_, done)
        calls = calls + 1
        if calls > 1 then
          t_end = t_end or core.now_ms()
          return fence("FINAL('done')")
        end
        if way == "luv" and model_ms > 0 then
          return later(model_ms, fence("x = 1"))(nil, done)
        end
        return blocking(model_ms, fence("x = 1"))()
      end,
    })
    if way == "luv" then
      local err = drive(s)
      assert.is_nil(err, err and tostring(err))
    else
      assert(s:step())
      t_end = core.now_ms()
    end
    s:close()
    return t_end - t0
  end

  for _, way in ipairs({ "run", "luv" }) do
    local it_ = (way == "luv" and not has_luv) and pending or it
    it_("is about the longer of the start and the model, not their sum, under " .. way, function()
      local bwrap = slow_bwrap(800)
      local base = first_step(way, bwrap, 0)
      local took = first_step(way, bwrap, MODEL_MS)
      print(("\n# %s, %s: the first step's end %.0f ms with a %d ms model; %.0f ms with one that answers at once "
        .. "(start + step); their sum %.0f ms"):format(H.lua_name(), way, took, MODEL_MS, base, base + MODEL_MS))
      assert.is_true(took < base + MODEL_MS - 400, ("%.0f ms, the sum %.0f ms"):format(took, base + MODEL_MS))
    end)
  end
end)
