-- A journaled run's lease while it runs and after it fails
-- (docs/durability.md): renewed on a timer while a root call or a step
-- outlasts lease_ttl, so that no resumer takes a live run over; and a run
-- that fails resumably leaves its journal whole and its lease released,
-- so that a resume right after goes on to the answer.
local H = require("helpers")
local rlm = require("rlm")
local core = require("rlm.core")
local J = require("helpers.journal")

local entries = J.entries

-- Turns whose root reply counts the assistant messages so far.
local function scripted(turns, on_call)
  return function(messages)
    local turn = 0
    for _, m in ipairs(messages) do
      turn = turn + (m.role == "assistant" and 1 or 0)
    end
    if on_call then
      on_call(turn + 1)
    end
    return turns[turn + 1]
  end
end

local TWO = { H.fence("a = llm_query('q1')\nprint(a)"), H.fence("FINAL(a)") }

describe("a journaled run's lease", function()
  local dir, store
  J.each_store("lease", function(d, s)
    dir, store = d, s
  end)

  -- The host's own loop (poll, reply, run the journal's requests), its
  -- root call answered 5 s after it went out: 2.5 lease_ttl.
  it("is renewed while a root call outlasts lease_ttl: a second resumer gets lease_held", function()
    local s = rlm.Session.new(H.opts({ context = "c", query = "q", journal = { store = store, lease_ttl = 2 },
      root_llm = function()
        error("answered by the loop")
      end }))
    local id = s:journal_id()
    local held, out_at, second, result
    local renewals = 0
    while not result do
      local ev = s:poll()
      if ev and ev.type == "journal" then
        renewals = renewals + 1
        ev.run()
        s:reply(ev.id, "")
      elseif ev and ev.type == "root_llm" then
        held, out_at = ev, core.now_ms()
      elseif ev and ev.type == "llm_query" then
        s:reply(ev.id, "sub:" .. ev.prompt)
      elseif ev and (ev.type == "done" or ev.type == "error") then
        result = ev
      elseif ev and ev.type == "step" then -- luacheck: ignore 542
      elseif ev then
        error("unexpected " .. ev.type)
      elseif held and core.now_ms() - out_at >= 5000 then
        local turn = 0
        for _, m in ipairs(held.messages) do
          turn = turn + (m.role == "assistant" and 1 or 0)
        end
        s:reply(held.id, TWO[turn + 1])
        held = nil
      else
        if held and not second and core.now_ms() - out_at >= 3500 then
          local err
          second, err = rlm.Session.resume(id, H.opts({ context = "c", query = "q",
            journal = { store = store, owner = "second" } }))
          assert.is_nil(second)
          assert.are.equal("lease_held", err.kind)
          second = err
        end
        os.execute("sleep 0.02")
      end
    end
    assert.are.equal("done", result.type, result.err and tostring(result.err.kind) .. ": " .. tostring(result.err))
    assert.are.equal("sub:q1", result.result.answer)
    assert.is_truthy(second)
    -- The lease, the head, the calls, the steps, the drop, and renewals.
    assert.is_true(renewals >= 10, renewals)
    s:close()
    assert.are.same({}, entries(dir))
  end)

  it("is renewed while a step outlasts lease_ttl under run()", function()
    local err2, s
    s = rlm.Session.new(H.opts({ context = "c", query = "q", journal = { store = store, lease_ttl = 2 },
      root_llm = scripted({ H.fence("import time\ntime.sleep(5)\na = llm_query('q1')\nprint(a)"),
        H.fence("FINAL(a)") }),
      llm_query = function(p)
        -- 5 s into the step: the lease must still be this run's.
        local second
        second, err2 = rlm.Session.resume(s:journal_id(), H.opts({ context = "c", query = "q",
          journal = { store = store, owner = "second" } }))
        assert.is_nil(second)
        return "sub:" .. p
      end }))
    local r, err = s:run()
    s:close()
    assert.is_nil(err)
    assert.are.equal("sub:q1", r.answer)
    assert.are.equal("lease_held", err2.kind)
    assert.are.same({}, entries(dir))
  end)

  -- The lease file's text: "rlm-lease-1 <fence> <expires> <owner>".
  local function lease_of(id)
    local f = assert(io.open(dir .. "/" .. id .. ".lease"))
    local text = f:read("*a")
    f:close()
    return text
  end

  -- A run of two sub-call steps whose second root call fails the first
  -- time (the endpoint down), or whose budget allows one sub-call.
  local THREE = { H.fence("a = llm_query('q1')\nprint(a)"), H.fence("b = llm_query('q2')\nprint(b)"),
    H.fence("FINAL(a + ' ' + b)") }
  local function opts_for(asked, extra)
    local o = H.opts({ context = "c", query = "q", journal = { store = store, lease_ttl = 30 },
      root_llm = scripted(THREE, function(turn)
        asked[#asked + 1] = turn
        if asked.down == turn then
          asked.down = nil
          error("connection refused")
        end
      end),
      llm_query = function(p)
        asked[p] = (asked[p] or 0) + 1
        return "sub:" .. p
      end })
    for k, v in pairs(extra or {}) do
      o[k] = v
    end
    return o
  end

  it("is let go, the entries kept, when a root call fails: close() then resume goes on to the answer", function()
    local asked = { down = 2 }
    local s = rlm.Session.new(opts_for(asked))
    local id = s:journal_id()
    local r, err = s:run()
    assert.is_nil(r)
    assert.are.equal("callback_error", err.kind)
    assert.is_true(err.resumable)
    s:close()
    -- Every entry stays (the head, step 1), the lease let go: no wait for its 30 s.
    assert.is_true(#entries(dir) >= 3)
    assert.matches("^rlm%-lease%-1 %d+ 0 $", lease_of(id))
    local t0 = core.now_ms()
    local again = assert(rlm.Session.resume(id, opts_for(asked)))
    r = assert(again:run())
    again:close()
    assert.are.equal("sub:q1 sub:q2", r.answer)
    assert.is_true(core.now_ms() - t0 < 20000)
    -- Root calls: turn 2 again (it failed, and was no answer); nothing else twice.
    assert.are.same({ 1, 2, 2, 3, q1 = 1, q2 = 1 }, asked)
    assert.are.same({}, entries(dir))
  end)

  it("is taken again when the same session goes on after a resumable error", function()
    local asked = { down = 2 }
    local s = rlm.Session.new(opts_for(asked))
    local r, err = s:run()
    assert.is_nil(r)
    assert.is_true(err.resumable)
    r = assert(s:run())
    assert.are.equal("sub:q1 sub:q2", r.answer)
    assert.are.same({}, entries(dir))
    s:close()
  end)

  it("is let go, the entries kept, when a budget ends the run: a resume with more budget goes on", function()
    local asked = {}
    local s = rlm.Session.new(opts_for(asked, { max_sub_calls = 1, fallback = false }))
    local id = s:journal_id()
    local r, err = s:run()
    assert.is_nil(r)
    assert.are.equal("sub_call_budget", err.kind)
    s:close()
    assert.is_true(#entries(dir) >= 3)
    assert.matches("^rlm%-lease%-1 %d+ 0 $", lease_of(id))
    local again = assert(rlm.Session.resume(id, opts_for(asked, { max_sub_calls = 5, fallback = false })))
    r = assert(again:run())
    again:close()
    assert.are.equal("sub:q1 sub:q2", r.answer)
    assert.are.equal(1, asked.q1)
    assert.are.same({}, entries(dir))
  end)
end)

