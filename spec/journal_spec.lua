-- rlm.journal (docs/durability.md): the store seam, the file store and the
-- Redis store (a real redis-server of the spec's own, through Debian's
-- lua-redis, and through the same client read the way lua-resty-redis
-- answers), the lease with its fencing number, and the records. Every
-- store runs the same cases.
local journal = require("rlm.journal")
local json = require("rlm.base.json")
local lease_mod = require("rlm.journal.lease")
local H = require("helpers")
local R = require("helpers.redis")

-- Runs fn in a coroutine as a host's loop does: resumes it after each
-- yield. Returns the yields and fn's results.
local function drive(fn)
  local co = coroutine.create(fn)
  local yields = 0
  local res = { coroutine.resume(co) }
  while coroutine.status(co) ~= "dead" do
    assert.is_true(res[1], res[2])
    yields = yields + 1
    res = { coroutine.resume(co) }
  end
  assert.is_true(res[1], res[2])
  return yields, res[2], res[3]
end

-- s, its every call yielding first (as a cosocket's does); before(name)
-- runs at each call, if given.
local function yielding(s, before)
  local y = {}
  for _, m in ipairs({ "get", "set", "delete", "set_if" }) do
    y[m] = function(_, ...)
      if before then
        before(m)
      end
      coroutine.yield("store io")
      return s[m](s, ...)
    end
  end
  return y
end

-- redis-lua's client, answering as lua-resty-redis does: a Redis nil as
-- the null sentinel, a failure as nil, message (never a raise).
local NULL = setmetatable({}, { __tostring = function()
  return "null"
end })
local function resty_style(client)
  local c = {}
  for _, m in ipairs({ "get", "set", "del", "eval" }) do
    c[m] = function(_, ...)
      local ok, v = pcall(client[m], client, ...)
      if not ok then
        return nil, tostring(v)
      end
      if v == nil then
        return NULL
      end
      if type(v) == "table" and v[1] == 0 and v[2] == nil then
        v[2] = NULL
      end
      return v == true and "OK" or v
    end
  end
  return c
end

local server, server_why
local prefixes = 0

-- The stores: name, and make(opts) -> a fresh, empty store.
local STORES = {
  { name = "file", make = function(dir, opts)
    return assert(journal.file(dir .. "/journal", opts))
  end },
  { name = "redis (redis-lua)", redis = true, make = function(_, opts)
    prefixes = prefixes + 1
    opts = opts or {}
    opts.prefix = ("spec%d:"):format(prefixes)
    return journal.redis(server.connect(), opts)
  end },
  { name = "redis (lua-resty-redis's answers)", redis = true, make = function(_, opts)
    prefixes = prefixes + 1
    opts = opts or {}
    opts.prefix = ("spec%d:"):format(prefixes)
    return journal.redis(resty_style(server.connect()), opts)
  end },
}

-- Keys no store may take: a path, a separator, a dot file, a control
-- character, too long, not a string.
local BAD_KEYS = {
  { "../outside", "a parent directory" },
  { "/etc/passwd", "an absolute path" },
  { "a/b", "a separator" },
  { "", "empty" },
  { ".", "the directory itself" },
  { "..", "its parent" },
  { ".lock", "the store's lock" },
  { ".tmp-a-1-1", "a temporary file's name" },
  { "a\0b", "a NUL" },
  { "a\nb", "a newline" },
  { "a b", "a space" },
  { "a{b}", "braces (a Redis hash tag)" },
  { ("k"):rep(201), "201 bytes" },
  { 42, "a number", "must be a string, not number" },
}

for _, kind in ipairs(STORES) do
  describe("the journal's " .. kind.name .. " store", function()
    local dir

    setup(function()
      if kind.redis then
        server, server_why = R.start()
        if server_why then
          print("skipping the Redis store: " .. server_why)
        end
      end
    end)

    teardown(function()
      if server then
        server.stop()
        server = nil
      end
    end)

    before_each(function()
      dir = H.scratch("rlm-journal-spec")
    end)

    after_each(function()
      H.remove_scratch(dir)
    end)

    local function make(opts)
      if kind.redis and not server then
        return nil
      end
      return kind.make(dir, opts)
    end

    -- A lease case's start: the store, worker-a's lease of s1 (30 s) on a
    -- clock the case moves (t.now; t.opts for more acquirers), or nothing
    -- when this store cannot run.
    local function leased(now)
      local s = make()
      if not s then
        return nil
      end
      local t = { now = now }
      t.opts = { ttl = 30, clock = function()
        return t.now
      end }
      return s, assert(journal.lease(s, "s1", "worker-a", t.opts)), t
    end

    it("gets what was set, nothing for a key never set, nothing once deleted", function()
      local s = make()
      if not s then
        return pending(server_why)
      end
      assert.is_nil(s:get("s1.head"))
      assert.is_true(s:set("s1.head", "one"))
      assert.equals("one", s:get("s1.head"))
      assert.is_true(s:set("s1.head", "two\0bytes\255"))
      assert.equals("two\0bytes\255", s:get("s1.head"))
      assert.is_true(s:delete("s1.head"))
      assert.is_nil(s:get("s1.head"))
      assert.is_true(s:delete("s1.head"))
    end)

    it("sets only when the guard holds what is expected (nil: absent), atomically", function()
      local s = make()
      if not s then
        return pending(server_why)
      end
      assert.is_true(s:set_if("s1.lease", nil, "s1.lease", "a"))
      local ok, current = s:set_if("s1.lease", nil, "s1.lease", "b")
      assert.is_false(ok)
      assert.equals("a", current)
      ok, current = s:set_if("s1.lease", "x", "s1.step.1", "data")
      assert.is_false(ok)
      assert.equals("a", current)
      assert.is_nil(s:get("s1.step.1"))
      assert.is_true(s:set_if("s1.lease", "a", "s1.step.1", "data"))
      assert.equals("data", s:get("s1.step.1"))
      assert.is_true(s:set_if("s1.lease", "a", "s1.step.1", nil))
      assert.is_nil(s:get("s1.step.1"))
      ok, current = s:set_if("s1.other", "a", "s1.step.1", "x")
      assert.is_false(ok)
      assert.is_nil(current)
    end)

    it("works through a store whose calls yield, inside a coroutine", function()
      local s = make()
      if not s then
        return pending(server_why)
      end
      local ys = yielding(s)
      local yields, l = drive(function()
        local l = assert(journal.lease(ys, "s1", "w1"))
        assert(l:write("s1.step.1", "one"))
        assert(l:renew())
        return l
      end)
      assert.equals(4, yields) -- get and set_if of the acquire, the write, the renew
      assert.equals(1, l.fence)
      assert.equals("one", s:get("s1.step.1"))
    end)

    it("gives the lease to one of two acquirers that race, and names it to the other", function()
      local s = make()
      if not s then
        return pending(server_why)
      end
      -- Both read the lease's entry (absent) before either writes it.
      local a = coroutine.create(function()
        return journal.lease(yielding(s), "s1", "worker-a")
      end)
      local b = coroutine.create(function()
        return journal.lease(yielding(s), "s1", "worker-b")
      end)
      local ra, rb = { coroutine.resume(a) }, { coroutine.resume(b) }
      while coroutine.status(a) ~= "dead" or coroutine.status(b) ~= "dead" do
        if coroutine.status(a) ~= "dead" then
          ra = { coroutine.resume(a) }
        end
        if coroutine.status(b) ~= "dead" then
          rb = { coroutine.resume(b) }
        end
      end
      assert.is_true(ra[1], ra[2])
      assert.is_true(rb[1], rb[2])
      assert.is_table(ra[2])
      assert.is_nil(rb[2])
      local err = rb[3]
      assert.equals("lease_held", err.kind)
      assert.equals("worker-a", err.owner)
      assert.matches("held by worker%-a", tostring(err))
      assert.equals(1, ra[2].fence)
    end)

    it("refuses a second owner while the lease lives, and lets it take over once it expired", function()
      local s, a, t = leased(1000)
      if not s then
        return pending(server_why)
      end
      t.now = 1029
      local b, err = journal.lease(s, "s1", "worker-b", t.opts)
      assert.is_nil(b)
      assert.equals("lease_held", err.kind)
      assert.equals("worker-a", err.owner)
      assert.is_true(a:renew()) -- now expires at 1059
      t.now = 1058
      assert.is_nil((journal.lease(s, "s1", "worker-b", t.opts)))
      t.now = 1060
      b = assert(journal.lease(s, "s1", "worker-b", t.opts))
      assert.equals(2, b.fence)
      assert.is_true(b:write("s1.head", "b's"))
    end)

    it("refuses every write of a stale owner once another took the lease over", function()
      local s, a, t = leased(1000)
      if not s then
        return pending(server_why)
      end
      assert.is_true(a:write("s1.head", "a's"))
      local stale = a.value
      t.now = 2000
      local b = assert(journal.lease(s, "s1", "worker-b", t.opts))
      assert.equals(2, b.fence)
      for _, attempt in ipairs({
        function()
          return a:write("s1.head", "stale")
        end,
        function()
          return a:write("s1.step.9", "stale")
        end,
        function()
          return a:delete("s1.head")
        end,
        function()
          return a:renew()
        end,
        function()
          return a:release()
        end,
      }) do
        a.value = stale -- as a's process still believes: the store must refuse it
        local ok, err = attempt()
        assert.is_nil(ok)
        assert.equals("lease_lost", err.kind)
        assert.equals("worker-b", err.owner)
        assert.matches("taken over by worker%-b %(fence 2%)", err.message)
      end
      assert.equals("a's", s:get("s1.head"))
      assert.is_nil(s:get("s1.step.9"))
      -- b's lease is whole, and b writes on.
      local fence, _, owner = lease_mod.decode(s:get("s1.lease"))
      assert.equals(2, fence)
      assert.equals("worker-b", owner)
      assert.is_true(b:write("s1.head", "b's"))
    end)

    it("keeps the fence across a release: the next owner's is greater", function()
      local s = make()
      if not s then
        return pending(server_why)
      end
      local a = assert(journal.lease(s, "s1", "worker-a"))
      assert.is_true(a:release())
      local ok, err = a:write("s1.head", "after release")
      assert.is_nil(ok)
      assert.equals("lease_lost", err.kind)
      local b = assert(journal.lease(s, "s1", "worker-b"))
      assert.equals(2, b.fence)
    end)

    -- bin/rlm --resume, for a killed rlm of its machine (lease.release_for).
    it("lets go of a gone holder's lease as read, keeping its fence; not one that changed since", function()
      local s, a, t = leased(os.time())
      if not s then
        return pending(server_why)
      end
      local read = s:get("s1.lease")
      t.now = t.now + 5
      assert.is_true(a:renew()) -- the lease changed since it was read
      assert.is_false(lease_mod.release_for(s, "s1", read))
      local _, err = journal.lease(s, "s1", "worker-b", t.opts)
      assert.equals("lease_held", err.kind)
      assert.is_true(lease_mod.release_for(s, "s1", s:get("s1.lease")))
      local ok
      ok, err = a:write("s1.head", "after")
      assert.is_nil(ok)
      assert.equals("lease_lost", err.kind)
      local b = assert(journal.lease(s, "s1", "worker-b", t.opts))
      assert.equals(2, b.fence)
      assert.equals("journal_error", select(2, lease_mod.release_for(s, "s1", "not a lease")).kind)
    end)

    it("deletes a session's entries and its lease at its end", function()
      local s = make()
      if not s then
        return pending(server_why)
      end
      local a = assert(journal.lease(s, "s1", "worker-a"))
      local keys = { journal.head_key("s1"), journal.step_key("s1", 1), journal.call_key("s1", 2, 1) }
      for _, k in ipairs(keys) do
        assert.is_true(a:write(k, "x"))
      end
      assert.is_true(s:set("s2.head", "another session's"))
      assert.is_true(a:drop(keys))
      for _, k in ipairs(keys) do
        assert.is_nil(s:get(k))
      end
      assert.is_nil(s:get("s1.lease"))
      assert.equals("another session's", s:get("s2.head"))
      assert.is_nil((a:write("s1.head", "x")))
    end)

    it("forgets an entry past its lifetime (opts.ttl)", function()
      local s = make({ ttl = 1 })
      if not s then
        return pending(server_why)
      end
      assert.is_true(s:set("s1.head", "short-lived"))
      assert.equals("short-lived", s:get("s1.head"))
      os.execute("sleep 2.2")
      assert.is_nil(s:get("s1.head"))
    end)

    for _, case in ipairs(BAD_KEYS) do
      it(("refuses a key with %s, in every method"):format(case[2]), function()
        local s = make()
        if not s then
          return pending(server_why)
        end
        local key = case[1]
        for _, call in ipairs({
          function()
            return s:get(key)
          end,
          function()
            return s:set(key, "x")
          end,
          function()
            return s:delete(key)
          end,
          function()
            return s:set_if(key, nil, "s1.head", "x")
          end,
          function()
            return s:set_if("s1.lease", nil, key, "x")
          end,
        }) do
          assert.error_matches(call, case[3] or "not a journal key")
        end
        if kind.name == "file" then
          assert.equals("", H.sh("ls -A " .. dir .. "/journal | grep -v '^.lock$' || true"))
        end
      end)
    end

    it("refuses a value past max_value_bytes, and a lease's write of one returns journal_error", function()
      local s = make({ max_value_bytes = 1024 })
      if not s then
        return pending(server_why)
      end
      assert.is_true(s:set("s1.head", ("x"):rep(1024)))
      assert.error_matches(function()
        s:set("s1.head", ("x"):rep(1025))
      end, "1025 bytes is larger than the store's max_value_bytes %(1024%)")
      assert.error_matches(function()
        s:set("s1.head", 5)
      end, "value must be a string")
      local a = assert(journal.lease(s, "s1", "worker-a"))
      local ok, err = a:write("s1.step.1", ("x"):rep(2000))
      assert.is_nil(ok)
      assert.equals("journal_error", err.kind)
      assert.matches("max_value_bytes", err.message)
      assert.is_nil(s:get("s1.step.1"))
      assert.equals(("x"):rep(1024), s:get("s1.head"))
    end)

    it("gives each lease to exactly one of 6 processes that acquire 40 at once", function()
      local s = make()
      if not s then
        return pending(server_why)
      end
      local child = dir .. "/acquire.lua"
      local f = assert(io.open(child, "w"))
      local open_store
      if kind.redis then
        open_store = ("local R = require('helpers.redis'); local c = R.client_module().connect({ scheme = 'unix', "
          .. "path = %q }); local s = require('rlm.journal').redis(c, { prefix = %q })"):format(server.socket,
          s.prefix)
      else
        open_store = ("local s = assert(require('rlm.journal').file(%q))"):format(dir .. "/journal")
      end
      f:write(open_store, "\n", [[
-- All start at once: each sleeps until the moment the spec gave.
local p = io.popen("date +%s.%N")
local now = tonumber(p:read("*a"))
p:close()
os.execute(("sleep %.3f"):format(math.max(0, tonumber(arg[2]) - now)))
local out = {}
for i = 1, 40 do
  local l, err = require("rlm.journal").lease(s, "race" .. i, "worker-" .. arg[1])
  out[#out + 1] = ("race%d %s\n"):format(i, l and ("won " .. l.fence) or (err.kind .. " " .. tostring(err.owner)))
end
io.write(table.concat(out))
]])
      f:close()
      local lua = H.lua_name()
      local go = tonumber(H.sh("date +%s.%N")) + 1.5
      local out = H.sh(("for i in 1 2 3 4 5 6; do %s %s $i %.3f & done; wait"):format(lua, child, go))
      local won, held = {}, {}
      for id, line in out:gmatch("(race%d+) ([^\n]+)") do
        if line == "won 1" then
          won[id] = (won[id] or 0) + 1
        else
          assert.matches("^lease_held worker%-%d$", line)
          held[id] = (held[id] or 0) + 1
        end
      end
      for i = 1, 40 do
        local id = "race" .. i
        assert.equals(1, won[id], id .. " won by " .. tostring(won[id]) .. ":\n" .. out)
        assert.equals(5, held[id], id)
        local winner = select(3, lease_mod.decode(s:get(id .. ".lease")))
        for name in out:gmatch(id .. " lease_held (%S+)") do
          assert.equals(winner, name)
        end
      end
    end)
  end)
end

describe("rlm.journal.check", function()
  it("raises naming a missing method", function()
    assert.error_matches(function()
      journal.check({ get = function() end, set = function() end, delete = function() end })
    end, "store.set_if must be a function, not nil")
    assert.error_matches(function()
      journal.check("dir")
    end, "store must be an object with get, set, delete and set_if methods, not string")
    journal.check(setmetatable({}, { __index = {
      get = function() end, set = function() end, delete = function() end, set_if = function() end,
    } }))
  end)

  it("turns a store that raises, or returns nil, message, into journal_error", function()
    local raising = { get = function()
      error("connection refused")
    end, set = function() end, delete = function() end, set_if = function()
      return nil, "timeout"
    end }
    local l, err = journal.lease(raising, "s1", "w")
    assert.is_nil(l)
    assert.equals("journal_error", err.kind)
    assert.matches("connection refused", err.message)
    raising.get = function()
      return nil
    end
    l, err = journal.lease(raising, "s1", "w")
    assert.is_nil(l)
    assert.equals("journal_error", err.kind)
    assert.matches("set_if failed: timeout", err.message)
  end)
end)

describe("the journal's records", function()
  local head = {
    id = "s1", seq = 41, steps = 12, created = 1764800000, updated = 1764800100,
    counts = { iterations = 12, sub_calls = 30, tokens = { input = 123456, output = 7890, total = 131346 } },
    sandbox = { backend = "exec", id = "s1-3", token = ("c"):rep(32), fence = 3, seen = 41, sent = 12, exec = 12 },
  }

  it("encodes and decodes each kind with its version", function()
    local text = journal.encode("head", head)
    assert.matches('"v":1', text)
    assert.are.same(head, journal.decode("head", text))
    local step = { seq = 42, n = 13, messages = { { role = "assistant", content = "```repl\nprint(1)\n```" },
      { role = "user", content = "1\n" } }, calls = { { k = 1, via = "llm", call = ("a"):rep(64), text = "yes" } } }
    assert.are.same(step, journal.decode("step", journal.encode("step", step)))
    local call = { seq = 43, n = 14, k = 2, via = "tool", call = ("b"):rep(64), error = "refused" }
    assert.are.same(call, journal.decode("call", journal.encode("call", call)))
  end)

  -- The head's text with its sandbox's fields changed (json.null: left out).
  local function with_sandbox(over)
    local t, sb = { v = 1, kind = "head" }, {}
    for k, v in pairs(head) do
      t[k] = v
    end
    for k, v in pairs(head.sandbox) do
      sb[k] = v
    end
    for k, v in pairs(over) do
      sb[k] = v ~= json.null and v or nil
    end
    t.sandbox = sb
    return json.encode(t)
  end

  it("refuses what it cannot read: another version, another kind, a field missing or wrong, not JSON", function()
    local text = journal.encode("head", head)
    local cases = {
      { text:gsub('"v":1', '"v":2'), "version 2" },
      { text, "a head record where a step was expected", "step" },
      { text:gsub('"seq":41', '"seq":"41"'), "field seq must be a number" },
      { json.encode({ v = 1, kind = "head", seq = 1, steps = 0, created = 0, updated = 0, counts = {} }),
        "field id must be a string" },
      { json.encode({ v = 1, kind = "head", id = "s1", seq = 1, steps = 0, created = 0, updated = 0, counts = {},
        extra = true }), "no field extra in a head record" },
      -- the lingering keeper's fields, held as the record's own
      { with_sandbox({ seen = "41" }), "field sandbox.seen must be a number" },
      { with_sandbox({ fence = json.null }), "field sandbox.fence must be a number, not nil" },
      { with_sandbox({ where = "/run/rlm/s1.sock" }), "no field sandbox.where in a head record" },
      { "{not json", "not a JSON object" },
      { "[1,2]", "version nil" },
    }
    for _, case in ipairs(cases) do
      local t, err = journal.decode(case[3] or "head", case[1])
      assert.is_nil(t, case[2])
      assert.equals("journal_error", err.kind)
      assert.matches(case[2], err.message, 1, true)
    end
  end)

  it("raises when asked to encode a field it does not know", function()
    assert.error_matches(function()
      journal.encode("call", { seq = 1, n = 1, k = 1, via = "llm", call = "x", extra = 1 })
    end, "no field extra in a call record")
    assert.error_matches(function()
      journal.encode("nope", {})
    end, "no record kind nope")
  end)
end)
