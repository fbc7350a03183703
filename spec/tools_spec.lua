-- Host tools: Lua functions the REPL's code calls as Python functions, under
-- run(), run() in a coroutine, and the luv adapter.
local H = require("helpers")
local L = require("helpers.luv")
local rlm = require("rlm")
local fence = H.fence

local events_of = H.events_of

local function stdout_of(result)
  local out = {}
  for _, e in ipairs(result.history) do
    out[#out + 1] = e.stdout
  end
  return table.concat(out)
end

describe("host tools", function()
  after_each(H.assert_clean)

  it("serves a session whose model calls a tool in a loop of 1,000 calls", function()
    local calls, evs = 0, {}
    local result, err = H.run({
      tools = { add = { call = function(x, kw)
        calls = calls + 1
        return x + (kw and kw.y or 0)
      end, doc = "add(x, y=0): x + y" } },
      on_event = function(ev)
        evs[#evs + 1] = ev
      end,
      root_llm = H.script({ fence("s = 0\nfor i in range(1000):\n    s += add(i, y=1)\nFINAL(s)") }),
    })
    assert.is_nil(err)
    assert.are.equal(tostring(499500 + 1000), result.answer)
    assert.are.equal(1000, calls)
    local tool_events = events_of(evs, "tool_call")
    assert.are.equal(1000, #tool_events)
    assert.are.equal("add", tool_events[1000].name)
    assert.are.equal(1000, tool_events[1000].index)
    assert.are.equal(1000, tool_events[1000].result)
  end)

  it("raises a tool's error in the REPL as ToolError, which the code catches", function()
    local result, err = H.run({
      tools = { lookup = function(key)
        error("no such key: " .. key)
      end, soft = function()
        return nil, "not today"
      end },
      root_llm = H.script({ fence([[
try:
    lookup("k1")
except ToolError as e:
    print("caught:", e)
try:
    soft()
except RuntimeError as e:
    print("caught:", type(e).__name__, e)
FINAL("ok")]]) }),
    })
    assert.is_nil(err)
    assert.are.equal("ok", result.answer)
    local out = stdout_of(result)
    assert.matches("caught: lookup: no such key: k1", out, 1, true)
    assert.matches("caught: ToolError soft: not today", out, 1, true)
    assert.not_matches("tools_spec.lua", out, 1, true) -- no host path
  end)

  it("passes arguments and results as JSON values", function()
    local seen
    local result, err = H.run({
      tools = { echo = function(...)
        seen = { n = select("#", ...), ... }
        return { list = { 1, 2.5, "x", true, rlm.null }, big = 2 ^ 40, none = rlm.null, args = seen[3] }
      end },
      root_llm = H.script({ fence([[
r = echo([1, {"a": None}], "s", flag=False, n=-3)
print(sorted(r), r["list"], r["big"], r["none"], r["args"]["flag"], r["args"]["n"])
FINAL_VAR("r")]]) }),
    })
    assert.is_nil(err)
    assert.are.equal(3, seen.n) -- two positional arguments, then the keywords' table
    assert.are.equal(1, seen[1][1])
    assert.are.equal(rlm.null, seen[1][2].a)
    assert.are.equal("s", seen[2])
    assert.is_false(seen[3].flag)
    assert.are.equal(-3, seen[3].n)
    assert.matches("['args', 'big', 'list', 'none'] [1, 2.5, 'x', True, None] 1099511627776 None False -3",
      stdout_of(result), 1, true)
    assert.are.same({ 1, 2.5, "x", true, rlm.null }, result.value.list)
  end)

  local bad_results = {
    -- what the tool returns, what the code sees
    { "a function", function() return print end, "JSON cannot carry" },
    { "nothing", function() end, "returned nothing" },
    { "a sparse table", function() return { [1] = 1, [100] = 5 } end, "JSON cannot carry" },
  }
  for _, c in ipairs(bad_results) do
    it("gives the code a ToolError for a tool that returns " .. c[1], function()
      local result, err = H.run({
        tools = { t = c[2] },
        root_llm = H.script({ fence("try:\n    t()\nexcept ToolError as e:\n    print(e)\nFINAL('ok')") }),
      })
      assert.is_nil(err)
      assert.matches(c[3], stdout_of(result), 1, true)
    end)
  end

  it("refuses results longer than max_message_bytes", function()
    local result, err = H.run({
      sandbox = { max_message_bytes = 40000 },
      tools = { big = function() return ("x"):rep(50000) end },
      root_llm = H.script({ fence("try:\n    big()\nexcept ToolError as e:\n    print(e)\nFINAL('ok')") }),
    })
    assert.is_nil(err)
    assert.matches("more than sandbox.max_message_bytes", stdout_of(result), 1, true)
  end)

  it("gives a TypeError for arguments JSON cannot carry, without calling the tool", function()
    local called = false
    local result, err = H.run({
      tools = { t = function() called = true return 1 end },
      root_llm = H.script({ fence("try:\n    t(object())\nexcept TypeError as e:\n    print('TypeError', e)\n"
        .. "FINAL('ok')") }),
    })
    assert.is_nil(err)
    assert.matches("TypeError the arguments of t() must be JSON values", stdout_of(result), 1, true)
    assert.is_false(called)
  end)

  it("stops calling tools past max_tool_calls: the code gets a ToolError", function()
    local calls = 0
    local result, err = H.run({
      max_tool_calls = 3,
      tools = { t = function() calls = calls + 1 return calls end },
      root_llm = H.script({ fence([[
got = []
for i in range(5):
    try:
        got.append(t())
    except ToolError as e:
        got.append(str(e))
print(got)
FINAL("ok")]]) }),
    })
    assert.is_nil(err)
    assert.are.equal(3, calls)
    assert.matches('[1, 2, 3, "t: not called: the run\'s max_tool_calls (3) are spent", "t: not called',
      stdout_of(result), 1, true)
  end)

  it("counts tool time toward max_wall_ms", function()
    local result, err = H.run({
      max_wall_ms = 300,
      fallback = false,
      tools = { slow = function()
        H.sh("sleep 0.05")
        return 1
      end },
      root_llm = H.script({ fence("for i in range(100):\n    slow()\nFINAL('never')") }),
    })
    assert.is_nil(result)
    assert.are.equal("cost_budget", err.kind)
    assert.matches("max_wall_ms", err.message)
  end)

  it("lists the tools and their doc lines in the system prompt, and exposes them as functions", function()
    local root = H.script({ fence("print(lookup.__name__, lookup.__doc__)\nFINAL('ok')") })
    local result, err = H.run({
      tools = { lookup = { call = function() return 1 end, doc = "lookup(key): the value stored\nunder key" },
        zeta = function() return 2 end },
      root_llm = root,
    })
    assert.is_nil(err)
    local system = root.calls[1][1].content
    assert.matches("- `lookup(...)`: lookup(key): the value stored under key", system, 1, true)
    assert.matches("- `zeta(...)`", system, 1, true)
    assert.matches("ToolError", system, 1, true)
    assert.matches("lookup lookup(key): the value stored under key", stdout_of(result), 1, true)
  end)

  it("keeps the system prompt as it was without tools", function()
    local root = H.script({ fence("FINAL('ok')") })
    H.run({ root_llm = root })
    assert.not_matches("ToolError", root.calls[1][1].content, 1, true)
  end)

  local bad_names = {
    { "1abc", "not a Python identifier" }, { "a-b", "not a Python identifier" },
    { "_hidden", "not a Python identifier" }, { ("x"):rep(65), "not a Python identifier" },
    { "lambda", "Python keyword" }, { "print", "hide the REPL's own" },
    { "llm_query", "hide the REPL's own" }, { "context", "hide the REPL's own" },
    { "ToolError", "hide the REPL's own" }, { "FINAL", "hide the REPL's own" },
  }
  for _, c in ipairs(bad_names) do
    it("refuses the tool name " .. c[1]:sub(1, 12) .. " at Session.new", function()
      local ok, e = pcall(rlm.Session.new, H.opts({ tools = { [c[1]] = function() end } }))
      assert.is_false(ok)
      assert.matches("option 'tools'", e, 1, true)
      assert.matches(c[2], e, 1, true)
    end)
  end

  local bad_tools = {
    { "a tool that is a string", { t = "x" }, "neither a function" },
    { "a doc that is not a string", { t = { call = print, doc = 3 } }, "doc must be a string" },
    { "an unknown field", { t = { call = print, docs = "x" } }, "unknown field docs" },
    { "a list", { print }, "not a Python identifier" },
  }
  for _, c in ipairs(bad_tools) do
    it("refuses " .. c[1] .. " at Session.new", function()
      local ok, e = pcall(rlm.Session.new, H.opts({ tools = c[2] }))
      assert.is_false(ok)
      assert.matches(c[3], e, 1, true)
    end)
  end

  it("serves tools under run() in a coroutine, whose tool yields to the scheduler", function()
    local s = H.session({
      tools = { later = function(n)
        return coroutine.yield({ resume_with = n * 2 })
      end },
      root_llm = H.script({ fence("FINAL(later(21) + later(1))") }),
    })
    local co = coroutine.create(function()
      return s:run()
    end)
    local ok, v = coroutine.resume(co)
    local yields = 0
    while coroutine.status(co) ~= "dead" do
      assert.is_true(ok, tostring(v))
      yields = yields + 1
      ok, v = coroutine.resume(co, v.resume_with)
    end
    s:close()
    assert.is_true(ok, tostring(v))
    assert.are.equal("44", v.answer)
    assert.are.equal(2, yields)
  end)

  it("hands tool calls out through poll() to a host that replies itself", function()
    local s = H.session({
      tools = { t = function() error("not called: the host replies") end },
      root_llm = function() return fence("FINAL(t(1, k='v'))") end,
    })
    local seen
    local ev
    repeat
      ev = s:poll()
      if ev and ev.type == "root_llm" then
        s:reply(ev.id, fence("FINAL(t(1, k='v'))"))
      elseif ev and ev.type == "tool_call" then
        seen = ev
        s:reply(ev.id, "from the host")
      elseif not ev then
        local ms = s:timeout()
        if ms ~= 0 then
          s.engine:watched():wait(ms)
        end
      end
    until ev and (ev.type == "done" or ev.type == "error")
    s:close()
    assert.are.equal("done", ev.type)
    assert.are.equal("from the host", ev.result.answer)
    assert.are.equal("t", seen.name)
    assert.are.same({ 1, k = "v" }, seen.args)
    assert.are.equal(0, seen.depth)
  end)
end)

H.describe_luv("host tools under the luv adapter", function()
  after_each(H.assert_clean)
  local run = L.run_session

  it("takes a tool's answer later, through done()", function()
    local result, err = run({
      tools = { later = { async = true, call = function(done, key)
        L.after(20, function()
          done({ got = key })
        end)
      end }, fails_later = { async = true, call = function(done)
        L.after(5, function()
          done(nil, "the cache is down")
        end)
      end } },
      root_llm = function(_, done)
        done(fence("try:\n    fails_later()\nexcept ToolError as e:\n    print(e)\nFINAL(later('k')['got'])"))
      end,
    })
    assert.is_nil(err)
    assert.are.equal("k", result.answer)
    assert.matches("fails_later: the cache is down", result.history[1].stdout, 1, true)
  end)

  it("takes a tool's answer after it yields until a timer resumes it", function()
    local result, err = run({
      tools = { nap = function(i)
        L.sleep(10)
        return i + 1
      end },
      root_llm = function()
        return fence("FINAL(sum(nap(i) for i in range(5)))")
      end,
    })
    assert.is_nil(err)
    assert.are.equal("15", result.answer)
  end)

  it("interrupts the step at step_timeout_ms when a tool never answers, and the run goes on", function()
    local result, err = run({
      step_timeout_ms = 500,
      tools = { never = function() end },
      root_llm = H.script({ fence("x = 1\nnever()"), fence("FINAL('after')") }),
    })
    assert.is_nil(err)
    assert.are.equal("after", result.answer)
    assert.matches("KeyboardInterrupt", result.history[1].error, 1, true)
  end)
end)

-- Issue 28: tools = { add = function(a, b) return a + b end } failed with
-- "attempt to perform arithmetic on a table value".
describe("host tools' arguments", function()
  after_each(H.assert_clean)

  it("are the tool's Lua arguments, keywords one table after them only when given", function()
    local seen = {}
    local result, err = H.run({
      tools = { add = function(a, b) return a + b end,
        shape = { doc = "shape(...): what it got", call = function(...)
          seen[#seen + 1] = { n = select("#", ...), ... }
          return select("#", ...)
        end } },
      root_llm = H.script({ fence("print(add(2, 3), shape(), shape(None, 1), shape(1, k='v'))\nFINAL(add(40, 2))") }),
    })
    assert.is_nil(err)
    assert.are.equal("42", result.answer)
    assert.are.equal("5 0 2 2\n", result.history[1].stdout)
    assert.are.same({ n = 0 }, seen[1])
    assert.are.same({ n = 2, rlm.null, 1 }, seen[2])
    assert.are.same({ n = 2, 1, { k = "v" } }, seen[3])
  end)

  it("refuse an async field that is not a boolean", function()
    local ok, e = pcall(rlm.Session.new, H.opts({ tools = { t = { call = function() end, async = "yes" } } }))
    assert.is_false(ok)
    assert.matches("tool \"t\": async must be a boolean", e, 1, true)
  end)
end)

H.describe_luv("host tools' arguments under the luv adapter", function()
  local luv = require("rlm.adapters.luv")
  after_each(H.assert_clean)

  it("are the tool's Lua arguments, and an async tool gets done first", function()
    local out
    luv.run(H.opts({
      tools = { add = function(a, b) return a + b end, later = { async = true, call = function(done, a, kw)
        L.after(5, function()
          done(a * kw.times)
        end)
      end } },
      root_llm = H.script({ fence("FINAL(add(2, 3) + later(6, times=6))") }),
    }), function(err, result)
      out = { err = err, result = result }
    end)
    L.run_until(function()
      return out ~= nil
    end)
    assert.is_nil(out.err)
    assert.are.equal("41", out.result.answer)
  end)
end)
