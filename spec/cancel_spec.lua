-- Cancel and misuse: close() from anywhere ends the run with `cancelled`;
-- one driver at a time; the adapters' callback contracts.
local H = require("helpers")
local fence = H.fence

local L = require("helpers.luv")
local luv_adapter = L and require("rlm.adapters.luv")

local SLEEPY = fence("import time\ntime.sleep(30)")

describe("close() during run()", function()
  after_each(H.assert_clean)

  -- The canaries are planted before the spawn and removed when the start is
  -- over; a close() during the start must remove them too, at once: the
  -- engine that would is never resumed, and a collection may be far off
  -- (Neovim's <C-c> case waited seconds for one).
  it("removes the start's canaries at once when it is closed while its sandbox starts", function()
    -- Its own canaries, by name: other hosts may plant theirs meanwhile.
    local function present(path)
      return H.sh("test -e '" .. path .. "' && echo yes || true"):match("yes") ~= nil
    end
    local s = H.session({ root_llm = function() return fence("FINAL('x')") end })
    -- The spawn: the engine now waits for the hello, the root model's
    -- first call out meanwhile (docs/api.md).
    assert.are.equal("root_llm", s:poll().type)
    assert.is_truthy(s.sandbox.canaries, "the start planted no canaries")
    local info = s.sandbox.canaries:info()
    local planted = { info.home_file, info.unix_path }
    assert.are.equal(2, #planted)
    assert.matches("%.sock$", planted[2])
    for _, path in ipairs(planted) do
      assert.is_true(present(path), path)
    end
    s:close()
    for _, path in ipairs(planted) do
      assert.is_false(present(path), path)
    end
    assert.are.equal("cancelled", s:poll().err.kind)
  end)

  it("from inside root_llm ends the run with cancelled", function()
    local s
    s = H.session({
      root_llm = function()
        s:close()
        return fence("FINAL('x')")
      end,
    })
    local result, err = s:run()
    assert.is_nil(result)
    assert.are.equal("cancelled", err.kind)
  end)

  it("from inside llm_query ends the run with cancelled", function()
    local s
    s = H.session({
      root_llm = H.script({ fence("print(llm_query('a'))") }),
      llm_query = function()
        s:close()
        return "late"
      end,
    })
    local _, err = s:run()
    assert.are.equal("cancelled", err.kind)
  end)

  it("from on_event ends the run with cancelled", function()
    local s
    s = H.session({
      root_llm = H.script({ fence("FINAL('x')") }),
      on_event = function(ev)
        if ev.type == "step_start" then
          s:close()
        end
      end,
    })
    local _, err = s:run()
    assert.are.equal("cancelled", err.kind)
  end)

  it("from another coroutine while run() waits in a callback", function()
    local s = H.session({
      root_llm = function()
        coroutine.yield("waiting")
        return SLEEPY
      end,
    })
    local co = coroutine.create(function()
      return s:run()
    end)
    assert.are.same({ true, "waiting" }, { coroutine.resume(co) })
    -- A second run() meanwhile is misuse, and leaves the first alone.
    local other = coroutine.create(function()
      return s:run()
    end)
    local ok, msg = coroutine.resume(other)
    assert.is_false(ok)
    assert.matches("already being driven by run%(%)", msg)
    s:close()
    local _, result, err = coroutine.resume(co)
    assert.is_nil(result)
    assert.are.equal("cancelled", err.kind)
  end)

  it("gives callback_error, not a bare Lua error, when root_llm yields outside a coroutine", function()
    local s = H.session({
      root_llm = function()
        coroutine.yield()
      end,
    })
    local _, err = s:run()
    s:close()
    assert.are.equal("callback_error", err.kind)
    assert.matches("yielded", err.message)
  end)
end)

H.describe_luv("the luv adapter's contracts", function()
  after_each(H.assert_clean)

  it("raises at once without a callback", function()
    assert.has_error(function()
      luv_adapter.run(H.opts({}))
    end, "rlm.adapters.luv.run: argument 2 must be a function(err, result), got nil")
  end)

  it("never calls back before run() returns, even when the sandbox cannot start", function()
    local returned, err = false, nil
    local called_early
    luv_adapter.run(H.opts({ sandbox = { bwrap = "no-such-bwrap" } }), function(e)
      called_early = not returned
      err = e
    end)
    returned = true
    L.run_until(function()
      return err ~= nil
    end)
    assert.is_false(called_early)
    assert.are.equal("sandbox_unavailable", err.kind)
  end)

  it("refuses to drive one session twice, and leaks no handle", function()
    local s = H.session({ root_llm = H.script({ fence("FINAL('once')") }) })
    local result
    luv_adapter.drive(s, function(_, r)
      result = r
    end)
    assert.has_error(function()
      luv_adapter.drive(s, function() end)
    end)
    L.run_until(function()
      return result ~= nil
    end)
    s:close()
    assert.are.equal("once", result.answer)
  end)

  it("gives a structured err when on_event yields", function()
    local err
    luv_adapter.run(H.opts({
      root_llm = H.script({ fence("FINAL('x')") }),
      on_event = function()
        coroutine.yield()
      end,
    }), function(e)
      err = e
    end)
    L.run_until(function()
      return err ~= nil
    end)
    assert.are.equal("callback_error", err.kind)
  end)

  it("lets an error raised in the final callback reach the loop (luv's handler)", function()
    -- luv reports an uncaught callback error through its own handler, which
    -- prints it and exits: so in a process of its own.
    local lua = rawget(_G, "jit") and "luajit" or ("lua" .. _VERSION:match("%d+%.%d+"))
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
local H = require("helpers")
require("rlm.adapters.luv").run(H.opts({ root_llm = H.script({ H.fence("FINAL('x')") }) }), function()
  error("from the user's callback")
end)
require("luv").run()
print("uv.run returned normally")
]])
    f:close()
    local out = H.sh(lua .. " " .. script .. " 2>&1; echo rc=$?")
    os.remove(script)
    assert.matches("from the user's callback", out)
    assert.is_nil(out:find("returned normally", 1, true))
    assert.is_nil(out:find("rc=0", 1, true))
  end)
