-- rlm.Pool: warm, self-tested sandboxes, one per session. No timing is
-- asserted here (bench/pool.lua measures).
local H = require("helpers")
local rlm = require("rlm")
local core = require("rlm.core")
local cjson = require("cjson")
local fence = H.fence

local L = require("helpers.luv")
local luv_adapter = L and require("rlm.adapters.luv")

local function sleep(ms)
  local ws = assert(core.waitset())
  ws:wait(ms)
  ws:close()
end

-- Waits until every idle sandbox of the pool has run its self-test.
local function settle(pool)
  local t0 = core.now_ms()
  while true do
    local st = pool:stats()
    if st.starting == 0 and st.ready >= #pool.idle then
      return st
    end
    assert(core.now_ms() - t0 < 60000, "the pool did not settle")
    sleep(10)
  end
end

local function new_pool(size, opts)
  local o = { size = size }
  for k, v in pairs(opts or {}) do
    o[k] = v
  end
  o.sandbox = H.sandbox(o.sandbox)
  return assert(rlm.Pool.new(o))
end

-- A session from the pool whose root model runs `code`, then FINALs what it
-- printed.
local function pooled(pool, code, opts)
  local o = H.opts({ pool = pool, root_llm = H.script({ fence(code), fence("FINAL(out)") }) })
  for k, v in pairs(opts or {}) do
    o[k] = v
  end
  return rlm.Session.new(o)
end

-- Runs a session on the pool's next sandbox: its result, error, whether any
-- model code ran, and the session (closed).
-- `ran`: the root model's reply was taken (its code ran, or would have).
-- The model may be asked while the sandbox starts (docs/api.md, the first
-- root call); a start that fails must drop its reply unread.
local function take_run(pool)
  local ran = false
  local s = rlm.Session.new(H.opts({ pool = pool, root_llm = function()
    return fence("FINAL('x')")
  end, on_event = function(ev)
    ran = ran or ev.type == "root_response" or ev.type == "exec_result"
  end }))
  local result, err = s:run()
  s:close()
  return result, err, ran, s
end

local function alive(pid)
  return H.sh("test -d /proc/" .. pid .. " && echo yes || echo no") == "yes"
end

-- Each of pids gone, moments after its keeper let go of it (up to 5 s).
local function assert_gone(pids)
  for _, p in ipairs(pids) do
    assert.is_false(H.settled(function()
      return alive(p)
    end, function(up)
      return not up
    end), "pid " .. p)
  end
end

