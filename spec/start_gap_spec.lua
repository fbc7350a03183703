-- Start and close do not hold the host's thread: 50 sessions started from
-- one luv callback (the luv adapter drives each to a FINAL), with the
-- spawn, the uid, the context's memfd and the cgroup on rlm.core's keeper
-- threads, and every close() handing the kill and the reaping to them.
-- What is bounded is the host thread's own CPU time (its schedstat), which
-- a loaded machine does not inflate: the starting callback within 250 ms
-- (about 450 ms when the spawn ran on the host's thread, where its forks
-- made the host's pages copy-on-write), nine closes in ten within 5 ms, and within
-- 5 ms of wall clock at the median (it waited for the reaping). The loop's
-- longest wall-clock gap is printed beside it: on a quiet machine it is the
-- same order; on a shared one it is mostly time spent waiting for a CPU.
local H = require("helpers")
local L = require("helpers.luv")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "spec"
package.path = here .. "/../?.lua;" .. package.path

local function cpu_ms()
  local f = io.open("/proc/thread-self/schedstat")
  if not f then
    return nil
  end
  local ns = f:read("*a"):match("^(%d+)")
  f:close()
  return tonumber(ns) / 1e6
end

H.describe_luv("50 sessions started from one luv callback", function()
  after_each(H.assert_clean)

  it("cost the host's thread little CPU to start and to close, and all finish", function()
    if not cpu_ms() then
      return pending("no /proc/thread-self/schedstat")
    end
    local uv, core = L.uv, require("rlm.core")
    local rlm, adapter = require("rlm"), require("rlm.adapters.luv")
    local function opts()
      return { context = "", sandbox = { tmpdir = H.tmpdir }, step_timeout_ms = 120000,
        root_llm = function()
          return "```repl\nFINAL('ok')\n```"
        end,
        llm_query = function(p)
          return p
        end }
    end
    -- The interpreter probe runs once per Lua state: not counted.
    local first = rlm.Session.new(opts())
    assert(first:run())
    first:close()

    local n, left, start_cpu, closes, walls, errors = 50, 50, nil, {}, {}, {}
    local last, worst = core.now_ms(), 0
    local meter = uv.new_timer()
    meter:start(1, 1, function()
      local now = core.now_ms()
      worst = math.max(worst, now - last - 1)
      last = now
    end)
    L.after(5, function()
      local c0 = cpu_ms()
      for _ = 1, n do
        local s = rlm.Session.new(opts())
        adapter.drive(s, function(err)
          local t0, w0 = cpu_ms(), core.now_ms()
          s:close()
          closes[#closes + 1] = cpu_ms() - t0
          walls[#walls + 1] = core.now_ms() - w0
          errors[#errors + 1] = err and tostring(err.message or err) or nil
          left = left - 1
        end, uv)
      end
      start_cpu = cpu_ms() - c0
    end)
    L.run_until(function()
      return left == 0
    end, 240000)
    meter:stop()
    meter:close()
    uv.run("nowait")
    table.sort(closes)
    table.sort(walls)
    local wall = walls[math.ceil(#walls / 2)]
    print(("\n# %s: 50 starts: %.0f ms of the host thread's CPU; close() median %.2f ms, max %.2f; "
      .. "its wall-clock median %.2f ms; the loop's longest gap %.0f ms (wall clock)"):format(H.lua_name(), start_cpu,
      closes[math.ceil(#closes / 2)], closes[#closes], wall, worst))
    assert.are.same({}, errors)
    -- AddressSanitizer's build (make check) costs about twice the CPU.
    local bound = (os.getenv("LD_PRELOAD") or ""):match("asan") and 500 or 250
    assert.is_true(start_cpu < bound, ("starting 50 sessions took %.0f ms of CPU"):format(start_cpu))
    -- One close in fifty may be preempted mid-call on a shared machine (its
    -- schedstat then counts a cache refill): the bound is on the 45th.
    local p90 = closes[math.ceil(#closes * 0.9)]
    assert.is_true(p90 < 5, ("one close() in ten took %.2f ms of CPU or more"):format(p90))
    -- It does not wait for the sandbox (it did: 5-25 ms each).
    assert.is_true(wall < 5, ("close() took %.2f ms (median)"):format(wall))
  end)
end)

describe("a host that exits right after close()", function()
  after_each(H.assert_clean)

  -- One host that starts a session, runs a step, closes it and exits at
  -- once: what is left of its sandbox's processes right after.
  local function exit_after_close()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
local rlm = require("rlm")
local s = rlm.Session.new({ context = "x", sandbox = { tmpdir = ]], ("%q"):format(H.tmpdir), [[ },
  root_llm = function() return "```repl\nprint(1)\n```" end,
  llm_query = function(p) return p end })
assert(s:step())
io.stdout:write(table.concat(s.sandbox.driver:tree(), " "), "\n")
io.stdout:flush()
s:close()
os.exit(0, true)
]])
    f:close()
    local lua = os.getenv("RLM_SPEC_LUA") or "lua5.4"
    local p = assert(io.popen(lua .. " " .. script))
    local out = p:read("*a")
    p:close()
    os.remove(script)
    local pids = {}
    for pid in out:gmatch("%d+") do
      pids[#pids + 1] = pid
    end
    assert.is_true(#pids >= 2, "the sandbox's processes: " .. out)
    local left = {}
    for _, pid in ipairs(pids) do
      local st = io.open("/proc/" .. pid .. "/stat")
      if st then
        left[#left + 1] = pid .. ": " .. st:read("*a")
        st:close()
      end
    end
    return left, out
  end

  -- The driver leaves at the end of its input, and bubblewrap's init on
  -- its own right after it: a launcher that exits before it has reaped the
  -- init leaves it a zombie of init's. Under load that was 1 run in 2 (issue
  -- 32); four runs here, each one host.
  it("leaves no sandbox process, not even a zombie for init to reap", function()
    for _ = 1, 4 do
      local left, out = exit_after_close()
      assert.are.same({}, left, out)
    end
  end)
end)
