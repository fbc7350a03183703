-- Issue 15, the REPL's robustness: what real root models write (a
-- try/except around llm_query, a loop that runs too long, a rebound
-- `context`) and what flaky endpoints do never cost the REPL's state.
local H = require("helpers")
local fence = H.fence

describe("a failed llm_query", function()
  after_each(H.assert_clean)

  it("raises an exception the code catches (an HTTP 500 after retries), and the run goes on", function()
    local root = H.script({
      fence("notes = ['kept']\ntry:\n    r = llm_query('summarise')\nexcept Exception as e:\n"
        .. "    r = 'fallback: ' + type(e).__name__ + ': ' + str(e)\nprint(r)"),
      fence("FINAL(notes[0] + ' / ' + r)"),
    })
    local result, err = H.run({
      root_llm = root,
      llm_query = function() error("HTTP 500 from the endpoint after 3 retries", 0) end,
    })
    assert.is_nil(err)
    assert.matches("^kept / fallback: RuntimeError: llm_query failed: HTTP 500 from the endpoint after 3 retries",
      result.answer)
  end)

  it("raises for nil, err (a 400 context_length_exceeded) and for a non-string", function()
    local n = 0
    local result, err = H.run({
      root_llm = H.script({ fence("out = []\nfor p in ['a', 'b']:\n    try:\n        out.append(llm_query(p))\n"
        .. "    except RuntimeError as e:\n        out.append(str(e))\nFINAL(' | '.join(out))") }),
      llm_query = function()
        n = n + 1
        if n == 1 then
          return nil, "HTTP 400: context_length_exceeded"
        end
        return 42
      end,
    })
    assert.is_nil(err)
    assert.matches("llm_query failed: HTTP 400: context_length_exceeded | llm_query failed: the callback "
      .. "returned number, not a string", result.answer, 1, true)
  end)

  it("uncaught, is an error the model sees: the REPL's variables survive", function()
    local root = H.script({ fence("x = 7"), fence("y = llm_query('q')"), fence("FINAL(x * 6)") })
    local result, err = H.run({ root_llm = root, llm_query = function() error("down", 0) end })
    assert.is_nil(err)
    assert.are.equal("42", result.answer)
    assert.matches("RuntimeError: llm_query failed: down", result.history[2].error, 1, true)
  end)

  it("past max_sub_calls still ends the run", function()
    local _, err = H.run({
      max_sub_calls = 1,
      fallback = false,
      root_llm = H.script({ fence("for i in range(3):\n    try:\n        llm_query('x')\n    except Exception:\n"
        .. "        pass") }),
    })
    assert.are.equal("sub_call_budget", err.kind)
  end)
end)

describe("a failed root call", function()
  after_each(H.assert_clean)

  it("leaves the session resumable: run() again goes on with the REPL intact", function()
    local fail = false
    local calls = 0
    local s = H.session({
      root_llm = function()
        calls = calls + 1
        if fail then
          fail = false
          error("HTTP 503 from the root endpoint", 0)
        end
        if calls == 1 then
          return fence("x = 41")
        end
        return fence("FINAL(x + 1)")
      end,
    })
    assert(s:step())
    fail = true
    local r, err = s:run()
    assert.is_nil(r)
    assert.are.equal("callback_error", err.kind)
    assert.is_true(err.resumable)
    assert.matches("HTTP 503", err.message)
    r, err = s:run()
    assert.is_nil(err)
    assert.are.equal("42", r.answer)
    assert.are.equal(2, r.iterations)
    s:close()
  end)

  it("from nil, err leaves step() resumable too", function()
    local replies = { fence("x = 1"), false, fence("FINAL(x)") }
    local n = 0
    local s = H.session({
      root_llm = function()
        n = n + 1
        if replies[n] == false then
          return nil, "rate limited"
        end
        return replies[n]
      end,
    })
    assert(s:step())
    local e, err = s:step()
    assert.is_nil(e)
    assert.is_true(err.resumable)
    e = assert(s:step())
    assert.are.equal("1", e.final.answer)
    s:close()
  end)
end)

