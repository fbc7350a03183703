-- rlm.Session.resume by re-attach (issue 41; docs/durability.md, "Resume"):
-- a real host process (spec/helpers/resume_host.lua) runs a journaled
-- session over the exec backend with a local rlm-keeper that lingers, and
-- is SIGKILLed at a point of its run; this process resumes it from the
-- file journal and goes on in the keeper's REPL as it was: no step run
-- again (a token only that REPL holds is in the answer, and step 2's
-- counter is 1), no recorded call asked twice, and the old owner's fence
-- refused by the keeper. Past the linger time, the resume replays.
local H = require("helpers")
local D = require("helpers.linger")
local R = require("helpers.resume_attach")
local rlm = require("rlm")
local core = require("rlm.core")
local cjson = require("cjson")
local journal = require("rlm.journal")
local lease = require("rlm.journal.lease")
local linger = require("rlm.sandbox.linger")
local J = require("helpers.journal")

local entries = J.entries

-- A path of this process's own for a journal, a keeper's socket
-- directory (which the keeper makes and removes) or a killed host's
-- scratch directory (its canaries: the sandbox's start plants them there
-- and removes them at the first exec, which a host killed before it does
-- not reach).
local seq = 0
local function fresh(kind)
  seq = seq + 1
  return ("/tmp/rlm-resume-attach-%s-%d-%d"):format(kind, H.pid(), seq)
end

