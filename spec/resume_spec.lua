-- A session's journal and Session.resume (docs/durability.md): a run
-- abandoned mid-step (its callbacks never answered, its Lua objects
-- dropped, its sandbox gone) goes on in a new session from the journal,
-- in a fresh sandbox, with nothing that was recorded asked twice.
local H = require("helpers")
local rlm = require("rlm")
local core = require("rlm.core")
local journal = require("rlm.journal")
local J = require("helpers.journal")

local function fresh_dir()
  return J.fresh_dir("resume")
end
local entries = J.entries
local remove_dir = J.remove_dir
local past_lease = J.past_lease

-- A four-turn run: sub-calls, a tool with a side effect, a batch, then the
-- answer made of all of them. The model, the sub-model and the tool count
-- their calls by what was asked; `stop_at` (a prompt) is where the first
-- host goes away: its llm_query yields, and nobody resumes it.
local TURNS = {
  H.fence("a = llm_query('q1')\nprint('one', a)"),
  H.fence("t = bump('x')\nb = llm_query('q2')\nprint('two', t, b)"),
  H.fence("c = llm_query_batched(['q3', 'q4'])\nd = llm_query('q5')\nprint('three', c, d)"),
  H.fence("FINAL(' '.join([a, str(t), b, c[0], c[1], d]))"),
}
local ANSWER = "sub:q1 1 sub:q2 sub:q3 sub:q4 sub:q5"

local function counters()
  local c = { root = {}, sub = {}, tool = 0 }
  c.count = function(t, k)
    t[k] = (t[k] or 0) + 1
  end
  return c
end

local function opts_for(c, store, stop_at, extra, turns)
  turns = turns or TURNS
  local o = H.opts({
    context = "the same context",
    query = "join the answers",
    root_llm = function(messages)
      local turn = 0
      for _, m in ipairs(messages) do
        turn = turn + (m.role == "assistant" and 1 or 0)
      end
      c.count(c.root, turn + 1)
      if stop_at == "root:" .. (turn + 1) then
        coroutine.yield("gone")
      end
      return turns[turn + 1]
    end,
    llm_query = function(p)
      c.count(c.sub, p)
      if p == stop_at then
        coroutine.yield("gone") -- the host goes away here
      end
      return "sub:" .. p
    end,
    tools = { bump = function()
      c.tool = c.tool + 1
      if stop_at == "tool" then
        coroutine.yield("gone") -- its side effect happened; its answer never came
      end
      return c.tool
    end },
    journal = store,
  })
  for k, v in pairs(extra or {}) do
    o[k] = v
  end
  return o
end

-- Runs a new session in a coroutine until its llm_query for stop_at
-- yields; then its sandbox is killed and the session dropped unclosed.
-- Returns the session's journal id.
local function abandon(c, store, stop_at, turns)
  return J.abandon(function()
    return rlm.Session.new(opts_for(c, store, stop_at, nil, turns))
  end)
end

