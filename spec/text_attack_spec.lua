-- What crosses the wire between the sandbox and the host, as text and as
-- numbers and nesting: no host path or heap address reaches the sandbox or
-- the answer (issue 33), and what the code makes too deep, too big or past
-- what the host reads exactly is an error the code can catch, never the
-- end of the run (issue 32). Runs under every Lua: number decoding
-- (1e999, integers past 2^53 or 2^63) differs between 5.1/LuaJIT and 5.3+.
local H = require("helpers")
local textlib = require("rlm.base.text")
local finals = require("rlm.engine.finals")
local fence = H.fence

local load_chunk = rawget(_G, "loadstring") or load

-- A function that raises as host code at `chunk` would: Lua puts the
-- position ("chunk:line: ") in front of the message itself.
local function raiser(chunk, body)
  return assert(load_chunk(body, chunk))
end

local HEAP = "0x%x%x%x%x"

describe("host errors the sandbox sees", function()
  after_each(H.assert_clean)

  -- name, chunk name, body of the raising code, what the code must see
  local rows = {
    { "a path with spaces", "@/host dir/secret place/tool.lua", "error('boom')", "boom" },
    { "a [string] chunk", 'return error("boom")', "error('boom')", "boom" },
    { "a Windows path", "@C:\\Program Files\\app\\tool.lua", "error('boom')", "boom" },
    { "a rethrow (stacked positions)", "@/host dir/a.lua",
      "error(select(2, pcall(function() error('inner') end)))", "inner" },
    { "a cause joined mid-text", "@/host dir/b.lua",
      "error('wrapped: ' .. select(2, pcall(function() error('inner') end)))", "wrapped: inner" },
    { "a table raised", "@/host dir/c.lua", "error({})", nil },
    { "an address in the text", "@/host dir/d.lua", "error('bad ' .. tostring({}) .. ' ' .. tostring(print))", nil },
  }
  for _, row in ipairs(rows) do
    it("strips the host's positions and addresses from tool, llm_query and batch errors: " .. row[1], function()
      local f = raiser(row[2], row[3])
      local result, err = H.run({
        guardrails = false,
        tools = { bad = function() f() end },
        llm_query = function() f() end,
        root_llm = H.script({ fence([[
out = []
try:
    bad()
except ToolError as e:
    out.append(str(e))
try:
    llm_query('x')
except RuntimeError as e:
    out.append(str(e))
out.append(llm_query_batched(['x'])[0])
print('\n'.join(out))]]), fence("FINAL('done')") }),
      })
      assert.is_nil(err)
      local seen = result.history[1].stdout
      assert.is_nil(seen:find("host dir", 1, true), seen)
      assert.is_nil(seen:find("Program Files", 1, true), seen)
      assert.is_nil(seen:find("[string", 1, true), seen)
      assert.is_nil(seen:find(HEAP), seen)
      assert.is_nil(seen:find("%.lua:%d"), seen)
      local lines = {}
      for line in seen:gmatch("[^\n]+") do
        lines[#lines + 1] = line
      end
      assert.are.equal(3, #lines, seen)
      if row[4] then
        assert.are.same({ "bad: " .. row[4], "llm_query failed: " .. row[4], "Error: llm_query failed: " .. row[4] },
          lines)
      end
    end)
  end

  it("strips them from a nested session's error", function()
    local f = raiser("@/host dir/root model.lua", "error('model down')")
    local n = 0
    local result, err = H.run({
      guardrails = false,
      max_depth = 2,
      root_llm = function()
        n = n + 1
        if n == 1 then
          return fence("try:\n    rlm_query('q')\nexcept RuntimeError as e:\n    print(e)")
        elseif n == 2 then
          f() -- the nested session's root model
        end
        return fence("FINAL('done')")
      end,
    })
    assert.is_nil(err)
    assert.are.equal("rlm_query failed (callback_error): root_llm raised: model down\n",
      result.history[1].stdout)
  end)

  -- what the host holds, what the sandbox sees of it
  local lines = {
    { "/host dir/secret place/tool.lua:1: boom", "boom" },
    { '[string "return error("x")"]:12: boom', "boom" },
    { "/h d/a.lua:1: /h d/a.lua:1: inner", "inner" },
    { "...ong/path with space/x.lua:33: y", "y" },
    { "C:\\Users\\a b\\x.lua:3: y", "y" },
    { "root_llm raised: /h d/m.lua:1: model down", "root_llm raised: model down" },
    { "failed - /a/b.lua:3: boom", "failed - boom" },
    { "init.lua:3: boom", "boom" },
    { "/x.lua:7: first\nstack traceback:\n\t/x.lua:7: in main chunk", "first" },
    { "/x.lua:7: ", "(an error without a message)" },
    { "table: 0x5606d2a63570", "table" },
    { "a function: 0x556d51847630, a thread: 0x7f774b6d68b0, file (0x7fabccf2f760)", "a function, a thread, file" },
    -- prose stays as the host wrote it
    { "HTTP 500: rate limited", "HTTP 500: rate limited" },
    { "step 3:4: nothing", "step 3:4: nothing" },
    { "ratio 1:2 is bad", "ratio 1:2 is bad" },
    { "errno 0x16", "errno 0x16" },
  }
  for _, row in ipairs(lines) do
    it(("reads %q as %q"):format(row[1], row[2]), function()
      assert.are.equal(row[2], textlib.error_line(row[1]))
    end)
  end

  -- A nested session's error may be its own driver's fatal message: as
  -- long as a line, and written to be slow to read.
  it("cuts a long line to 4000 characters, in time linear in it", function()
    for _, unit in ipairs({ "a: ", "a", "cdata<", '[string "', "/a:1:", "table: ", "1" }) do
      local s = unit:rep(math.floor(16 * 2 ^ 20 / #unit))
      local t0 = os.clock()
      local line = textlib.error_line(s)
      local spent = os.clock() - t0
      assert.is_true(spent < 0.5, ("%q: %.2f s"):format(unit, spent))
      assert.is_true(#line <= 4000 + #" [cut]", unit)
    end
  end)
end)

describe("numbers a hostile driver sends", function()
  after_each(H.assert_clean)

  local function hostile(line, opts)
    local o = {
      guardrails = false,
      tools = { t = function(first) return first or "ok" end },
      root_llm = H.script({ fence("import os, time\nos.write(1, " .. line .. " + b'\\n')\ntime.sleep(5)"),
        fence("FINAL('survived')") }),
    }
    for k, v in pairs(opts or {}) do
      o[k] = v
    end
    return H.run(o)
  end
  local function exec_final(final)
    return "b'{\"type\":\"exec_result\",\"id\":1,\"stdout\":\"\",\"error\":null,\"final\":" .. final .. "}'"
  end
  local function var(fields)
    return exec_final("{\"kind\":\"var\",\"name\":\"v\",\"json\":true," .. fields .. "}")
  end

  local big = "b'9' * 401"
  local rows = {
    -- what the driver writes, a pattern of the error
    { "a value of 1e999", var('"value":1e999'), "past a double's range" },
    { "a value of -1e999", var('"value":-1e999'), "past a double's range" },
    { "a value of 401 digits", var('"value":\' + ' .. big .. ' + b\''), "past a double's range" },
    { "1e999 in a list", var('"numbers":"floats","value":[1.5,1e999]'), "past a double's range" },
    { "1e999 in value_json", var('"numbers":"mixed","value_json":"[1, 2.5, 1e999]"'), "past a double's range" },
    { "401 digits in value_json", var('"numbers":"mixed","value_json":"[2.5, \' + ' .. big .. ' + b\']"'),
      "past a double's range" },
    { "an integer past 64 bits in value_json", var('"numbers":"mixed","value_json":"[2.5, 18446744073709551616]"'),
      "an integer past" },
    { "1e999 in a tool's arguments", "b'{\"type\":\"tool_call\",\"id\":1,\"name\":\"t\",\"args\":[1e999]}'",
      "past a double's range" },
    { "1e999 in a tool's keyword arguments",
      "b'{\"type\":\"tool_call\",\"id\":1,\"name\":\"t\",\"args\":[],\"kwargs\":{\"k\":[-1e999]}}'",
      "past a double's range" },
  }
  for _, row in ipairs(rows) do
    it("ends with protocol_error, never an answer, on " .. row[1], function()
      local result, err = hostile(row[2])
      assert.is_nil(result and result.answer)
      assert.are.equal("protocol_error", err.kind)
      assert.matches(row[3], err.message, 1, true)
    end)
  end

  it("refuses 1e999 in the start's stamps, which only a driver's start can send", function()
    local protocol = require("rlm.base.protocol")
    local msg, why = protocol.decode('{"type":"hello","protocol":1,"python":"3","t":[1e999,1]}', { hello = true })
    assert.is_nil(msg)
    assert.matches("past a double's range", why, 1, true)
    assert.is_table((protocol.decode('{"type":"hello","protocol":1,"python":"3","t":[1.5,2]}', { hello = true })))
  end)

  it("takes the finite extremes", function()
    local result, err = hostile(var('"numbers":"floats","value":[1e308,-1e308,5e-324,-0.0]'))
    assert.is_nil(err)
    assert.are.equal(1e308, result.value[1])
    assert.are.equal(-1e308, result.value[2])
    assert.is_nil(result.answer:find(HEAP))
  end)

  it("never makes an answer of tostring(table)", function()
    assert.has_error(function()
      finals.final_of({ kind = "var", name = "v", json = true, value = { 1, math.huge } })
    end)
    assert.has_error(function()
      finals.final_of({ kind = "var", name = "v", json = true, value = { f = print } })
    end)
    assert.are.equal('{"a":[1]}', finals.final_of({ kind = "var", name = "v", json = true, value = { a = { 1 } } }).answer)
  end)
end)

describe("what the code makes too deep or too big for the host", function()
  after_each(H.assert_clean)

  -- The code's tries, one a line of its output; then the REPL's state, kept.
  local function run(code, opts)
    local o = {
      guardrails = false,
      tools = { t = function(first) return first ~= nil and "ok" or "none" end },
      root_llm = H.script({
        fence("kept = 41\n" .. [[
def nest(n, leaf=0, d=False):
    x = leaf
    for _ in range(n):
        x = {'a': x} if d else [x]
    return x
def attempt(what, fn):
    try:
        fn()
        print(what, 'ok')
    except ValueError as e:
        print(what, 'ValueError', e)
]] .. code),
        fence("FINAL(str(kept + 1))") }),
    }
    for k, v in pairs(opts or {}) do
      o[k] = v
    end
    local result, err = H.run(o)
    assert.is_nil(err, err and err.message)
    assert.are.equal("42", result.answer) -- the REPL went on
    local seen = {}
    for line in result.history[1].stdout:gmatch("[^\n]+") do
      local what, how = line:match("^(%S+) (%S+)")
      seen[what] = how
    end
    return seen, result.history[1].stdout
  end

  it("refuses tool arguments nested past what the host reads, as a ValueError", function()
    local seen, out = run([[
attempt('list198', lambda: t(nest(198)))
attempt('list199', lambda: t(nest(199)))
attempt('list300', lambda: t(nest(300)))
attempt('dict199', lambda: t(k=nest(199, d=True)))
attempt('tuple199', lambda: t(nest(198, leaf=(1,))))
]])
    assert.are.same({ list198 = "ok", list199 = "ValueError", list300 = "ValueError", dict199 = "ValueError",
      tuple199 = "ValueError" }, seen, out)
    assert.matches("more than 198 deep", out, 1, true)
  end)

  it("refuses tool arguments with an integer a tool would not get exactly, as a ValueError", function()
    local seen, out = run([[
attempt('exact', lambda: t(2**53, -2**53))
attempt('past53', lambda: t(2**53 + 1))
attempt('huge', lambda: t([10**400]))
attempt('keys', lambda: t({1: 'a', '1': 'b'}))
]])
    assert.are.same({ exact = "ok", past53 = "ValueError", huge = "ValueError", keys = "ValueError" }, seen, out)
  end)

  it("refuses a FINAL_VAR value nested past what the host reads, as a ValueError", function()
    local seen, out = run([[
for name, v in [('list199', nest(199)), ('dict199', nest(199, d=True)), ('mixed199', nest(199, leaf=[1, 2.5])),
                 ('floats250', nest(250, leaf=2.5)), ('str199', nest(199, leaf='x'))]:
    attempt(name, lambda: FINAL_VAR('v'))
]])
    assert.are.same({ list199 = "ValueError", dict199 = "ValueError", mixed199 = "ValueError",
      floats250 = "ValueError", str199 = "ValueError" }, seen, out)
    assert.matches("nests lists and dicts more than 198 deep", out, 1, true)
  end)

  it("counts a tuple's items toward the values a final answer may hold", function()
    local seen, out = run("v = tuple(range(70000))\nattempt('tuple', lambda: FINAL_VAR('v'))")
    assert.are.same({ tuple = "ValueError" }, seen, out)
    assert.matches("JSON values", out, 1, true)
  end)

  for _, row in ipairs({
    { "a list", "nest(198)" },
    { "a dict of ints", "nest(197, leaf=[1], d=True)" },
    { "a value of ints and floats", "nest(197, leaf=[1, 2.5])" },
  }) do
    it("answers with a FINAL_VAR value 198 deep: " .. row[1], function()
      local result, err = H.run({
        root_llm = H.script({ fence("def nest(n, leaf=0, d=False):\n    x = leaf\n    for _ in range(n):\n"
          .. "        x = {'a': x} if d else [x]\n    return x\nv = " .. row[2] .. "\nFINAL_VAR('v')") }),
      })
      assert.is_nil(err, err and err.message)
      local depth, v = 0, result.value
      while type(v) == "table" do
        depth = depth + 1
        v = v[1] or v.a
      end
      assert.are.equal(198, depth)
    end)
  end
end)