-- Polls s until an event passes `want`, sleeping on its fd() between.
local function poll_until(s, want, limit_ms)
  local core = require("rlm.core")
  local t0 = core.now_ms()
  while core.now_ms() - t0 < (limit_ms or 20000) do
    local ev = s:poll()
    if ev and want(ev) then
      return ev
    end
    if not ev then
      local ms = s:timeout()
      if ms ~= 0 then
        s.engine:watched():wait(ms < 0 and 100 or math.min(ms, 100))
      end
    end
  end
  error("no such event in time")
end

describe("step_timeout_ms", function()
  after_each(H.assert_clean)

  it("interrupts a runaway loop: the block is rolled back, the model told, the REPL kept", function()
    local root = H.script({
      fence("x = 1"),
      fence("y = 2\nwhile True:\n    pass"),
      fence("try:\n    y\n    seen = True\nexcept NameError:\n    seen = False\nFINAL(f'{x} {seen}')"),
    })
    local core = require("rlm.core")
    local t0 = core.now_ms()
    local result, err = H.run({ root_llm = root, step_timeout_ms = 1000, sandbox = { interrupt_grace_ms = 5000 } })
    assert.is_nil(err)
    assert.are.equal("1 False", result.answer)
    assert.matches("KeyboardInterrupt: the step ran past step_timeout_ms", result.history[2].error, 1, true)
    assert.matches("was interrupted", root.calls[3][#root.calls[3]].content, 1, true)
    assert.is_true(core.now_ms() - t0 < 5000) -- the interrupt, not the grace, ended it
  end)

  it("interrupts a sleep, and code that catches Exception does not stop it", function()
    local result, err = H.run({
      step_timeout_ms = 800,
      root_llm = H.script({
        fence("import time\ntry:\n    time.sleep(60)\nexcept Exception:\n    print('swallowed')"),
        fence("FINAL('after')"),
      }),
    })
    assert.is_nil(err)
    assert.are.equal("after", result.answer)
    assert.are.equal("", result.history[1].stdout)
    assert.matches("KeyboardInterrupt", result.history[1].error)
  end)

  it("kills code that swallows the interrupt once interrupt_grace_ms is over", function()
    local core = require("rlm.core")
    local t0 = core.now_ms()
    local _, err = H.run({
      step_timeout_ms = 500,
      sandbox = { interrupt_grace_ms = 500 },
      root_llm = H.script({ fence("while True:\n    try:\n        while True:\n            pass\n"
        .. "    except:\n        print('caught, going on')") }),
    })
    assert.are.equal("step_timeout", err.kind)
    assert.matches("interrupt_grace_ms", err.message)
    assert.is_true(core.now_ms() - t0 < 10000)
  end)

  it("interrupts code that waits on a sub-call, and a call made during the grace", function()
    local s = H.session({
      step_timeout_ms = 500,
      root_llm = H.script({
        fence("x = 5\n"),
        fence("try:\n    r = llm_query('slow')\nexcept:\n    r = llm_query('again')"),
        fence("FINAL(x)"),
      }),
    })
    local ev = poll_until(s, function(e) return e.type == "root_llm" end)
    s:reply(ev.id, s.opts.root_llm(ev.messages))
    ev = poll_until(s, function(e) return e.type == "root_llm" end)
    s:reply(ev.id, s.opts.root_llm(ev.messages))
    local slow = poll_until(s, function(e) return e.type == "llm_query" end)
    ev = poll_until(s, function(e) return e.type == "root_llm" end) -- never answered: interrupted
    s:reply(slow.id, "too late") -- dropped: its exec was interrupted
    assert.matches("KeyboardInterrupt", s.conversation.history[2].error)
    s:reply(ev.id, s.opts.root_llm(ev.messages))
    ev = poll_until(s, function(e) return e.type == "done" end)
    assert.are.equal("5", ev.result.answer)
    assert.are.equal(1, ev.result.sub_calls) -- the call made during the grace never went out
    s:close()
  end)

  it("does not count the root model's reply", function()
    local root = H.script({
      function()
        local t = require("rlm.core").now_ms()
        while require("rlm.core").now_ms() - t < 1500 do end -- a blocking 1.5 s model call
        return fence("x = 1")
      end,
      fence("FINAL(x)"),
    })
    local result, err = H.run({ root_llm = root, step_timeout_ms = 1000 })
    assert.is_nil(err)
    assert.are.equal("1", result.answer)
  end)
end)

describe("root_timeout_ms", function()
  after_each(H.assert_clean)

  it("gives up a root call that does not answer; the session goes on when polled again", function()
    local s = H.session({ root_timeout_ms = 300, root_llm = H.script({ fence("x = 3"), fence("FINAL(x)") }) })
    local ev = poll_until(s, function(e) return e.type == "root_llm" end)
    s:reply(ev.id, s.opts.root_llm(ev.messages))
    local lost = poll_until(s, function(e) return e.type == "root_llm" end)
    local err = poll_until(s, function(e) return e.type == "error" end).err
    assert.are.equal("callback_error", err.kind)
    assert.is_true(err.resumable)
    assert.are.equal(300, err.timeout_ms)
    assert.is_false(s:reply(lost.id, fence("FINAL('late')")))
    ev = poll_until(s, function(e) return e.type == "root_llm" end)
    s:reply(ev.id, s.opts.root_llm(ev.messages))
    ev = poll_until(s, function(e) return e.type == "done" end)
    assert.are.equal("3", ev.result.answer)
    s:close()
  end)
end)

describe("the REPL's own names", function()
  after_each(H.assert_clean)

  it("are restored after a block that rebinds them, and the model is told", function()
    local root = H.script({
      fence("context = 'x'\nllm_query = None\ndel FINAL_VAR\nanswer = 'oops'"),
      fence("print(context, llm_query('ping'), type(answer).__name__)\nr = 1\nFINAL_VAR('r')"),
    })
    local result, err = H.run({ root_llm = root, context = "the data" })
    assert.is_nil(err)
    assert.are.equal(1, result.value)
    local out1 = result.history[1].stdout
    assert.matches("context, llm_query, FINAL_VAR are the REPL's own names", out1, 1, true)
    assert.matches("the data echo: ping str", result.history[2].stdout, 1, true) -- answer is the model's
    assert.not_matches("REPL's own", result.history[2].stdout, 1, true)
  end)

  it("keep an answer dict the code rebinds to another dict", function()
    local result = H.run({
      root_llm = H.script({ fence("answer = {'content': 'built', 'ready': False}"),
        fence("answer['ready'] = True") }),
    })
    assert.are.equal("built", result.answer)
    assert.not_matches("REPL's own", result.history[1].stdout, 1, true)
  end)
end)

describe("the guard", function()
  after_each(H.assert_clean)

  it("lets an allowed module import what it needs (datetime.strptime imports _strptime)", function()
    local result, err = H.run({
      root_llm = H.script({ fence("import datetime, time\nd = datetime.datetime.strptime('2024-03-05', '%Y-%m-%d')\n"
        .. "t = time.strptime('2024', '%Y')\nFINAL(f'{d.day} {t.tm_year}')") }),
    })
    assert.is_nil(err)
    assert.are.equal("5 2024", result.answer)
  end)

  it("still refuses the model's own import of what an allowed module loaded", function()
    local result = H.run({
      root_llm = H.script({
        fence("import datetime\ndatetime.datetime.strptime('2024', '%Y')\nimport _strptime"),
        fence("import datetime\nprint(datetime._strptime)"),
        fence("imp = __import__\nos = imp('os', None, None, [], 0)"), -- the C code's form, by hand
        fence("import time\nprint([n for n in dir(time) if 'strptime' in n])\nFINAL('ok')"),
      }),
    })
    assert.matches("GuardrailError: line 1: the name '__import__' is refused", result.history[3].error, 1, true)
    assert.matches("ImportError: import of '_strptime' is refused", result.history[1].error, 1, true)
    assert.matches("AttributeError", result.history[2].error, 1, true)
    assert.are.equal("['strptime']\n", result.history[4].stdout)
  end)
end)

describe("numbers", function()
  after_each(H.assert_clean)
  local M = setmetatable({}, { __index = math }) -- 5.3+ fields, unknown to luacheck's lua51
  local has_int = M.type ~= nil

  it("reach Python exactly: integers as ints (all 64 bits on 5.3+), floats with 17 digits", function()
    local ctx = { ts = 1700000000123456, ratio = 0.1, third = 1 / 3, big = 2 ^ 60, neg = -42, f = 3.0 }
    local keys = "('ts', 'ratio', 'third', 'big', 'neg', 'f')"
    local want = "[1700000000123456, 0.1, 0.3333333333333333, 1.152921504606847e+18, -42, 3"
    if has_int then
      ctx.i64, ctx.i60 = M.maxinteger, M.tointeger(2 ^ 60)
      keys = "('ts', 'ratio', 'third', 'big', 'neg', 'f', 'i64', 'i60')"
      want = want .. ", 9223372036854775807, 1152921504606846976"
    end
    local result, err = H.run({ context = ctx,
      root_llm = H.script({ fence("FINAL(repr([context[k] for k in " .. keys .. "]))") }) })
    assert.is_nil(err)
    assert.are.equal(want .. "]", result.answer)
  end)

  it("come back exactly: Python ints as Lua integers on 5.3+, floats as floats", function()
    local result, err = H.run({
      root_llm = H.script({ fence("v = {'n': 3, 'f': 3.0, 'ts': 1700000000123456, 'x': 0.1, "
        .. "'l': [1, -2, 2**53]}\nFINAL_VAR('v')") }),
    })
    assert.is_nil(err)
    local v = result.value
    assert.are.equal(1700000000123456, v.ts)
    assert.are.equal(0.1, v.x)
    assert.are.equal(3, v.n)
    if has_int then
      assert.are.equal("integer", M.type(v.n))
      assert.are.equal("float", M.type(v.f))
      assert.are.equal("integer", M.type(v.l[3]))
      assert.are.equal(2 ^ 53, v.l[3])
      assert.matches('"n":3[,}]', result.answer)
    end
  end)

  it("come back as integers when the value holds only ints, and as floats when only floats", function()
    local result = H.run({ root_llm = H.script({ fence("v = {'a': [1, 2, {'b': -3}], 'n': 7}\nFINAL_VAR('v')") }) })
    assert.are.same({ a = { 1, 2, { b = -3 } }, n = 7 }, result.value)
    local f = H.run({ root_llm = H.script({ fence("v = [1.0, 0.5]\nFINAL_VAR('v')") }) }).value
    assert.are.same({ 1, 0.5 }, f)
    if has_int then
      assert.are.equal("integer", M.type(result.value.a[3].b))
      assert.are.equal("integer", M.type(result.value.n))
      assert.are.equal("float", M.type(f[1]))
    end
  end)

  it("keeps all 64 bits of a Python int on 5.3+", function()
    if not has_int then
      return
    end
    local result = H.run({ root_llm = H.script({ fence("v = [2**63 - 1, -2**63, 2**53 + 1]\nFINAL_VAR('v')") }) })
    assert.are.same({ M.maxinteger, M.mininteger, 9007199254740993 }, result.value)
  end)

  it("reports dict keys that collide to the model", function()
    local root = H.script({
      fence("d = {1: 'a', '1': 'b'}\nFINAL_VAR('d')"),
      fence("FINAL('gave up')"),
    })
    local result, err = H.run({ root_llm = root })
    assert.is_nil(err)
    assert.matches("the dict keys 1 and '1' are both '1' in JSON", result.history[1].error, 1, true)
    assert.are.equal("gave up", result.answer)
  end)

  -- Issue 28: FINAL_VAR(2**62) on LuaJIT raised on every turn, and the run
  -- ended out of turns.
  it("answers with an int past what a Lua number holds: a number where a double holds it, else its digits", function()
    local code = "v = [2**62, 2**53 + 1, -2**62 - 1, 10**30, {'k': 2**64}, 7]\nFINAL_VAR('v')"
    local result, err = H.run({ root_llm = H.script({ fence(code) }) })
    assert.is_nil(err)
    assert.are.equal(1, result.iterations)
    assert.are.equal("[4611686018427387904,9007199254740993,-4611686018427387905,"
      .. "1000000000000000000000000000000,{\"k\":18446744073709551616},7]", result.answer)
    local v = result.value
    assert.are.equal("1000000000000000000000000000000", v[4])
    assert.are.equal(7, v[6])
    if has_int then
      assert.are.equal("18446744073709551616", v[5].k) -- past 64 bits
      assert.are.equal(M.tointeger(2 ^ 62), v[1])
      assert.are.equal("integer", M.type(v[1]))
      assert.are.equal(9007199254740993, v[2])
      assert.are.equal(-4611686018427387904 - 1, v[3])
    else
      assert.are.equal(2 ^ 62, v[1]) -- exact in a double
      assert.are.equal(2 ^ 64, v[5].k)
      assert.are.equal("9007199254740993", v[2])
      assert.are.equal("-4611686018427387905", v[3])
    end
    local one = H.run({ root_llm = H.script({ fence("n = 2**53 + 1\nFINAL_VAR('n')") }) })
    assert.are.equal("9007199254740993", one.answer)
    assert.are.equal(has_int and 9007199254740993 or "9007199254740993", one.value)
  end)

  it("refuses a context whose keys collide in JSON", function()
    local ok, e = pcall(require("rlm").Session.new, H.opts({ context = { [1] = "a", ["1"] = "b", x = 1 } }))
    assert.is_false(ok)
    assert.matches('the keys (%S+) and (%S+) are both "1" in JSON', e)
  end)
end)

describe("the host's reading of a FINAL_VAR value (a hostile driver)", function()
  local protocol = require("rlm.base.protocol")
  local json = require("rlm.base.json")
  local allowed = { exec_result = true }
  local function line(value_json, numbers)
    return json.encode({ type = "exec_result", id = 1, stdout = "",
      final = { kind = "var", name = "v", json = true, value_json = value_json, numbers = numbers } })
  end

  it("decodes integers as integers and floats as floats", function()
    local msg = assert(protocol.decode(line('{"a": [1, 2.5, -3e2, "x\\"y"], "b": null, "c": true}'), allowed, 100))
    assert.is_nil((protocol.decode(line("[1]", "odd"), allowed, 100))) -- not a known hint
    local ints = assert(protocol.decode(json.encode({ type = "exec_result", id = 1, stdout = "",
      final = { kind = "var", name = "v", json = true, value = { 1, { a = 2 } }, numbers = "ints" } }), allowed, 100))
    assert.are.same({ 1, { a = 2 } }, ints.final.value)
    for _, bad in ipairs({ { answer = 7, json = true }, { answer = "7", json = false } }) do
      assert.is_nil((protocol.decode(json.encode({ type = "exec_result", id = 1, stdout = "",
        final = { kind = "var", name = "v", json = bad.json, value = "7", answer = bad.answer } }), allowed, 100)))
    end
    local v = msg.final.value
    assert.are.equal(1, v.a[1])
    assert.are.equal(2.5, v.a[2])
    assert.are.equal(-300, v.a[3])
    assert.are.equal('x"y', v.a[4])
    assert.are.equal(json.null, v.b)
    assert.is_true(v.c)
  end)

  it("refuses text that is not JSON, too many values, too deep a nesting", function()
    for _, case in ipairs({
      { "[1, 2", "a missing" }, { "[1] x", "text after the value" }, { "{1: 2}", "not a string" },
      { "[" .. ("1,"):rep(200) .. "1]", "more than 100 values" },
      { ("["):rep(300) .. ("]"):rep(300), "nesting deeper than 200", 1000 }, { '"abc', "unterminated" },
      { "NaN", "unexpected character" },
    }) do
      local msg, why = protocol.decode(line(case[1]), allowed, case[3] or 100)
      assert.is_nil(msg)
      assert.matches(case[2], why, 1, true)
    end
  end)

  it("encodes what JSON cannot carry as an error, not a change", function()
    assert.has_error(function() json.encode({ 1, nil, 3 }) end)
    assert.has_error(function() json.encode({ x = 0 / 0 }) end)
    assert.has_error(function() json.encode({ f = print }) end)
    assert.are.equal('{"a":[0.1,-2,1e+300]}', json.encode({ a = { 0.1, -2, 1e300 } }))
  end)
end)