end)

-- Ctrl-C under run() in the standalone interpreter (docs/api.md, "SIGINT"):
-- a real interpreter of its own, SIGINT while the REPL's code sleeps.
describe("SIGINT under run()", function()
  after_each(H.assert_clean)

  local lua = os.getenv("RLM_SPEC_LUA") or (rawget(_G, "jit") and "luajit" or ("lua" .. _VERSION:match("%d+%.%d+")))
  local root = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/[^/]*$") or "."

  -- The child: a session whose code sleeps 30 s. It says "started" on
  -- stderr once the code runs, catches what run() raises, and reports:
  -- the error, whether SIGINT still has a handler (lua.c's resets it to
  -- SIG_DFL, which must stay), how long its sandbox took to go once run()
  -- had raised (before any close()), and what step() gives then.
  local CHILD = [[
local H = require("helpers")
local function sigint_caught()
  local f = assert(io.open("/proc/self/status"))
  local mask = f:read("*a"):match("SigCgt:%s*(%x+)")
  f:close()
  return tonumber(mask:sub(-1), 16) % 4 >= 2 -- bit 1: SIGINT (2)
end
local function sandbox_left()
  local out = H.sh("for t in /proc/" .. H.pid() .. "/task/*; do cat $t/children; done; echo")
  for pid in out:gmatch("%d+") do
    local stat = H.sh("cat /proc/" .. pid .. "/stat 2>/dev/null")
    if stat ~= "" and not stat:match("%) Z ") and not stat:match("%(sh%)") and not stat:match("%(cat%)") then
      return true
    end
  end
  return false
end
-- With "callback", the SIGINT comes while root_llm blocks in C for 1 s.
local in_callback = arg[1] == "callback"
local sleepy = H.fence("import time\ntime.sleep(30)")
local s = H.session({ step_timeout_ms = 60000,
  root_llm = function()
    if in_callback then
      io.stderr:write("caught before: ", tostring(sigint_caught()), "\nstarted\n")
      local p = io.popen("sleep 1")
      p:read("*a")
      p:close()
    end
    return sleepy
  end,
  on_event = function(ev)
    if ev.type == "root_response" and not in_callback then
      io.stderr:write("caught before: ", tostring(sigint_caught()), "\nstarted\n")
    end
  end })
local ok, e = pcall(s.run, s)
print("raised: " .. tostring(not ok) .. " " .. tostring(e))
print("sigint caught after: " .. tostring(sigint_caught()))
local core = require("rlm.core")
local t0 = core.now_ms()
while sandbox_left() and core.now_ms() - t0 < 500 do
  core.waitset():wait(10)
end
print("sandbox gone: " .. tostring(not sandbox_left()))
local r, err = s:step()
print("step: " .. tostring(r) .. " " .. tostring(err and err.kind) .. " " .. tostring(err and err.message))
]]

  local function interrupted(how)
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(CHILD)
    f:close()
    local out = H.sh("python3 " .. root .. "/spec/helpers/sigint.py started " .. lua .. " " .. script .. " " .. how)
    os.remove(script)
    return require("cjson").decode(out)
  end

  it("ends the wait at once: the session is closed and the interpreter's 'interrupted!' is raised", function()
    local r = interrupted("wait")
    assert.is_true(r.started, r.stderr)
    assert.matches("caught before: true", r.stderr) -- lua.c's handler is there
    -- The REPL sleeps 30 s: 5 s tells "at once" from waiting it out at any load.
    assert.is_true(r.exit_ms < 5000, ("%.0f ms from SIGINT to the exit; %s"):format(r.exit_ms, r.stdout))
    assert.matches("raised: true [^\n]*interrupted!\n", r.stdout)
    assert.matches("sigint caught after: false", r.stdout) -- lua.c's SIG_DFL, not our handler back
    assert.matches("sandbox gone: true", r.stdout)
    assert.matches("step: nil cancelled interrupted %(SIGINT%)", r.stdout)
    assert.are.equal(0, r.status, r.stderr)
    assert.is_true(r.sandbox > 0)
    assert.are.same({}, r.left)
  end)

  -- PUC Lua: the interpreter's hook is on the main thread, and the callback
  -- runs in a coroutine, so it returns, and the wait that follows sees the
  -- hook that came meanwhile. LuaJIT's hook is the state's: the callback
  -- raises it, and the SIGINT that lua.c's handler left at SIG_DFL says so.
  it("during a model callback that blocks in C, ends the run once it returns", function()
    local r = interrupted("callback")
    assert.is_true(r.started, r.stderr)
    assert.is_true(r.exit_ms < 6000, ("%.0f ms from SIGINT to the exit; %s"):format(r.exit_ms, r.stdout))
    assert.matches("raised: true [^\n]*interrupted!\n", r.stdout)
    assert.matches("step: nil cancelled interrupted %(SIGINT%)", r.stdout)
    assert.matches("sandbox gone: true", r.stdout)
    assert.are.same({}, r.left)
  end)
end)
