-- A journaled run's lease while it runs (docs/durability.md): renewed on
-- a timer while a root call or a step outlasts lease_ttl, so that no
-- resumer takes a live run over.
local H = require("helpers")
local rlm = require("rlm")
local core = require("rlm.core")
local journal = require("rlm.journal")

local seq = 0
local function fresh_dir()
  seq = seq + 1
  return ("%s/journal-lease-%d-%d"):format(H.tmpdir, H.pid(), seq)
end

local function entries(dir)
  local names = {}
  local p = assert(io.popen("ls -A " .. dir .. " 2>/dev/null"))
  for name in p:read("*a"):gmatch("[^\n]+") do
    if name ~= ".lock" then
      names[#names + 1] = name
    end
  end
  p:close()
  table.sort(names)
  return names
end

local function remove_dir(dir)
  for _, name in ipairs(entries(dir)) do
    os.remove(dir .. "/" .. name)
  end
  os.remove(dir .. "/.lock")
  os.remove(dir)
end

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
  before_each(function()
    dir = fresh_dir()
    store = assert(journal.file(dir))
  end)
  after_each(function()
    remove_dir(dir)
    H.assert_clean()
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
end)