-- A host that runs the journaled run and is SIGKILLed at stop. Returns what
-- it said: id, pid, keeper (its pid), asked (the calls it made, in order).
local function host_killed(jdir, ldir, ms, stop, random, tmpdir)
  local p = assert(io.popen(("exec %s spec/helpers/resume_host.lua %s %s %d %s %s %s"):format(D.LUA, jdir, ldir, ms,
    stop, random and "random" or "fixed", tmpdir)))
  local said = { asked = {} }
  for line in p:lines() do
    local m = cjson.decode(line)
    if m.id then
      said.id, said.pid = m.id, m.pid
    elseif m.asked then
      said.asked[#said.asked + 1] = m.asked
    elseif m.stop then
      said.keeper = m.keeper
      break
    else
      error("the host went on to its end: " .. line)
    end
  end
  assert(said.keeper, "the host did not stop at " .. stop)
  assert(os.execute(("kill -9 %d 2>/dev/null"):format(said.pid)))
  p:close()
  return said
end

-- The dead host's lease let go of, as bin/rlm --resume does for a killed
-- rlm of its own (its owner is proven gone: this spec killed it).
local function released(store, id)
  assert.is_true(lease.release_for(store, id, assert(store:get(id .. ".lease"))))
end

-- How many times each call was asked, by the host and by the resume.
local function tally(...)
  local n = {}
  for _, asked in ipairs({ ... }) do
    for _, what in ipairs(asked) do
      local key = what:gsub("^llm (q%d).*", "%1")
      n[key] = (n[key] or 0) + 1
    end
  end
  return n
end

-- Resumes id, stepping to the first step's end (its output must match
-- first) and then to the answer. Returns the result, the calls it asked,
-- the ms to the resumed session and to the first step's end.
local function resume(store, ldir, ms, id, random, first, check)
  local asked = {}
  local o = R.options(R.turns(random), store, ldir, ms, H.tmpdir, function(what)
    asked[#asked + 1] = what
  end)
  local t0 = core.now_ms()
  local s = assert(rlm.Session.resume(id, o))
  local resumed_ms = core.now_ms() - t0
  local entry, err = s:step()
  local first_ms = core.now_ms() - t0
  assert(entry, err and tostring(err))
  assert.matches(first, entry.stdout)
  if check then
    check(s)
  end
  local r
  r, err = s:run()
  assert(r, err and tostring(err))
  s:close()
  return r, asked, resumed_ms, first_ms
end

-- Whether the keeper pid and its socket's directory are gone within ms
-- (default 5 s: what a close hands to the keeper is over moments later).
local function gone(pid, dir, ms)
  local w = assert(core.waitset())
  local t0 = core.now_ms()
  while (D.running(pid) or D.exists(dir)) and core.now_ms() - t0 < (ms or 5000) do
    w:wait(20)
  end
  w:close()
  return not (D.running(pid) or D.exists(dir))
end

local function remove_dir(dir)
  for _, name in ipairs(entries(dir)) do
    os.remove(dir .. "/" .. name)
  end
  os.remove(dir .. "/.lock")
  os.remove(dir)
end

describe("rlm.Session.resume of a run whose keeper lingers", function()
  local jdir, store, tmpdir
  before_each(function()
    jdir, tmpdir = fresh("journal"), fresh("tmp")
    store = R.store(jdir)
    assert(os.execute("mkdir -m 0700 " .. tmpdir))
  end)
  after_each(function()
    remove_dir(jdir)
    remove_dir(tmpdir)
    H.assert_clean()
  end)

  -- Where the host was killed (one row a case), how many times each call
  -- was asked in all, by it and by the resume (a recorded answer once; the
  -- call out at the kill, twice: its answer never came), and what the
  -- resume's first step printed.
  local TWO = "^two 1 sub:q2\n$"
  local KILLS = {
    { "in step 1, its root answer recorded (the head says where the sandbox is from its start)", "wrote:.call.1.1",
      { ["root 1"] = 1, ["root 2"] = 1, ["root 3"] = 1, q1 = 1, q2 = 1 }, "^set %x+\n$" },
    { "after step 1 set x, in step 2's root call", "root:2",
      { ["root 1"] = 1, ["root 2"] = 2, ["root 3"] = 1, q1 = 1, q2 = 1 }, TWO },
    { "with step 2's root answer recorded and its code not yet sent", "wrote:.call.2.1",
      { ["root 1"] = 1, ["root 2"] = 1, ["root 3"] = 1, q1 = 1, q2 = 1 }, TWO },
    { "mid-step 2, q1's answer recorded and not yet handed to the REPL", "wrote:.call.2.2",
      { ["root 1"] = 1, ["root 2"] = 1, ["root 3"] = 1, q1 = 1, q2 = 1 }, TWO },
    { "mid-step 2, q1 answered, in q2's call", "llm:q2",
      { ["root 1"] = 1, ["root 2"] = 1, ["root 3"] = 1, q1 = 1, q2 = 2 }, TWO },
  }
  for _, case in ipairs(KILLS) do
    it("goes on in the REPL as it was, killed " .. case[1] .. ": the same answer, nothing run or asked twice",
      function()
        local ldir = fresh("linger")
        local said = host_killed(jdir, ldir, 60000, case[2], true, tmpdir)
        local head = assert(journal.decode("head", assert(store:get(journal.head_key(said.id)))))
        local rec = head.sandbox
        assert.are.same({ "exec", said.id .. "-1", 1 }, { rec.backend, rec.id, rec.fence })
        -- the token step 1's REPL made, as the journal holds its output
        local step1 = store:get(journal.step_key(said.id, 1))
        local tok = step1 and journal.decode("step", step1).messages[2].content:match("set (%x+)")
        released(store, said.id)
        local r, asked, resumed_ms, first_ms = resume(store, ldir, 60000, said.id, true, case[4], function()
          -- the old owner's fence no longer reaches the sandbox
          local h, err = linger.attach(D.options(ldir, 60000), { id = rec.id, token = rec.token, fence = rec.fence,
            seen = rec.seen })
          assert.is_nil(h)
          assert.are.equal("sandbox_unavailable", err.kind)
          assert.matches("a stale fence", err.message, 1, true)
        end)
        tok = tok or r.answer:match("^42 1 sub:q1 (%x+) sub:q2$")
        assert.are.equal(R.answer(tok), r.answer)
        assert.are.equal("attach", r.resumed)
        assert.are.same(case[3], tally(said.asked, asked))
        assert.are.equal(3, r.iterations)
        assert.are.equal(2, r.sub_calls)
        assert.are.same({}, entries(jdir))
        -- the resumed session's close ends the keeper: nothing lingers
        assert.is_true(gone(said.keeper, ldir))
        if case[2] == "root:2" then
          print(("\n  resume by re-attach after step 1: Session.resume %.0f ms, to the end of the first step %.0f ms")
            :format(resumed_ms, first_ms))
        end
      end)
  end

  it("says so in session_start and sandbox_ready", function()
    local ldir = fresh("linger")
    local said = host_killed(jdir, ldir, 60000, "root:2", true, tmpdir)
    released(store, said.id)
    local seen = {}
    local o = R.options(R.turns(true), store, ldir, 60000, H.tmpdir, function() end)
    o.on_event = function(ev)
      if ev.type == "session_start" or ev.type == "sandbox_ready" then
        seen[#seen + 1] = { ev.type, ev.resumed or ev.start }
      end
    end
    local s = assert(rlm.Session.resume(said.id, o))
    local r = assert(s:run())
    s:close()
    assert.are.equal("attach", r.resumed)
    assert.are.same({ { "session_start", "attach" }, { "sandbox_ready", "attach" } }, seen)
    -- the steps not run again are in the history as the journal holds them
    assert.is_true(r.history[1].restored)
    assert.matches("x = 42", r.history[1].code, 1, true)
    assert.matches("set %x+", r.history[1].told)
    assert.is_nil(r.history[2].restored)
    assert.is_true(gone(said.keeper, ldir))
  end)

  it("leaves the sandbox to the new owner while the old one still runs: its write is refused, its end kills nothing",
    function()
      local ldir = fresh("linger")
      local a = rlm.Session.new(R.options(R.turns(true), { store = store, lease_ttl = 1 }, ldir, 60000, tmpdir,
        function() end))
      assert(a:step())
      local until_s = os.time() + 2 -- the old owner's lease runs out
      while os.time() < until_s do
        os.execute("sleep 0.1")
      end
      local b = assert(rlm.Session.resume(a:journal_id(), R.options(R.turns(true), store, ldir, 60000, tmpdir,
        function() end)))
      local entry, err = a:step()
      assert.is_nil(entry)
      assert.are.equal("lease_lost", err.kind)
      -- its close, and the stream's end past the 2 s a stream's group is
      -- given (csrc/keeper.c), leave the keeper, the new owner's now
      a:close()
      os.execute("sleep 3")
      local r = assert(b:run())
      b:close()
      assert.are.equal("attach", r.resumed)
      assert.matches("^42 1 sub:q1 %x+ sub:q2$", r.answer)
      assert.are.same({}, entries(jdir))
    end)

  it("replays in a fresh sandbox once linger_ms is over, and gets the same answer", function()
    local ldir = fresh("linger")
    local said = host_killed(jdir, ldir, 1500, "root:2", false, tmpdir)
    assert.is_true(gone(said.keeper, ldir, 30000)) -- 1.5 s after the kill, and its end
    released(store, said.id)
    local r, asked, resumed_ms, first_ms = resume(store, ldir, 1500, said.id, false, "^two 1 sub:q2\n$")
    assert.are.equal(R.answer("fixed"), r.answer)
    assert.are.equal("replay", r.resumed)
    assert.are.same({ ["root 1"] = 1, ["root 2"] = 2, ["root 3"] = 1, q1 = 1, q2 = 1 }, tally(said.asked, asked))
    assert.are.same({}, entries(jdir))
    assert.is_true(gone(said.keeper, ldir))
    print(("\n  resume by replay of step 1 in a fresh sandbox: Session.resume %.0f ms, to the end of the first "
      .. "step %.0f ms"):format(resumed_ms, first_ms))
  end)
end)
