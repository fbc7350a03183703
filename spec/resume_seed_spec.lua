-- A replay that reproduces (docs/durability.md): a journaled session's
-- driver gets a hash seed and a `random` seed of the session's, kept in the
-- journal's head, and a resume's fresh sandbox gets the same ones, so that
-- steps that print hash() of a string, a set's order or random.random()
-- replay as they ran. Under both local backends that start a driver: the
-- bubblewrap one and rlm-keeper behind the exec backend.
local H = require("helpers")
local rlm = require("rlm")
local journal = require("rlm.journal")
local J = require("helpers.journal")

local entries = J.entries
local past_lease = J.past_lease

local KEEPER = os.getenv("PWD") .. "/" .. (os.getenv("RLM_SPEC_BUILD") or "build") .. "/rlm-keeper"
local CACHE = os.getenv("PWD") .. "/build/keeper-cache"
os.execute("mkdir -p " .. CACHE)

-- Three turns whose output depends on the driver's seeds; the second's
-- sub-call is where the first host goes away.
local TURNS = {
  H.fence("import random\na = llm_query('q1')\nprint('one', hash('abc'), random.random(), "
    .. "list({'w%d' % i for i in range(8)}), a)"),
  H.fence("b = llm_query('q2')\nprint('two', hash('abc'), random.random(), b)"),
  H.fence("FINAL(a + ' ' + b)"),
}

local function opts_for(store, stop_at, sandbox, printed)
  return H.opts({
    context = "the same context",
    query = "seeds",
    sandbox = sandbox,
    root_llm = function(messages)
      local turn = 0
      for _, m in ipairs(messages) do
        turn = turn + (m.role == "assistant" and 1 or 0)
        if printed and m.role == "user" and m.content:find("one ", 1, true) then
          printed[#printed + 1] = m.content:match("one [^\n]*")
        end
      end
      return TURNS[turn + 1]
    end,
    llm_query = function(p)
      if p == stop_at then
        coroutine.yield("gone")
      end
      return "sub:" .. p
    end,
    journal = store,
  })
end

-- A session run until its llm_query for stop_at yields, then dropped
-- unclosed (J.abandon): its journal id, and what its first step printed.
local function abandon(store, stop_at, sandbox)
  local printed = {}
  local id = J.abandon(function()
    return rlm.Session.new(opts_for(store, stop_at, sandbox, printed))
  end)
  return id, printed[1]
end

local BACKENDS = {
  { "bubblewrap", nil },
  { "the exec backend (rlm-keeper)", { backend = "exec", argv = { KEEPER, "--cache", CACHE } } },
}

describe("a journaled session's seeds", function()
  local dir, store
  J.each_store("seed", function(d, s)
    dir, store = d, s
  end)

  for _, case in ipairs(BACKENDS) do
    local name, sandbox = case[1], case[2]
    it("replay hash(), a set's order and random.random() as they ran, under " .. name, function()
      local id, printed = abandon({ store = store, lease_ttl = 1 }, "q2", sandbox)
      assert.matches("^one %-?%d+ 0%.%d+ %[", printed)
      local head = assert(journal.decode("head", store:get(journal.head_key(id))))
      assert.are.equal("number", type(head.seeds.hash))
      assert.are.equal("number", type(head.seeds.random))
      past_lease(1)
      local again = {}
      local s = assert(rlm.Session.resume(id, opts_for({ store = store }, nil, sandbox, again)))
      local r, err = s:run()
      s:close()
      assert.is_nil(err)
      assert.are.equal("sub:q1 sub:q2", r.answer)
      assert.are.same({}, entries(dir))
    end)
  end

  it("are the session's own: two journaled runs hash apart, and so do two runs without a journal", function()
    local function first_line(o)
      local out
      o.root_llm = H.script({ H.fence("import random\nprint(hash('abc'), random.random())"), function(messages)
        out = messages[#messages].content:match("(%-?%d+ 0%.%d+)")
        return H.fence("FINAL('x')")
      end })
      assert(H.run(o))
      return out
    end
    local a = first_line(H.opts({ journal = store }))
    local b = first_line(H.opts({ journal = store }))
    assert.is_string(a)
    assert.are_not.equal(a, b)
    local c = first_line(H.opts({}))
    local d = first_line(H.opts({}))
    assert.are_not.equal(c, d)
  end)

  it("are refused from a head that holds others than two integers of 1 to 2^32 - 1", function()
    local id = abandon({ store = store, lease_ttl = 1 }, "q2")
    past_lease(1)
    local head = assert(journal.decode("head", store:get(journal.head_key(id))))
    head.seeds = { hash = 2 ^ 40, random = 1 }
    store:set(journal.head_key(id), journal.encode("head", head))
    local s, err = rlm.Session.resume(id, opts_for({ store = store }))
    assert.is_nil(s)
    assert.are.equal("journal_error", err.kind)
    assert.matches("seeds", err.message)
    local lease = assert(journal.lease(store, id, "cleaner"))
    assert(lease:drop({ journal.head_key(id), journal.step_key(id, 1), journal.call_key(id, 2, 1) }))
  end)
end)