describe("a session's journal", function()
  it("has an id, which session_start carries, and deletes its entries when the run ends", function()
    local dir = fresh_dir()
    local store = assert(journal.file(dir))
    local c, seen = counters(), nil
    local s = rlm.Session.new(opts_for(c, store, nil, { on_event = function(ev)
      if ev.type == "session_start" then
        seen = ev.journal_id
      end
    end }))
    local id = s:journal_id()
    assert.is_truthy(id:match("^%x+$") and #id == 32)
    local r = assert(s:run())
    assert.are.equal(ANSWER, r.answer)
    assert.are.equal(id, seen)
    assert.are.same({}, entries(dir))
    s:close()
    assert.is_nil(rlm.Session.new(H.opts()):journal_id())
    remove_dir(dir)
  end)

  it("is deleted by close() of a session that has not ended", function()
    local dir = fresh_dir()
    local store = assert(journal.file(dir))
    local c = counters()
    local s = rlm.Session.new(opts_for(c, store))
    assert(s:step())
    assert.is_true(#entries(dir) >= 3) -- lease, head, step 1
    s:close()
    assert.are.same({}, entries(dir))
    remove_dir(dir)
  end)
end)

describe("rlm.Session.resume", function()
  local dir, store
  J.each_store("resume", function(d, s)
    dir, store = d, s
  end)

  it("goes on from a run abandoned mid-step: the same answer, nothing recorded asked twice", function()
    local c = counters()
    local id = abandon(c, { store = store, lease_ttl = 1 }, "q5")
    -- Asked so far: turns 1 to 3, q1 to q5 (q5 never answered), one tool call.
    assert.are.same({ 1, 1, 1 }, c.root)
    assert.are.equal(1, c.tool)
    past_lease(1)
    local t0 = core.now_ms()
    local s = assert(rlm.Session.resume(id, opts_for(c, { store = store })))
    local r = assert(s:run())
    local ms = core.now_ms() - t0
    assert.are.equal(ANSWER, r.answer)
    -- Every recorded answer came from the journal: each root turn once,
    -- each sub-call once but q5 (asked again: its answer never came), and
    -- the tool's side effect once.
    assert.are.same({ 1, 1, 1, 1 }, c.root)
    assert.are.same({ q1 = 1, q2 = 1, q3 = 1, q4 = 1, q5 = 2 }, c.sub)
    assert.are.equal(1, c.tool)
    assert.are.equal(4, r.iterations)
    assert.are.equal(5, r.sub_calls)
    assert.are.same({}, entries(dir))
    s:close()
    print(("\n  resume by replay of 2 steps and 4 answers of the third, to the answer: %.0f ms"):format(ms))
  end)

  -- A step whose code does not do the same twice (the time): its replay
  -- differs from the record, and the resume ends naming it.
  local function with_turn(i, code)
    local turns = {}
    for k, v in ipairs(TURNS) do
      turns[k] = v
    end
    turns[i] = H.fence(code)
    return turns
  end

  -- Where the first host went away (one row a case): the calls asked
  -- before, as the counters read after the resume. Each recorded answer
  -- is asked once; the call in flight at the kill, twice (its answer never
  -- came); the tool's side effect, in flight, happens again (its value was
  -- never recorded).
  local KILLS = {
    { "in step 1's first sub-call", "q1", { 1, 1, 1, 1 }, { q1 = 2, q2 = 1, q3 = 1, q4 = 1, q5 = 1 }, 1 },
    { "in step 2's tool call", "tool", { 1, 1, 1, 1 }, { q1 = 1, q2 = 1, q3 = 1, q4 = 1, q5 = 1 }, 2 },
    -- run() calls a batch's callbacks one after the other, then the engine
    -- takes their answers: q3's was given to reply() but the engine never
    -- took it, so it was not recorded, and is asked again.
    { "in step 3's batch, its second", "q4", { 1, 1, 1, 1 }, { q1 = 1, q2 = 1, q3 = 2, q4 = 2, q5 = 1 }, 1 },
    { "in step 3's root call", "root:3", { 1, 1, 2, 1 }, { q1 = 1, q2 = 1, q3 = 1, q4 = 1, q5 = 1 }, 1 },
    { "in the last step's root call", "root:4", { 1, 1, 1, 2 }, { q1 = 1, q2 = 1, q3 = 1, q4 = 1, q5 = 1 }, 1 },
  }
  for _, case in ipairs(KILLS) do
    it("asks nothing twice that was recorded, killed " .. case[1], function()
      local c = counters()
      local id = abandon(c, { store = store, lease_ttl = 1 }, case[2])
      past_lease(1)
      local s = assert(rlm.Session.resume(id, opts_for(c, { store = store })))
      local r = assert(s:run())
      s:close()
      assert.are.equal(ANSWER:gsub(" 1 ", " " .. case[5] .. " "), r.answer)
      assert.are.same(case[3], c.root)
      assert.are.same(case[4], c.sub)
      assert.are.equal(case[5], c.tool)
      assert.are.same({}, entries(dir))
    end)
  end

  it("names the step whose replay printed otherwise than the record", function()
    local c = counters()
    local turns = with_turn(2, "import time\nt = bump('x')\nb = llm_query('q2')\nprint('two', t, b, time.time_ns())")
    local id = abandon(c, { store = store, lease_ttl = 1 }, "q5", turns)
    past_lease(1)
    local s = assert(rlm.Session.resume(id, opts_for(c, { store = store }, nil, nil, turns)))
    local r, err = s:run()
    assert.is_nil(r)
    assert.are.equal("replay_diverged", err.kind)
    assert.are.equal(2, err.step)
    assert.matches("step 2", err.message)
    assert.are.same({ 1, 1, 1 }, c.root) -- nothing asked of the model again
    s:close()
  end)

  it("names the step whose replay asked a call its record does not hold", function()
    local c = counters()
    local turns = with_turn(1, "import time\na = llm_query('q1-%d' % time.time_ns())[:6]\nprint('one', a)")
    local id = abandon(c, { store = store, lease_ttl = 1 }, "q5", turns)
    past_lease(1)
    local asked = 0
    for _ in pairs(c.sub) do
      asked = asked + 1
    end
    local s = assert(rlm.Session.resume(id, opts_for(c, { store = store }, nil, nil, turns)))
    local r, err = s:run()
    assert.is_nil(r)
    assert.are.equal("replay_diverged", err.kind)
    assert.are.equal(1, err.step)
    local now = 0
    for _ in pairs(c.sub) do
      now = now + 1
    end
    assert.are.equal(asked, now) -- the new prompt was not asked: a replay calls no model
    s:close()
  end)

  -- on_divergence = "continue": the run goes on from the REPL the replay
  -- made, its answer marked partial, naming the step; never a plain success.
  it("goes on past a step that printed otherwise, with on_divergence = \"continue\", to a partial answer",
    function()
      local c = counters()
      local turns = with_turn(2, "import time\nt = bump('x')\nb = llm_query('q2')\nprint('two', t, b, time.time_ns())")
      local id = abandon(c, { store = store, lease_ttl = 1 }, "q5", turns)
      past_lease(1)
      local s = assert(rlm.Session.resume(id, opts_for(c, { store = store, on_divergence = "continue" }, nil, nil,
        turns)))
      local r = assert(s:run())
      s:close()
      assert.are.equal(ANSWER, r.answer)
      assert.is_true(r.partial)
      assert.are.equal("replay_diverged", r.reason.kind)
      assert.are.equal(2, r.reason.step)
      assert.matches("step 2", r.reason.message)
      -- Turns 1 and 2 from the journal; turn 3's question holds the replay's
      -- output of step 2, not the recorded one: asked live, as turn 4 is.
      assert.are.same({ 1, 1, 2, 1 }, c.root)
      assert.are.equal(1, c.tool)
      assert.are.same({}, entries(dir))
    end)

  it("asks live, with on_divergence = \"continue\", a call its record does not hold, to a partial answer",
    function()
      local c = counters()
      local turns = with_turn(1, "import time\na = llm_query('q1-%d' % time.time_ns())[:6]\nprint('one', a)")
      local id = abandon(c, { store = store, lease_ttl = 1 }, "q5", turns)
      past_lease(1)
      local asked = 0
      for _ in pairs(c.sub) do
        asked = asked + 1
      end
      local s = assert(rlm.Session.resume(id, opts_for(c, { store = store, on_divergence = "continue" }, nil, nil,
        turns)))
      local r = assert(s:run())
      s:close()
      assert.is_true(r.partial)
      assert.are.equal("replay_diverged", r.reason.kind)
      assert.are.equal(1, r.reason.step)
      local now = 0
      for _ in pairs(c.sub) do
        now = now + 1
      end
      assert.are.equal(asked + 1, now) -- the new prompt, asked live (and q5, asked again, counted before)
      assert.are.same({}, entries(dir))
    end)

  it("refuses an on_divergence that is not \"error\" or \"continue\", naming it", function()
    local ok, err = pcall(rlm.Session.new, H.opts({ journal = { store = store, on_divergence = "ignore" } }))
    assert.is_false(ok)
    assert.matches("on_divergence", err)
  end)

  it("refuses a second resumer while the first holds the lease, naming it", function()
    local c = counters()
    local id = abandon(c, { store = store, lease_ttl = 1 }, "q5")
    past_lease(1)
    local first = assert(rlm.Session.resume(id, opts_for(c, { store = store, owner = "worker-a" })))
    local second, err = rlm.Session.resume(id, opts_for(c, { store = store, owner = "worker-b" }))
    assert.is_nil(second)
    assert.are.equal("lease_held", err.kind)
    assert.are.equal("worker-a", err.owner)
    assert(first:run())
    first:close()
  end)

  it("refuses a stale owner's write once another took the lease over", function()
    local c = counters()
    local s = rlm.Session.new(opts_for(c, { store = store, lease_ttl = 1 }))
    assert(s:step())
    past_lease(1)
    local taker = assert(rlm.Session.resume(s:journal_id(), opts_for(c, { store = store })))
    local entry, err = s:step()
    assert.is_nil(entry)
    assert.are.equal("lease_lost", err.kind)
    s:close() -- the stale owner's close deletes nothing of the new owner's
    assert.is_true(#entries(dir) >= 3)
    local r = assert(taker:run())
    assert.are.equal(ANSWER, r.answer)
    taker:close()
    assert.are.same({}, entries(dir))
  end)

  it("refuses another context, and a journal that is not there", function()
    local c = counters()
    local id = abandon(c, { store = store, lease_ttl = 1 }, "q5")
    past_lease(1)
    local o = opts_for(c, { store = store })
    o.context = "another context"
    local s, err = rlm.Session.resume(id, o)
    assert.is_nil(s)
    assert.are.equal("context_mismatch", err.kind)
    s, err = rlm.Session.resume("0123456789abcdef", opts_for(c, { store = store }))
    assert.is_nil(s)
    assert.are.equal("journal_error", err.kind)
    s = assert(rlm.Session.resume(id, opts_for(c, { store = store })))
    s:close()
    assert.are.same({}, entries(dir))
  end)

  it("times a replay of N steps", function()
    -- N turns of a sub-call each, then the answer; abandoned at the last
    -- sub-call, resumed: the replay runs N - 1 steps again.
    local n = 10
    local turns = {}
    for i = 1, n do
      turns[i] = H.fence(("v%d = llm_query('p%d')\nprint(v%d)"):format(i, i, i))
    end
    turns[n + 1] = H.fence("FINAL(v1 + v" .. n .. ")")
    local asked = 0
    local function o(stop)
      return H.opts({ context = "c", query = "q", journal = { store = store, lease_ttl = 1 },
        root_llm = function(messages)
          local k = 0
          for _, m in ipairs(messages) do
            k = k + (m.role == "assistant" and 1 or 0)
          end
          return turns[k + 1]
        end,
        llm_query = function(p)
          asked = asked + 1
          if p == stop then
            coroutine.yield("gone")
          end
          return p
        end })
    end
    local id
    local co = coroutine.create(function()
      local s = rlm.Session.new(o("p" .. n))
      id = s:journal_id()
      s:run()
    end)
    assert(coroutine.resume(co))
    co = nil -- luacheck: ignore 311
    collectgarbage()
    collectgarbage()
    past_lease(1)
    asked = 0
    local t0 = core.now_ms()
    local s = assert(rlm.Session.resume(id, o(nil)))
    local r = assert(s:run())
    local ms = core.now_ms() - t0
    assert.are.equal("p1p" .. n, r.answer)
    assert.are.equal(1, asked) -- only the call whose answer never came
    s:close()
    -- The floor, in the same run: the whole run again, without a journal.
    local plain = o(nil)
    plain.journal = nil
    t0 = core.now_ms()
    assert.are.equal("p1p" .. n, assert(H.run(plain)).answer)
    local floor = core.now_ms() - t0
    print(("\n  resume by replay of %d steps, to the answer: %.0f ms; the same run of %d steps without a "
      .. "journal: %.0f ms"):format(n - 1, ms, n + 1, floor))
  end)
end)

H.describe_luv("rlm.Session.resume under rlm.adapters.luv", function()
  local L = require("helpers.luv")

  -- Drives s under the luv loop to its end: the run's answer, each
  -- sub-call asked once but q5 (in flight when the first host went away).
  local function drive_to_answer(s, c)
    local out
    require("rlm.adapters.luv").drive(s, function(err, result)
      out = { err = err, result = result }
    end)
    L.run_until(function()
      return out ~= nil
    end)
    assert.is_nil(out.err)
    assert.are.equal(ANSWER, out.result.answer)
    assert.are.same({ q1 = 1, q2 = 1, q3 = 1, q4 = 1, q5 = 2 }, c.sub)
  end
  it("goes on from an abandoned run, driven by the loop, each store call a callback", function()
    local dir = fresh_dir()
    local store = assert(journal.file(dir))
    local c = counters()
    local id = abandon(c, { store = store, lease_ttl = 1 }, "q5")
    past_lease(1)
    local s = assert(rlm.Session.resume(id, opts_for(c, { store = store })))
    drive_to_answer(s, c)
    assert.are.equal(1, c.tool)
    assert.are.same({}, entries(dir))
    s:close()
    remove_dir(dir)
  end)

  -- A store whose every call waits on the loop (a timer) first, as a
  -- network client's does: each write goes out of poll() as a request,
  -- runs in a coroutine of the adapter's, and the engine waits for it.
  local util = require("rlm.base.util")
  local it_yields = util.PCALL_YIELDS and it or function(name)
    pending(name .. ": PUC Lua 5.1's pcall cannot be yielded across, so a store's call runs in a coroutine of "
      .. "rlm's, which a wait that resumes the coroutine that yielded does not reach")
  end
  it_yields("resumes through a store whose calls yield to the loop", function()
    local dir = fresh_dir()
    local file = assert(journal.file(dir))
    local waits, yielding = 0, false
    local store = {}
    for _, m in ipairs({ "get", "set", "delete", "set_if" }) do
      store[m] = function(_, ...)
        if yielding and util.can_yield() then
          waits = waits + 1
          L.sleep(5)
        end
        return file[m](file, ...)
      end
    end
    local c = counters()
    local id = abandon(c, { store = store, lease_ttl = 1 }, "q5")
    past_lease(1)
    local s = assert(rlm.Session.resume(id, opts_for(c, { store = store })))
    yielding = true
    drive_to_answer(s, c)
    assert.is_true(waits >= 3) -- step 3's answer q5, its end, the drop
    assert.are.same({}, entries(dir))
    s:close()
    remove_dir(dir)
  end)
end)