local function pool_pids(pool)
  local pids = {}
  for _, e in ipairs(pool.idle) do
    for _, p in ipairs(e.drv:tree()) do
      pids[#pids + 1] = p
    end
  end
  return pids
end

describe("rlm.Pool", function()
  local pool
  after_each(function()
    if pool then
      pool:close()
      pool = nil
    end
    H.assert_clean()
  end)

  it("hands a warm sandbox to a session, which answers from its context", function()
    pool = new_pool(2)
    settle(pool)
    local s = pooled(pool, "out = context.upper()", { context = "hello pool" })
    local result, err = s:run()
    assert.is_nil(err)
    assert.are.equal("HELLO POOL", result.answer)
    assert.are.equal("warm", s.sandbox.start)
    s:close()
    local st = pool:stats()
    assert.are.equal(1, st.taken)
    assert.are.equal(0, st.cold)
  end)

  it("loads a JSON context and a 10 MB text context intact", function()
    pool = new_pool(2)
    local s = pooled(pool, "out = '%d %s' % (len(context['rows']), context['rows'][2]['name'])",
      { context = { rows = { { name = "a" }, { name = "b" }, { name = "c\226\130\172" } } } })
    local result, err = s:run()
    s:close()
    assert.is_nil(err)
    assert.are.equal("3 c\226\130\172", result.answer)
    local big = ("0123456789abcdef"):rep(10 * 2 ^ 20 / 16 - 1) .. "tail of it\n!"
    local want = H.sh("printf %s " .. ("'%s'"):format(big:sub(-64)) .. " | wc -c")
    assert.are.equal("64", want)
    s = pooled(pool, "import hashlib\nout = '%d %s' % (len(context), hashlib.sha256(context.encode()).hexdigest())",
      { context = big })
    result, err = s:run()
    s:close()
    assert.is_nil(err)
    local f = assert(io.open(H.tmpdir .. "/big", "wb"))
    f:write(big)
    f:close()
    local sha = H.sh("sha256sum " .. H.tmpdir .. "/big | cut -d' ' -f1")
    os.remove(H.tmpdir .. "/big")
    assert.are.equal(#big .. " " .. sha, result.answer)
    assert.are.equal("warm", s.sandbox.start)
  end)

  it("writes a large context off the host's thread, and a close meanwhile neither hangs nor leaks", function()
    pool = new_pool(1)
    settle(pool)
    local big = ("x"):rep(64 * 2 ^ 20)
    local s = pooled(pool, "out = str(len(context))", { context = big })
    local t0 = core.now_ms()
    -- The first poll takes the sandbox and starts the write, and hands out
    -- the root model's first call, which goes out while the sandbox starts.
    local ev = s:poll()
    assert.are.equal("root_llm", ev.type)
    assert.is_nil(s:poll())
    assert.is_true(s.sandbox.context_writing)
    assert.are.equal(1, s:timeout())
    s:close()
    assert.is_true(core.now_ms() - t0 < 5000)
    -- And one that is left to finish.
    s = pooled(pool, "out = str(len(context))", { context = big })
    local result, err = s:run()
    s:close()
    assert.is_nil(err)
    assert.are.equal(tostring(#big), result.answer)
  end)

  -- The late context's write is polled with 1 ms waits on a sandbox that
  -- says nothing meanwhile. A wait's timer set from the loop's stale clock
  -- fired before the loop's poll, which then blocked with no timer left
  -- (LuaJIT, pool vetting from its refill): the host hung in epoll_wait
  -- until the sandbox spoke, and an idle one never does. The deadline
  -- bounds the wait here, so that the bug fails the spec instead of hanging it.
  it("ends a short wait on an idle sandbox on time, however long its loop has not run", function()
    pool = new_pool(1)
    settle(pool)
    local drv = pool.idle[1].drv
    drv:set_deadline(5000)
    for _ = 1, 20 do
      drv:wait(1)
      local t = core.now_ms()
      repeat until core.now_ms() - t >= 5 -- the loop's clock goes 5 ms stale
      local t0 = core.now_ms()
      drv:wait(1)
      local took = core.now_ms() - t0
      assert(took < 1000, ("a 1 ms wait took %.0f ms"):format(took))
    end
    drv:set_deadline(0)
    assert.are.equal(1, pool:stats().ready)
  end)

  -- Waits, without vetting it (as a server that never calls stats()), until
  -- an idle sandbox has said its whole start.
  local function started(entry)
    local t0 = core.now_ms()
    while #entry.events < 3 do
      assert(pool:_drain(entry, false), "the pooled sandbox died")
      assert(core.now_ms() - t0 < 60000, "the pooled sandbox did not start")
      sleep(10)
    end
    assert.is_nil(entry.vetted)
  end

  it("vets its idle sandboxes at a take's refill and at the session's close, with no stats()", function()
    pool = new_pool(2)
    started(pool.idle[1])
    local b = pool.idle[2]
    started(b)
    local s = pooled(pool, "out = 'x'")
    finally(function()
      s:close()
    end)
    assert(s:run())
    -- The refill (at the first step) vetted the other one, and spawned one.
    assert.is_table(b.vetted)
    assert.is_nil(b.vetted.error)
    local c = pool.idle[2]
    assert.are_not.equal(b, c)
    started(c)
    s:close()
    assert.is_table(c.vetted)
    assert.is_nil(c.vetted.error)
    -- The next take is the vetted one, and its session runs.
    s = pooled(pool, "out = 'y'")
    local result, err = s:run()
    assert.is_nil(err)
    assert.are.equal("y", result.answer)
    assert.are.equal(b.drv, s.sandbox.driver)
    assert.are.equal("warm", s.sandbox.start)
    s:close()
  end)

  it("gives each session a sandbox of its own: nothing of the first reaches the second", function()
    pool = new_pool(2, { guardrails = false })
    settle(pool)
    local s1 = pooled(pool, "secret_global = 42\nopen('/session/left.txt', 'w').write('x')\nout = 'ok'")
    assert.are.equal("ok", (assert(s1:run())).answer)
    local pid1 = s1.sandbox.driver:pid()
    s1:close()
    local s2 = pooled(pool, "import os\nout = '%s %s' % ('secret_global' in globals(), sorted(os.listdir('/session')))")
    local r2 = assert(s2:run())
    assert.are_not.equal(pid1, s2.sandbox.driver:pid())
    s2:close()
    assert.are.equal("False []", r2.answer)
    assert.are.equal(2, pool:stats().taken)
  end)

  it("never hands one sandbox out twice", function()
    pool = new_pool(3)
    local seen = {}
    for _ = 1, 5 do
      local s = pooled(pool, "out = 'x'")
      assert(s:run())
      local pid = s.sandbox.driver:pid()
      assert.is_nil(seen[pid])
      seen[pid] = true
      s:close()
    end
  end)

  it("seals the late context before model code runs: no write to it, no descriptor but the pipes", function()
    pool = new_pool(1, { guardrails = false })
    settle(pool)
    -- Every way back to the context's memfd that model code might find: its
    -- old descriptor, and any process of the sandbox still holding it.
    local code = [[
import os
tried = []
for path in ['/proc/self/fd/4'] + ['/proc/%s/fd/%s' % (p, f) for p in os.listdir('/proc') if p.isdigit()
                                    for f in (os.listdir('/proc/%s/fd' % p) if os.access('/proc/%s/fd' % p, os.R_OK) else [])]:
    try:
        target = os.readlink(path)
    except OSError:
        continue
    if 'memfd' not in target and path != '/proc/self/fd/4':
        continue
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:
        tried.append('open %s: %s' % (target, e.errno))
        continue
    try:
        os.write(fd, b'overwritten')
        tried.append('WROTE ' + target)
    except OSError as e:
        tried.append('write %s: %s' % (target, e.errno))
    try:
        os.ftruncate(fd, 1)
        tried.append('TRUNCATED ' + target)
    except OSError as e:
        tried.append('truncate %s: %s' % (target, e.errno))
try:
    os.write(4, b'x')
    tried.append('WROTE fd 4')
except OSError as e:
    tried.append('fd 4: %s' % e.errno)
fds = sorted(int(f) for f in os.listdir('/proc/self/fd'))
out = '%s | %s | %s' % (context, fds, tried)
]]
    -- A process outside holding the memfd writable (this host, through the
    -- driver's /proc/<pid>/fd/4 before the take) cannot change it after
    -- the seal, while the model reads it.
    local tree = pool.idle[1].drv:tree()
    local outside = assert(io.open("/proc/" .. tree[#tree] .. "/fd/4", "r+b"))
    local wrote
    local s = pooled(pool, code, { context = "the context",
      root_llm = H.script({ function()
        outside:seek("set", 0)
        outside:write("XXX")
        wrote = outside:flush() ~= nil
        return fence(code)
      end, fence("FINAL(out)") }) })
    local result, err = s:run()
    s:close()
    outside:close()
    assert.is_nil(err)
    assert.is_nil(s.conversation.history[1].error)
    assert.is_false(wrote)
    local ctx, fds, tried = result.answer:match("^(.-) | (.-) | (.*)$")
    assert.are.equal("the context", ctx)
    -- 0, 1, 2 and the listing's own.
    assert.are.equal(4, #cjson.decode(fds))
    assert.is_nil(tried:find("WROTE", 1, true), tried)
    assert.is_nil(tried:find("TRUNCATED", 1, true), tried)
  end)

  it("fails a session closed when its context cannot be sealed", function()
    pool = new_pool(1)
    settle(pool)
    local entry = pool.idle[1]
    -- The host's writable end, used up: write_context must refuse.
    assert(entry.drv:write_context("already"))
    local s = pooled(pool, "out = context")
    local result, err = s:run()
    s:close()
    assert.is_nil(result)
    assert.are.equal("sandbox_violation", err.kind)
    assert.matches("sealed", err.message)
  end)

  it("starts cold when the pool is empty", function()
    pool = new_pool(1)
    local s1 = pooled(pool, "out = 'one'")
    local s2 = pooled(pool, "out = 'two'")
    -- Both start at their first poll: s1 takes the one sandbox, s2 finds
    -- none (s1's replacement waits for s1's first step).
    s1:poll()
    s2:poll()
    assert.are.equal("one", (assert(s1:run())).answer)
    assert.are.equal("two", (assert(s2:run())).answer)
    assert.are.equal("warm", s1.sandbox.start)
    assert.are.equal("cold", s2.sandbox.start)
    s1:close()
    s2:close()
    assert.are.equal(1, pool:stats().cold)
  end)

  it("starts no sandbox from a session's finalizer: the next take starts the one it owes", function()
    pool = new_pool(1)
    settle(pool)
    local s = pooled(pool, "out = 'one'")
    s:poll() -- takes the one sandbox; its refill waits for the first step
    local pids = s.sandbox.driver:tree()
    assert.is_true(#pids > 0)
    assert.are.equal(1, pool:stats().spawned)
    -- What a collection runs (called here: Lua 5.1 and LuaJIT run no __gc
    -- for a table).
    getmetatable(s).__gc(s)
    assert.is_nil(s.sandbox.driver)
    assert.are.same({}, H.settled_children())
    assert_gone(pids)
    assert.are.equal(1, pool:stats().spawned)
    assert.are.equal(0, #pool.idle)
    -- The take after it starts the replacement and hands it out.
    local s2 = pooled(pool, "out = 'two'")
    local result, err = s2:run()
    assert.is_nil(err)
    assert.are.equal("two", result.answer)
    assert.are.equal("warm", s2.sandbox.start)
    s2:close()
    local st = pool:stats()
    assert.are.equal(3, st.spawned) -- the owed one, and s2's refill
    assert.are.equal(1, #pool.idle)
    assert.are.equal(0, st.cold)
  end)

  it("skips a pooled sandbox that died while idle, without a hang", function()
    pool = new_pool(2)
    settle(pool)
    local dead = pool.idle[1]
    local pids = dead.drv:tree()
    dead.drv:kill()
    for _ = 1, 100 do
      if not alive(pids[1]) then
        break
      end
      sleep(20)
    end
    local s = pooled(pool, "out = 'still fine'")
    local result, err = s:run()
    s:close()
    assert.is_nil(err)
    assert.are.equal("still fine", result.answer)
    assert.are.equal(1, pool:stats().dead)
  end)

  -- Issue 32: the first take after bubblewrap came back got a sandbox
  -- spawned during the outage, still alive with nothing said, and failed
  -- "exited before the driver started: exit status 127" (1 run in 3).
  it("skips a sandbox spawned while bubblewrap was missing, at the first take once it is back", function()
    local bin = H.tmpdir .. "-outagebin"
    -- 0777: on a root host the launcher runs as the sandbox's uid, and says it looked.
    os.execute("mkdir -p " .. bin .. " && chmod 777 " .. bin)
    local wrapper, down, seen = bin .. "/bwrap", bin .. "/down", bin .. "/seen"
    -- While `down` is there: bubblewrap is not found, a second after the
    -- spawn (so the take finds it alive, before any hello).
    local f = assert(io.open(wrapper, "w"))
    f:write("#!/bin/sh\nif [ -e ", down, " ]; then\n  : > ", seen, "\n  sleep 1\n",
      "  exec /nonexistent/bwrap \"$@\"\nfi\nexec ", core.find_program("bwrap"), " \"$@\"\n")
    f:close()
    os.execute("chmod 755 " .. wrapper .. " && : > " .. down)
    pool = new_pool(1, { sandbox = { bwrap = wrapper } })
    local t0 = core.now_ms()
    while not io.open(seen) do -- the outage's sandbox has looked
      assert(core.now_ms() - t0 < 10000, "the pool's sandbox never started its launcher")
      sleep(10)
    end
    os.remove(down) -- bubblewrap is back
    local result, err, ran, s = take_run(pool)
    local st = pool:stats()
    os.execute("rm -rf " .. bin)
    assert.is_nil(err and err.message)
    assert.are.equal("x", result.answer)
    assert.is_true(ran)
    assert.are.equal("cold", s.sandbox.start)
    assert.are.equal(1, st.dead)
    assert.are.equal(0, st.taken)
  end)

  it("gives a clear error, not a hang, when the sandbox dies as it is taken", function()
    pool = new_pool(1)
    settle(pool)
    local entry = pool.idle[1]
    local s = pooled(pool, "out = 'x'")
    -- Killed after the pool's check, before the session reads it.
    local take = pool._take
    pool._take = function(p)
      local e = take(p)
      local tree = e.drv:tree()
      os.execute("kill -9 " .. tree[#tree])
      sleep(200)
      return e
    end
    local result, err = s:run()
    s:close()
    assert.is_nil(result)
    assert.are.equal(entry.drv, s.sandbox.driver or entry.drv)
    assert.are.equal("driver_exited", err.kind)
  end)

  -- The checks that hold whatever session takes a sandbox run when the
  -- pool first sees its start over (rlm.boot's vet); each must still refuse
  -- the sandbox before any model code runs in it.
  it("refuses a pooled sandbox whose self-test failed, before any model code", function()
    local bin = H.tmpdir .. "-poolbin"
    os.execute("mkdir -p " .. bin)
    -- bubblewrap without its seccomp filter.
    local wrapper = bin .. "/bwrap"
    local f = assert(io.open(wrapper, "w"))
    f:write("#!/bin/sh\nskip=0\nfor a do\n  shift\n  if [ $skip -gt 0 ]; then skip=$((skip - 1)); continue; fi\n",
      "  case \"$a\" in --seccomp) skip=1; continue ;; esac\n  set -- \"$@\" \"$a\"\ndone\n",
      "exec ", core.find_program("bwrap"), " \"$@\"\n")
    f:close()
    os.execute("chmod +x " .. wrapper)
    pool = new_pool(1, { sandbox = { bwrap = wrapper } })
    settle(pool)
    assert.is_table(pool.idle[1].vetted.error) -- found by the pool, before any take
    local result, err, ran, s = take_run(pool)
    os.execute("rm -rf " .. bin)
    assert.is_nil(result)
    assert.are.equal("warm", s.sandbox.start)
    assert.are.equal("sandbox_violation", err.kind)
    assert.matches("self-test failed: seccomp", err.message, 1, true)
    assert.is_false(ran)
  end)

  it("refuses a pooled sandbox whose launcher holds a descriptor of the host's, found by the pool", function()
    local bin = H.tmpdir .. "-poolbin"
    os.execute("mkdir -p " .. bin)
    local wrapper = bin .. "/bwrap"
    local f = assert(io.open(wrapper, "w"))
    -- A launcher that holds a descriptor while bubblewrap runs below it
    -- (bubblewrap itself closes what it inherits).
    f:write("#!/bin/sh\nexec 7</etc/hostname\n", core.find_program("bwrap"), " \"$@\"\n")
    f:close()
    os.execute("chmod +x " .. wrapper)
    pool = new_pool(1, { sandbox = { bwrap = wrapper } })
    settle(pool)
    local entry = pool.idle[1]
    local launcher = entry.drv:tree()[1]
    -- Found by the pool, in bubblewrap's own process, before any take.
    local vetted = entry.vetted
    os.execute("rm -rf " .. bin)
    assert.is_table(vetted.error)
    assert.are.equal("sandbox_violation", vetted.error[1])
    assert.matches("^descriptors reach the sandbox: ", vetted.error[2])
    assert.matches("pid " .. launcher .. " fd 7: /etc/hostname", vetted.error[2], 1, true)
    local result, err, ran = take_run(pool)
    assert.is_nil(result)
    assert.are.equal("sandbox_violation", err.kind)
    assert.is_false(ran)
  end)

  it("refuses a pooled sandbox whose processes changed since the pool checked them", function()
    pool = new_pool(1)
    settle(pool)
    local vetted = pool.idle[1].vetted
    assert.is_table(vetted.tree)
    -- As if a process of the sandbox had gone and another come since the
    -- pool read its uids and moved it into its cgroup.
    vetted.tree[#vetted.tree] = vetted.tree[#vetted.tree] + 100000
    local result, err, ran = take_run(pool)
    assert.is_nil(result)
    assert.are.equal("sandbox_violation", err.kind)
    assert.matches("changed since the pool checked them", err.message, 1, true)
    assert.is_false(ran)
  end)

  it("vets a pooled sandbox's uids and cgroup before it is handed out", function()
    pool = new_pool(1)
    settle(pool)
    local entry = pool.idle[1]
    local lines = {}
    for i, ev in ipairs(entry.events) do
      lines[i] = ev[2]
    end
    local start = require("rlm.sandbox.start")
    local bwrap = require("rlm.sandbox.bwrap")
    -- The real driver, seen through a stand-in that lies about one thing.
    local function seen(overrides)
      return setmetatable({}, { __index = function(_, k)
        if overrides[k] ~= nil then
          return function()
            return overrides[k]
          end
        end
        return function(_, ...)
          return entry.drv[k](entry.drv, ...)
        end
      end })
    end
    local v = start.vet(bwrap, seen({}), lines, pool.max_values)
    assert.is_table(v.tree)
    v = start.vet(bwrap, seen({ uid = entry.drv:uid() + 1 }), lines, pool.max_values)
    assert.are.equal("sandbox_violation", v.error[1])
    assert.matches("wrong uid", v.error[2], 1, true)
    v = start.vet(bwrap, seen({ adopt = false }), lines, pool.max_values)
    assert.are.equal("sandbox_violation", v.error[1])
    assert.matches("memory cgroup", v.error[2], 1, true)
    -- A hello of another protocol.
    local other = { (lines[1]:gsub('"protocol":%s*%d+', '"protocol": 999')), lines[2], lines[3] }
    v = start.vet(bwrap, seen({}), other, pool.max_values)
    assert.are.equal("protocol_error", v.error[1])
  end)

  it("close() kills the idle sandboxes and removes their canaries; a second close is fine", function()
    pool = new_pool(2)
    -- Before their self-test has run (after it, the pool removes them at
    -- its next look): the canaries are on disk.
    local files = {}
    for _, e in ipairs(pool.idle) do
      local info = e.canaries:info()
      files[#files + 1] = info.unix_path
      files[#files + 1] = info.home_file ~= "" and info.home_file or nil
    end
    assert.is_true(#files >= 2)
    for _, f in ipairs(files) do
      assert.are.equal("yes", H.sh("test -e '" .. f .. "' && echo yes || echo no"), f)
    end
    pool:close()
    pool:close()
    for _, f in ipairs(files) do
      assert.are.equal("no", H.sh("test -e '" .. f .. "' && echo yes || echo no"), f)
    end
    -- Idle sandboxes that have started and self-tested.
    pool = new_pool(2)
    local pids = {}
    for _ = 1, 500 do
      pool:stats() -- the loop learns the spawns are over
      pids = pool_pids(pool)
      if #pids >= 6 then
        break
      end
      sleep(10)
    end
    assert.is_true(#pids >= 2)
    pool:close()
    assert.are.same({}, H.settled_children())
    -- A launcher the keeper had to kill itself takes its namespace's
    -- processes down after it (--die-with-parent): moments later.
    assert_gone(pids)
    -- A session given a closed pool starts cold.
    local s = pooled(pool, "out = 'cold'")
    assert.are.equal("cold", (assert(s:run())).answer)
    assert.are.equal("cold", s.sandbox.start)
    s:close()
  end)

  it("leaves no sandbox when the host is killed (SIGKILL) with a pool of 4", function()
    local script = H.tmpdir .. "/host.lua"
    local f = assert(io.open(script, "w"))
    f:write(([[
local rlm = require("rlm")
local pool = assert(rlm.Pool.new({ size = 4, sandbox = { tmpdir = %q } }))
local core = require("rlm.core")
while pool:stats().ready < 4 do
  local ws = core.waitset(); ws:wait(10); ws:close()
end
local pids = {}
for _, e in ipairs(pool.idle) do
  for _, p in ipairs(e.drv:tree()) do pids[#pids + 1] = p end
end
local files = {}
for _, e in ipairs(pool.idle) do
  local info = e.canaries:info()
  files[#files + 1] = info.home_file
  files[#files + 1] = info.unix_path
end
io.stdout:write(table.concat(files, " "), "\n")
io.stdout:write(table.concat(pids, " "), "\n")
io.stdout:flush()
while true do local ws = core.waitset(); ws:wait(1000); ws:close() end
]]):format(H.tmpdir))
    f:close()
    local lua = H.lua_name()
    local out = H.tmpdir .. "/host.out"
    local pid = tonumber(H.sh(("%s %s > %s 2>&1 & echo $!"):format(lua, script, out)))
    local pids
    for _ = 1, 600 do
      pids = H.read_file(out)
      if select(2, pids:gsub("\n", "")) >= 2 then
        break
      end
      sleep(50)
    end
    -- The host's canaries, removed below: a host killed before their
    -- removal leaves them (rlm.pool removes them once the self-test has
    -- run).
    local files
    files, pids = pids:match("^([^\n]*)\n(.*)$")
    local list = {}
    for p in pids:gmatch("%d+") do
      list[#list + 1] = tonumber(p)
    end
    assert.is_true(#list >= 4, pids)
    for _, p in ipairs(list) do
      assert.is_true(alive(p))
    end
    os.execute("kill -9 " .. pid)
    local left
    for _ = 1, 250 do
      left = {}
      for _, p in ipairs(list) do
        if alive(p) and H.sh("cat /proc/" .. p .. "/stat 2>/dev/null | cut -d' ' -f3") ~= "Z" then
          left[#left + 1] = p
        end
      end
      if #left == 0 then
        break
      end
      sleep(20)
    end
    os.remove(script)
    os.remove(out)
    for path in files:gmatch("%S+") do
      os.remove(path)
    end
    assert.are.same({}, left)
  end)

  it("raises on misuse, naming the option", function()
    assert.has_error(function()
      rlm.Pool.new({ size = 0 })
    end, "rlm.Pool.new: option 'size' must be an integer from 1 to 64, got 0")
    assert.error_matches(function()
      rlm.Pool.new({ size = 1, guardrails = "yes" })
    end, "option 'guardrails' must be a boolean")
    assert.error_matches(function()
      rlm.Pool.new({ size = 1, max_iterations = 3 })
    end, "unknown option 'max_iterations'")
    pool = new_pool(1, { sandbox = { max_message_bytes = 2 ^ 20 } })
    assert.error_matches(function()
      rlm.Session.new(H.opts({ pool = pool, guardrails = false }))
    end, "option 'guardrails' differs from the pool's")
    assert.error_matches(function()
      rlm.Session.new(H.opts({ pool = pool, sandbox = { allowed_modules = { "zlib" } } }))
    end, "option 'sandbox.allowed_modules' differs from the pool's")
    -- The joint check holds with the pool's max_message_bytes.
    assert.error_matches(function()
      rlm.Session.new(H.opts({ pool = pool, stdout_truncate_chars = 2 ^ 20 }))
    end, "option 'sandbox.max_message_bytes'")
    assert.error_matches(function()
      rlm.Session.new(H.opts({ pool = {} }))
    end, "option 'pool' must be an rlm.Pool")
    -- The same value is fine.
    local s = rlm.Session.new(H.opts({ pool = pool, sandbox = { max_message_bytes = 2 ^ 20, tmpdir = H.tmpdir }, }))
    s:close()
  end)

  it("serves nested rlm_query from the parent's pool", function()
    pool = new_pool(3)
    settle(pool)
    local root = H.script({ fence("out = '|'.join(rlm_query_batched(['a', 'b']))"), fence("FINAL(out)") })
    local s = rlm.Session.new(H.opts({
      pool = pool, max_depth = 2,
      root_llm = function(messages)
        local q = messages[2].content:match("^Question: (.-)\n\nStart by looking")
        if q then
          return fence("FINAL(context.upper())")
        end
        return root(messages)
      end,
    }))
    local result, err = s:run()
    s:close()
    assert.is_nil(err)
    assert.are.equal("A|B", result.answer)
    local st = pool:stats()
    assert.are.equal(3, st.taken) -- the root and its two children
    assert.are.equal(0, st.cold)
  end)

  it("works from a coroutine host whose callbacks yield", function()
    pool = new_pool(1)
    local s = rlm.Session.new(H.opts({ pool = pool, context = "co",
      root_llm = function(messages)
        local answer = #messages == 2 and fence("out = context * 2") or fence("FINAL(out)")
        return coroutine.yield({ resume_with = answer })
      end }))
    local co = coroutine.create(function()
      return s:run()
    end)
    local ok, v = coroutine.resume(co)
    while coroutine.status(co) ~= "dead" do
      assert.is_true(ok, tostring(v))
      ok, v = coroutine.resume(co, v.resume_with)
    end
    s:close()
    assert.is_true(ok, tostring(v))
    assert.are.equal("coco", v.answer)
    assert.are.equal("warm", s.sandbox.start)
  end)
end)

H.describe_luv("rlm.Pool under the luv adapter", function()
  local pool
  after_each(function()
    pool:close()
    H.assert_clean()
  end)

  it("runs sessions from the pool side by side", function()
    pool = new_pool(2)
    local results, over = {}, 0
    for i = 1, 3 do
      luv_adapter.run(H.opts({ pool = pool, context = "ctx" .. i,
        root_llm = function(messages, done)
          L.after(10, function()
            done(#messages == 2 and fence("out = context") or fence("FINAL(out)"))
          end)
        end,
      }), function(err, result)
        results[i] = result and result.answer or err.kind
        over = over + 1
      end)
    end
    L.run_until(function()
      return over == 3
    end)
    assert.are.same({ "ctx1", "ctx2", "ctx3" }, results)
    assert.is_true(pool:stats().taken >= 2)
  end)
end)
