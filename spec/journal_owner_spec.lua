-- rlm.journal.owner (docs/durability.md, "The lease"): an owner named so
-- that a later process of this machine can tell it is gone, and the
-- release of a gone owner's lease, which the CLI's --resume, the OpenResty
-- example's and the Neovim plugin's resume do before Session.resume.
local journal = require("rlm.journal")
local owner = require("rlm.journal.owner")
local H = require("helpers")

local function first_line(path)
  local f = assert(io.open(path, "rb"))
  local line = f:read("*l")
  f:close()
  return line
end

-- This process's owner fields, as /proc tells them.
local function me()
  return assert(owner.parse(owner.name("rlm")))
end

-- The pid of a process that has ended (and was reaped).
local function dead_pid()
  return H.sh("sh -c 'echo $$'")
end

-- A process that stays a zombie: the child of a python that does not wait
-- for it until told (SIGTERM). Returns its pid, and a function that ends
-- its parent, which reaps it first, and waits for that parent.
local function zombie()
  local p = assert(io.popen("exec python3 -c 'import os, signal\n"
    .. "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])\n"
    .. "kid = os.fork()\nif kid == 0: os._exit(0)\n"
    .. "print(kid, os.getpid(), flush=True)\nsignal.sigwait([signal.SIGTERM])\nos.waitpid(kid, 0)'"))
  local child, parent = assert(p:read("*l")):match("^(%d+) (%d+)$")
  local deadline = os.time() + 10
  while (first_line("/proc/" .. child .. "/stat"):match("%) (%a)")) ~= "Z" and os.time() < deadline do
    os.execute("sleep 0.05")
  end
  return child, function()
    os.execute("kill -TERM " .. parent)
    p:close()
  end
end

local function named(fields)
  local m = me()
  for k, v in pairs(fields) do
    m[k] = v
  end
  return ("%s pid %s on %s (boot %s, start %s)"):format(m.label, m.pid, m.host, m.boot, m.start)
end

-- name = the lease holder's name (a function: made as the case runs),
-- released = whether release_if_gone lets it go.
local CASES = {
  { "a dead process of this machine", function()
    return named({ pid = dead_pid() })
  end, true },
  { "this live process", function()
    return owner.name("rlm")
  end, false },
  { "a live process with a tag", function()
    return owner.name("nginx", "0123abcd")
  end, false },
  { "its pid used again by another process (another start time)", function()
    return named({ start = tostring(tonumber(me().start) + 1) })
  end, true },
  { "a dead pid of another boot", function()
    return named({ pid = dead_pid(), boot = me().boot == "00000000" and "11111111" or "00000000" })
  end, false },
  { "a dead pid of another host", function()
    return named({ pid = dead_pid(), host = me().host .. "-elsewhere" })
  end, false },
  { "a name of another form", function()
    return "nginx-host-123-abc"
  end, false },
  { "a name with no start time", function()
    return ("rlm pid %s on %s (boot %s)"):format(dead_pid(), me().host, me().boot)
  end, false },
  { "a name with a pid that is no number", function()
    return named({ pid = "x" .. dead_pid() })
  end, false },
}

describe("rlm.journal.owner", function()
  local dir, store

  before_each(function()
    dir = H.scratch("rlm-owner-spec")
    store = assert(journal.file(dir))
  end)

  after_each(function()
    H.remove_scratch(dir)
    H.assert_clean()
  end)

  it("names this process: its pid, host, boot id and start time as /proc tells them, and a tag", function()
    local stat = first_line("/proc/self/stat")
    local name = owner.name("nginx", "req-1")
    local o = owner.parse(name)
    assert.are.same({ label = "nginx", pid = o.pid, host = first_line("/proc/sys/kernel/hostname"):gsub("[%c ]", "_"),
      boot = first_line("/proc/sys/kernel/random/boot_id"):sub(1, 8), start = o.start, tag = "req-1" }, o)
    assert.are.equal(stat:match("^%d+"), o.pid) -- this Lua's
    assert.is_true(#name <= 200, name)
    assert.is_nil(owner.parse(name .. "\n"))
    assert.has_error(function()
      owner.name("two words")
    end)
    assert.has_error(function()
      owner.name("rlm", "a\ttab")
    end)
  end)

  for _, case in ipairs(CASES) do
    it(("lets go of the lease of %s: %s"):format(case[1], tostring(case[3])), function()
      local holder = case[2]()
      local held = assert(journal.lease(store, "s1", holder))
      assert.are.equal(case[3], owner.gone(holder), holder)
      assert.are.equal(case[3], owner.release_if_gone(store, "s1"), holder)
      local next_owner, err = journal.lease(store, "s1", "worker-b")
      if case[3] then
        assert.are.equal(held.fence + 1, next_owner.fence) -- fence kept: the next one's is greater
        assert.are.equal("lease_lost", select(2, held:write("s1.head", "stale")).kind)
      else
        assert.is_nil(next_owner)
        assert.are.equal("lease_held", err.kind)
        assert.are.equal(holder, err.owner)
      end
    end)
  end

  it("lets go of a zombie's lease (dead, not yet waited for)", function()
    local child, done = zombie()
    local ok, err = pcall(function()
      local holder = named({ pid = child, start = first_line("/proc/" .. child .. "/stat"):match(
        "^%d+ %(.*%) " .. ("%S+ "):rep(19) .. "(%d+)") })
      assert(journal.lease(store, "s1", holder))
      assert.is_true(owner.release_if_gone(store, "s1"))
    end)
    done()
    assert(ok, err)
  end)

  it("leaves a free, an expired or a released lease alone", function()
    assert.is_false(owner.release_if_gone(store, "s1")) -- none
    local now = os.time()
    local clock = function()
      return now
    end
    local dead = named({ pid = dead_pid() })
    local held = assert(journal.lease(store, "s1", dead, { ttl = 5, clock = clock }))
    assert.is_false(owner.release_if_gone(store, "s1", function()
      return now + 5
    end)) -- its time is over: any acquirer takes it over
    assert.is_true(held:release())
    assert.is_false(owner.release_if_gone(store, "s1"))
  end)

  it("says a store's failure, and raises on a bad id", function()
    local broken = { get = function()
      return nil, "disk on fire"
    end, set = function() end, delete = function() end, set_if = function() end }
    local ok, err = owner.release_if_gone(broken, "s1")
    assert.is_nil(ok)
    assert.are.equal("journal_error", err.kind)
    assert.has_error(function()
      owner.release_if_gone(store, "no/such id")
    end)
  end)
end)
