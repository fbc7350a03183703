-- rlm.sandbox.container_names: which of a prefix's containers belong to a
-- host that is proven gone, read from a procfs whose root the spec gives
-- (a directory it made, standing for /proc as each kind of host shows it).
-- A host is gone when its boot differs, when its pid runs with another
-- start time, or when its pid is absent from a /proc that shows every
-- process; a /proc mounted hidepid shows no other user's processes, so
-- there an absent pid proves nothing, and the container stays.
local H = require("helpers")
local names = require("rlm.sandbox.container_names")

local o = assert(names.owner())
local OTHER_PID = 999999 -- above pid_max's default: no host of this machine

-- rows: what the stub /proc shows, the name's host, whether it is gone
local cases = {
  { "a pid absent where /proc shows every process (pid 1 seen)", { "1" }, {}, true },
  { "a pid absent where /proc hides other users' processes (no pid 1: hidepid=2)", {}, {}, false },
  { "a pid absent where the mount says hidepid=2, pid 1 seen", { "1" }, { hidepid = "2" }, false },
  { "a pid absent where the mount says hidepid=invisible", { "1" }, { hidepid = "invisible" }, false },
  { "a pid absent where the mount says hidepid=0", { "1" }, { hidepid = "0" }, true },
  { "a pid that runs with another start time", { "1", OTHER_PID }, { start = "1" }, true },
  { "a pid that runs with the same start time", { "1", OTHER_PID }, {}, false },
  { "another boot's, whatever /proc shows", {}, { boot = "00000000" }, true },
}

describe("rlm.sandbox.container_names.gone", function()
  local root
  before_each(function()
    root = H.sh("mktemp -d /tmp/rlm-proc.XXXXXX"):gsub("%s+$", "")
  end)
  after_each(function()
    H.sh("rm -rf " .. root)
  end)

  local function stat_line(pid, start)
    return ("%d (sleep) S 1 1 1 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 %s 0 0\n"):format(pid, start)
  end

  for _, case in ipairs(cases) do
    it((case[4] and "removes" or "keeps") .. " the container of " .. case[1], function()
      local start = "4242"
      for _, pid in ipairs(case[2]) do
        H.sh(("mkdir -p %s/%s"):format(root, pid))
        local f = assert(io.open(("%s/%s/stat"):format(root, pid), "w"))
        f:write(stat_line(pid, pid == OTHER_PID and (case[3].start or start) or "1"))
        f:close()
      end
      if case[3].hidepid then
        H.sh("mkdir -p " .. root .. "/self")
        local f = assert(io.open(root .. "/self/mountinfo", "w"))
        f:write(("22 1 0:21 / %s rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw,hidepid=%s\n"):format(root,
          case[3].hidepid))
        f:close()
      end
      local name = ("rlm-%s-%d-%s-abcdef-1"):format(case[3].boot or o.boot, OTHER_PID, start)
      local gone = names.gone("rlm", { name, "rlm-other", "unrelated" }, root)
      assert.same(case[4] and { name } or {}, gone)
    end)
  end

  it("reads /proc by default: this host runs, so its own containers stay", function()
    local me = ("rlm-%s-%s-%s-%s-1"):format(o.boot, o.pid, o.start, o.token)
    assert.same({}, names.gone("rlm", { me }))
  end)
end)

-- The same on a real procfs mounted hidepid=2, in a mount namespace of its
-- own (unshare -m as root; a user's, in user and pid namespaces of its own:
-- unshare -Urmpf).
describe("rlm.sandbox.container_names.gone over a procfs mounted hidepid=2", function()
  it("keeps the container of a pid it cannot see", function()
    local unshare = H.sh("id -u") == "0" and "unshare -m" or "unshare -Urmpf"
    if not H.sh(unshare .. " true 2>&1 && echo ok"):match("ok$") then
      return pending(("%s (namespaces of its own, to mount a procfs) is refused here"):format(unshare))
    end
    local dir = H.sh("mktemp -d /tmp/rlm-proc.XXXXXX"):gsub("%s+$", "")
    local script = dir .. ".lua"
    finally(function() -- (one finally a test: busted keeps the last)
      os.remove(script)
      H.sh("rmdir " .. dir)
    end)
    local me = assert(names.owner())
    local code = ([[package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local names = require("rlm.sandbox.container_names")
local o = names.owner()
local name = ("rlm-%%s-%d-1-abcdef-1"):format(o.boot)
io.write(#names.gone("rlm", { name }, %q), " ", #names.gone("rlm", { name }, "/proc"))]]):format(OTHER_PID, dir)
    local f = assert(io.open(script, "w"))
    f:write(code)
    f:close()
    local out = H.sh(("%s sh -c 'mount -t proc -o hidepid=2 proc %s && %s %s' 2>&1"):format(unshare, dir,
      H.lua_name(), script))
    assert.equals("0 1", out, me.boot)
  end)
end)
