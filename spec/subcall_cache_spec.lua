-- The sub-call cache (option sub_call_cache): the same prompt to the same
-- model at the same depth is answered once per session tree; a hit costs
-- no sub-call, no token and no budget, and the code sees the same text.
local H = require("helpers")
local cache = require("rlm.engine.cache")
local rlm = require("rlm")
local fence = H.fence

local L = require("helpers.luv")

-- A sub-model that counts what it is paid for: prompt -> calls.
local function counting(usage)
  local paid = { n = 0, by = {} }
  local fn = function(prompt)
    paid.n = paid.n + 1
    paid.by[prompt] = (paid.by[prompt] or 0) + 1
    return "answer to " .. prompt, usage
  end
  return fn, paid
end

local events = H.events_of

-- A run that asks 3 prompts 4 times each over two turns, lone and batched;
-- its answer is what the code received, in order.
local REPEATS = {
  fence("got = [llm_query('p%d' % (i % 3)) for i in range(6)]\nprint(len(got))"),
  fence("got += llm_query_batched(['p%d' % (i % 3) for i in range(6)])\nFINAL(repr(got))"),
}

describe("the sub-call cache", function()
  after_each(H.assert_clean)

  it("pays a repeated prompt once; the code gets the same text as without it", function()
    local without_fn, without = counting()
    local plain = assert(H.run({ root_llm = H.script(REPEATS), llm_query = without_fn }))
    local with_fn, with = counting()
    local log = {}
    local cached = assert(H.run({ root_llm = H.script(REPEATS), llm_query = with_fn, sub_call_cache = true,
      on_event = function(ev)
        log[#log + 1] = ev
      end }))
    assert.equals(plain.answer, cached.answer)
    assert.equals(12, without.n)
    assert.equals(12, plain.sub_calls)
    assert.equals(0, plain.cache_hits)
    assert.equals(3, with.n)
    assert.same({ p0 = 1, p1 = 1, p2 = 1 }, with.by)
    assert.equals(3, cached.sub_calls)
    assert.equals(9, cached.cache_hits)
    -- The log: 12 sub_query events, the hits marked cached, without an
    -- index (not a sub-call) or usage; run_end counts them.
    local subs = events(log, "sub_query")
    assert.equals(12, #subs)
    local hits = 0
    for _, ev in ipairs(subs) do
      if ev.cached then
        hits = hits + 1
        assert.equals(hits, ev.cache_hit)
        assert.is_nil(ev.index)
        assert.is_nil(ev.usage)
        assert.equals("answer to " .. ev.prompt, ev.response)
      else
        assert.is_number(ev.index)
      end
    end
    assert.equals(9, hits)
    assert.equals(9, events(log, "run_end")[1].cache_hits)
    -- A batch's hits keep their place in it.
    local batched = {}
    for _, ev in ipairs(subs) do
      if ev.batch_id then
        batched[ev.batch_index] = ev.cached or false
      end
    end
    assert.same({ true, true, true, true, true, true }, batched)
  end)

  it("spends nothing of max_sub_calls or max_total_tokens on a hit", function()
    -- Two prompts of 15 tokens each reach max_total_tokens (30); the other
    -- eight calls of the same block are hits, and the run ends with its
    -- answer. Without the cache the third call is past the budget.
    local script = H.script({ fence("got = [llm_query('q%d' % (i % 2)) for i in range(10)]\nFINAL(str(len(got)))") })
    local opts = { root_llm = script, max_sub_calls = 2, max_total_tokens = 30, fallback = false }
    opts.llm_query = counting({ input_tokens = 10, output_tokens = 5 })
    local _, err = H.run(opts)
    assert.equals("sub_call_budget", err.kind)
    local fn, paid = counting({ input_tokens = 10, output_tokens = 5 })
    opts.llm_query, opts.sub_call_cache = fn, true
    opts.root_llm = H.script({ fence("got = [llm_query('q%d' % (i % 2)) for i in range(10)]\nFINAL(str(len(got)))") })
    local result = assert(H.run(opts))
    assert.equals("10", result.answer)
    assert.equals(2, paid.n)
    assert.equals(2, result.sub_calls)
    assert.equals(8, result.cache_hits)
    assert.equals(30, result.tokens.total)
  end)

  it("answers a batch's hits past max_sub_calls, and only its misses get the budget's error", function()
    local fn, paid = counting()
    local result = assert(H.run({
      root_llm = H.script({
        fence("a = llm_query('x')\nprint(a)"),
        fence("r = llm_query_batched(['x', 'y', 'x'])\n"
          .. "FINAL(' | '.join(type(v).__name__ + ': ' + str(v) for v in r))"),
      }),
      llm_query = fn, max_sub_calls = 1, sub_call_cache = true,
    }))
    assert.equals(1, paid.n)
    assert.equals(2, result.cache_hits)
    assert.equals("str: answer to x | SubCallError: Error: not sent: the session's max_sub_calls (1) are "
      .. "spent | str: answer to x", result.answer)
  end)

  it("keys a call by its model hint and its depth as well as its prompt", function()
    local fn, paid = counting()
    local result = assert(H.run({
      root_llm = H.script({ fence("for m in ['a', 'b', 'a', None, None]:\n    llm_query('same', model=m)\n"
        .. "FINAL('ok')") }),
      llm_query = fn, sub_call_cache = true,
    }))
    assert.equals(3, paid.n) -- a, b, and no hint
    assert.equals(2, result.cache_hits)
    assert.are_not.equal(cache.key("p", nil, 0), cache.key("p", nil, 1))
    assert.are_not.equal(cache.key("p", "m", 0), cache.key("p", nil, 0))
    -- The model's length first: no hint and prompt that spell the same string.
    assert.are_not.equal(cache.key("b:c", "a", 0), cache.key("c", "a:b", 0))
    -- The namespace's length first too, and none differs from an empty one.
    assert.are_not.equal(cache.key("p", nil, 0, "a"), cache.key("p", nil, 0, "b"))
    assert.are_not.equal(cache.key("p", nil, 0, "1:"), cache.key("p", nil, 0))
    assert.are_not.equal(cache.key("p", nil, 0, "2:x"), cache.key("p", nil, 0, "x"))
    assert.matches("^rlm%-sub%-v2:%x+$", cache.key(("long "):rep(100000), nil, 0, ("n"):rep(1024)))
    assert.equals(75, #cache.key(("long "):rep(100000), nil, 0, ("n"):rep(1024)))
  end)

  it("never keeps an error: a failed call is asked again, and its answer then kept", function()
    local failures = 1
    local paid = 0
    local result = assert(H.run({
      root_llm = H.script({ fence([[
out = []
for i in range(3):
    try:
        out.append(llm_query('flaky'))
    except RuntimeError as e:
        out.append('raised: ' + str(e)[:40])
FINAL(repr(out))]]) }),
      llm_query = function(p)
        paid = paid + 1
        if failures > 0 then
          failures = failures - 1
          return nil, "HTTP 500"
        end
        return "fine: " .. p
      end,
      sub_call_cache = true,
    }))
    assert.equals("['raised: llm_query failed: HTTP 500', 'fine: flaky', 'fine: flaky']", result.answer)
    assert.equals(2, paid)
    assert.equals(1, result.cache_hits)
  end)

  it("never keeps a batch slot's error", function()
    local calls = 0
    local result = assert(H.run({
      root_llm = H.script({ fence("r1 = llm_query_batched(['a', 'b'])\nr2 = llm_query_batched(['a', 'b'])\n"
        .. "FINAL(' | '.join(str(v) for v in r1 + r2))") }),
      llm_query = function(p)
        calls = calls + 1
        if p == "a" and calls == 1 then
          error("overloaded")
        end
        return "ok " .. p
      end,
      sub_call_cache = true,
    }))
    assert.equals(3, calls) -- a failed, b, a again
    assert.equals(1, result.cache_hits) -- b
    assert.matches("^Error: llm_query failed: [^|]*overloaded | ok b | ok a | ok b$", result.answer)
  end)

  it("pays once for a prompt asked again while its call is out: a batch's repeats", function()
    local fn, paid = counting()
    local log = {}
    local result = assert(H.run({
      root_llm = H.script({ fence("FINAL(repr(llm_query_batched(['p', 'q', 'p', 'p', 'q', 'r'])))") }),
      llm_query = fn, sub_call_cache = true,
      on_event = function(ev)
        log[#log + 1] = ev
      end,
    }))
    assert.equals("['answer to p', 'answer to q', 'answer to p', 'answer to p', 'answer to q', 'answer to r']",
      result.answer)
    assert.same({ p = 1, q = 1, r = 1 }, paid.by)
    assert.equals(3, result.sub_calls)
    assert.equals(3, result.cache_hits)
    local cached = {}
    for _, ev in ipairs(events(log, "sub_query")) do
      if ev.cached then
        cached[#cached + 1] = ev.batch_index
      end
    end
    table.sort(cached)
    assert.same({ 3, 4, 5 }, cached) -- each repeat in its own slot
  end)

  it("sends the calls that waited on a failed one out themselves", function()
    local calls = 0
    local result = assert(H.run({
      root_llm = H.script({ fence("FINAL(' | '.join(str(v) for v in llm_query_batched(['a', 'a', 'a'])))") }),
      llm_query = function(p)
        calls = calls + 1
        if calls == 1 then
          error("overloaded")
        end
        return "ok " .. p
      end,
      sub_call_cache = true,
    }))
    -- The first 'a' fails; the two that waited on it go out, one paying and
    -- the other waiting on that one in its turn.
    assert.equals(2, calls)
    assert.equals(1, result.cache_hits)
    assert.matches("^Error: llm_query failed: [^|]*overloaded | ok a | ok a$", result.answer)
  end)

  it("does not count again the answers a rolled-back block kept (issue 28)", function()
    -- Turn 1: 'p' paid, then a hit, then the block raises: the driver keeps
    -- both answers. Turn 2 gets those two back from the driver (no request
    -- reaches the host) and a third 'p' is a hit: 1 paid, 2 hits.
    local fn, paid = counting()
    local log = {}
    local result = assert(H.run({
      root_llm = H.script({
        fence("a = llm_query('p')\nb = llm_query('p')\nraise ValueError('not yet')"),
        fence("a = llm_query('p')\nb = llm_query('p')\nc = llm_query('p')\nFINAL(a + '|' + c)"),
      }),
      llm_query = fn, sub_call_cache = true,
      on_event = function(ev)
        log[#log + 1] = ev
      end,
    }))
    assert.equals("answer to p|answer to p", result.answer)
    assert.equals(1, paid.n)
    assert.equals(1, result.sub_calls)
    assert.equals(2, result.cache_hits)
    assert.equals(3, #events(log, "sub_query"))
    assert.matches("2 llm_query answers are kept", result.history[1].error, 1, true)
  end)

  it("caches neither a tool call nor an rlm_query", function()
    local tool_calls, log = 0, {}
    local result = assert(H.run({
      root_llm = H.script({
        fence("a = [lookup('k'), lookup('k')]\nb = [rlm_query('same'), rlm_query('same')]\nFINAL(repr(a + b))"),
        fence("FINAL('nested')"),
      }),
      tools = { lookup = function(k)
        tool_calls = tool_calls + 1
        return "v" .. k
      end },
      max_depth = 2, sub_call_cache = true,
      on_event = function(ev)
        log[#log + 1] = ev
      end,
    }))
    assert.equals(2, tool_calls)
    assert.equals(0, result.cache_hits)
    assert.equals(2, result.sub_calls) -- the two rlm_query sessions
    local started = 0
    for _, ev in ipairs(events(log, "session_start")) do
      started = started + (ev.depth == 1 and 1 or 0)
    end
    assert.equals(2, started)
  end)

  for _, kind in ipairs({ "the built-in cache", "a host's store" }) do
    it("is shared by the nested sessions of a tree, keyed by depth: " .. kind, function()
      -- Two nested sessions (depth 1), one after the other, ask the same
      -- prompt: paid once. The root asks it too, at depth 0: another key,
      -- paid once more. A host's store is asked through the root's poll()
      -- for the nested sessions too. (One after the other: the cache keeps
      -- answers, not calls in flight, so two sessions side by side that ask
      -- at once may each pay, as the batch once did here when their first
      -- root calls came to go out as their sandboxes started.)
      local store = { data = {} }
      function store:get(key)
        return self.data[key]
      end
      function store:set(key, value)
        self.data[key] = value
      end
      local paid = {}
      local root = function(messages)
        local question = messages[2].content
        if question:find("child", 1, true) then
          return fence("FINAL(llm_query('shared prompt'))")
        end
        if #messages == 2 then
          return fence("r = [rlm_query('child one'), rlm_query('child two')]\n"
            .. "mine = [llm_query('shared prompt'), llm_query('shared prompt')]\nFINAL(repr(r + mine))")
        end
        return "FINAL('unexpected')"
      end
      local result = assert(H.run({
        root_llm = root,
        llm_query = function(p, info)
          paid[#paid + 1] = info.depth
          return ("depth %d: %s"):format(info.depth, p)
        end,
        max_depth = 2, sub_call_cache = { store = kind == "a host's store" and store or nil, namespace = "t" },
      }))
      assert.equals("['depth 1: shared prompt', 'depth 1: shared prompt', 'depth 0: shared prompt', "
        .. "'depth 0: shared prompt']", result.answer)
      table.sort(paid)
      assert.same({ 0, 1 }, paid)
      assert.equals(2, result.cache_hits)
      if kind == "a host's store" then
        local n = 0
        for _ in pairs(store.data) do
          n = n + 1
        end
        assert.equals(2, n)
      end
    end)
  end
end)

describe("a host's cache (sub_call_cache = { store = { get =, set = }, namespace = })", function()
  after_each(H.assert_clean)

  -- A store over a Lua table, called as methods (an ngx.shared dict's form).
  local function table_store()
    local store = { data = {}, gets = 0, sets = 0 }
    function store:get(key)
      self.gets = self.gets + 1
      return self.data[key]
    end
    function store:set(key, value)
      self.sets = self.sets + 1
      self.data[key] = value
      return true
    end
    return store
  end

  it("is asked and filled, and outlives the session: the next one pays nothing", function()
    local store = table_store()
    local fn, paid = counting()
    local first = assert(H.run({ root_llm = H.script(REPEATS), llm_query = fn, sub_call_cache = { store = store,
      namespace = "t" } }))
    assert.equals(3, paid.n)
    assert.equals(9, first.cache_hits)
    assert.equals(12, store.gets)
    assert.equals(3, store.sets)
    local n = 0
    for key, value in pairs(store.data) do
      n = n + 1
      assert.matches("^rlm%-sub%-v2:%x+$", key)
      assert.matches("^answer to p%d$", value)
    end
    assert.equals(3, n)
    local second = assert(H.run({ root_llm = H.script(REPEATS), llm_query = fn, sub_call_cache = { store = store,
      namespace = "t" } }))
    assert.equals(first.answer, second.answer)
    assert.equals(3, paid.n) -- nothing more
    assert.equals(12, second.cache_hits)
    assert.equals(0, second.sub_calls)
  end)

  -- Two tenants (two customers' keys, two models) on one store: each
  -- session's answers are its own unless both name the same namespace.
  it("keeps each namespace's answers apart in one store, and shares them under one namespace", function()
    local store = table_store()
    local code = H.script({ fence("FINAL(repr([llm_query('p%d' % i) for i in range(3)]))") })
    local function tenant(name)
      local paid = { n = 0 }
      return function(p)
        paid.n = paid.n + 1
        return name .. " says " .. p
      end, paid
    end
    local a_fn, a_paid = tenant("A")
    local b_fn, b_paid = tenant("B")
    local a = assert(H.run({ root_llm = code, llm_query = a_fn, sub_call_cache = { store = store,
      namespace = "customer-a" } }))
    code = H.script({ fence("FINAL(repr([llm_query('p%d' % i) for i in range(3)]))") })
    local b = assert(H.run({ root_llm = code, llm_query = b_fn, sub_call_cache = { store = store,
      namespace = "customer-b" } }))
    assert.equals("['A says p0', 'A says p1', 'A says p2']", a.answer)
    assert.equals("['B says p0', 'B says p1', 'B says p2']", b.answer)
    assert.same({ 3, 3, 0 }, { a_paid.n, b_paid.n, b.cache_hits })
    code = H.script({ fence("FINAL(repr([llm_query('p%d' % i) for i in range(3)]))") })
    local again = assert(H.run({ root_llm = code, llm_query = b_fn, sub_call_cache = { store = store,
      namespace = "customer-a" } }))
    assert.equals(a.answer, again.answer) -- said so: A's answers, paid by nobody
    assert.same({ 3, 3 }, { b_paid.n, again.cache_hits })
  end)

  it("raises for a host's store without a namespace", function()
    local ok, err = pcall(rlm.Session.new, H.opts({ sub_call_cache = { store = table_store() } }))
    assert.is_false(ok)
    assert.matches("option 'sub_call_cache.store' (a host's store) needs option 'sub_call_cache.namespace'", err, 1, true)
    for _, bad in ipairs({ "", ("n"):rep(1025), 7 }) do
      ok, err = pcall(rlm.Session.new, H.opts({ sub_call_cache = { store = table_store(), namespace = bad } }))
      assert.is_false(ok)
      assert.matches("option 'sub_call_cache.namespace' must be a string of 1 to 1024 bytes", err, 1, true)
    end
  end)

  it("takes a get that raises or answers nil as a miss", function()
    local fn, paid = counting()
    local result = assert(H.run({
      root_llm = H.script(REPEATS), llm_query = fn,
      sub_call_cache = { store = { get = function()
        error("store down")
      end, set = function() end }, namespace = "t" },
    }))
    -- Nothing is ever found: the 6 lone calls are each paid; of the batch's
    -- 6, a repeat waits for the same prompt's call out beside it (3 paid, 3
    -- hits).
    assert.equals(9, paid.n)
    assert.equals(3, result.cache_hits)
  end)

  it("raises naming the method it lacks", function()
    local rows = {
      { 5, "option 'sub_call_cache' must be true, false, or a table { store = a cache (an object with get(key) "
        .. "and set(key, value) methods), namespace = a string of 1 to 1024 bytes }, got 5" },
      { { store = {}, namespace = "t" }, "option 'sub_call_cache.store.get' must be a function (a method: called "
        .. "as cache:get(key)), got nil" },
      { { store = { get = function() end }, namespace = "t" }, "option 'sub_call_cache.store.set' must be a "
        .. "function (a method: called as cache:set(key, value)), got nil" },
      { { store = { get = "x", set = function() end }, namespace = "t" },
        "option 'sub_call_cache.store.get' must be a function" },
      -- a host's cache given as the option itself, as it was before
      { { get = function() end, set = function() end }, "option 'sub_call_cache' is a table { store = cache, "
        .. "namespace = \"...\" } now" },
    }
    for _, row in ipairs(rows) do
      local ok, err = pcall(rlm.Session.new, H.opts({ sub_call_cache = row[1] }))
      assert.is_false(ok)
      assert.matches(row[2], err, 1, true)
    end
  end)

  it("comes to a poll() driver as cache_get and cache_set requests", function()
    local store = table_store()
    local s = H.session({ root_llm = H.script({ fence("a = llm_query('z')\nb = llm_query('z')\nFINAL(a + b)") }),
      sub_call_cache = { store = store, namespace = "t" } })
    local seen, result = {}, nil
    for _ = 1, 10000 do
      local ev = s:poll()
      if ev == nil then
        local ms = s:timeout()
        if ms ~= 0 then
          s.engine:watched():wait(ms)
        end
      elseif ev.type == "root_llm" then
        s:reply(ev.id, s.opts.root_llm(ev.messages))
      elseif ev.type == "llm_query" then
        seen[#seen + 1] = "llm_query"
        s:reply(ev.id, "zz")
      elseif ev.type == "cache_get" then
        seen[#seen + 1] = "get"
        assert.equals(0, ev.depth)
        s:reply(ev.id, store:get(ev.key))
      elseif ev.type == "cache_set" then
        seen[#seen + 1] = "set"
        s:reply(ev.id, store:set(ev.key, ev.value))
      elseif ev.type == "done" then
        result = ev.result
        break
      elseif ev.type == "error" then
        error(tostring(ev.err))
      end
    end
    s:close()
    assert.equals("zzzz", result.answer)
    assert.same({ "get", "llm_query", "set", "get" }, seen)
    assert.equals(1, result.cache_hits)
  end)
end)

H.describe_luv("a host's cache under the luv adapter", function()
  after_each(H.assert_clean)

  it("may yield in get and set: each waits on a timer of the loop", function()
    local store = { data = {}, waits = 0 }
    function store:get(key)
      self.waits = self.waits + 1
      L.sleep(5)
      return self.data[key]
    end
    function store:set(key, value)
      self.waits = self.waits + 1
      L.sleep(5)
      self.data[key] = value
    end
    local fn, paid = counting()
    local plain = assert(L.run_session({ root_llm = H.script(REPEATS), llm_query = counting() }))
    local result = assert(L.run_session({ root_llm = H.script(REPEATS), llm_query = fn, sub_call_cache = { store = store,
      namespace = "t" } }))
    assert.equals(plain.answer, result.answer)
    assert.equals(3, paid.n)
    assert.equals(9, result.cache_hits)
    assert.equals(15, store.waits) -- 12 gets, 3 sets
  end)
end)

H.describe_luv("calls in flight under the luv adapter", function()
  after_each(H.assert_clean)

  it("pays once for a prompt that sibling nested sessions ask side by side", function()
    -- Each sub-call waits 50 ms on the loop: the two nested sessions ask
    -- 'shared' while the other's call is out.
    local paid
    local root = function(messages)
      local question = messages[2].content
      if question:find("child", 1, true) then
        return fence("FINAL(llm_query('shared'))")
      end
      return fence("FINAL(repr(rlm_query_batched(['child one', 'child two'])))")
    end
    for _, store in ipairs({ true, { data = {}, get = function(self, k)
      return self.data[k]
    end, set = function(self, k, v)
      self.data[k] = v
    end } }) do
      paid = {}
      local result = assert(L.run_session({
        root_llm = root, max_depth = 2, sub_call_cache = { store = store ~= true and store or nil, namespace = "t" },
        llm_query = function(p, info)
          paid[#paid + 1] = info.depth
          L.sleep(50)
          return ("depth %d: %s"):format(info.depth, p)
        end,
      }))
      assert.equals("['depth 1: shared', 'depth 1: shared']", result.answer)
      assert.same({ 1 }, paid)
      assert.equals(1, result.cache_hits)
    end
  end)
end)

describe("the built-in cache's bounds", function()
  it("keeps at most MAX_ENTRIES entries, the least recently used going first", function()
    local c = cache.new(true)
    for i = 1, cache.MAX_ENTRIES do
      c:set("k" .. i, "v")
    end
    assert.equals("v", c:get("k1")) -- k1 is now the most recent
    c:set("new", "v")
    assert.equals(cache.MAX_ENTRIES, c.count)
    assert.equals("v", c:get("k1"))
    assert.is_nil(c:get("k2"))
    assert.equals("v", c:get("new"))
  end)

  it("keeps at most MAX_BYTES of keys and values, and never one larger", function()
    local c = cache.new(true)
    local big = ("x"):rep(cache.MAX_BYTES / 4)
    for i = 1, 5 do
      c:set("k" .. i, big)
    end
    assert.is_true(c.bytes <= cache.MAX_BYTES)
    assert.equals(3, c.count)
    assert.is_nil(c:get("k1"))
    assert.is_nil(c:get("k2"))
    c:set("huge", ("x"):rep(cache.MAX_BYTES))
    assert.is_nil(c:get("huge"))
    assert.equals(3, c.count)
  end)

  it("replaces an entry kept under the same key", function()
    local c = cache.new(true)
    c:set("k", "one")
    c:set("k", "two")
    assert.equals(1, c.count)
    assert.equals(#"k" + #"two", c.bytes)
    assert.equals("two", c:get("k"))
  end)
end)
