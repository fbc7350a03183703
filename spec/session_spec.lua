-- A whole session: scripted stand-in root models drive the real sandboxed
-- REPL.
local H = require("helpers")
local fence = H.fence

describe("a session", function()
  after_each(H.assert_clean)

  describe("FINAL", function()
    it("ends the run with str() of its argument", function()
      local result, err = H.run({
        root_llm = H.script({ fence("x = 6 * 7\nFINAL(x)") }),
      })
      assert.is_nil(err)
      assert.are.equal("42", result.answer)
      assert.are.equal("value", result.kind)
      assert.are.equal(1, result.iterations)
    end)

    it("runs a bare FINAL line written outside any fence", function()
      local result, err = H.run({
        root_llm = H.script({ fence("found = 'the key'"), "It is in `found`.\n\nFINAL(found)\n" }),
      })
      assert.is_nil(err)
      assert.are.equal("the key", result.answer)
      assert.are.equal(2, result.iterations)
    end)

    it("ends the run even when the code catches Exception around it", function()
      local result = H.run({
        root_llm = H.script({ fence("try:\n    FINAL('kept')\nexcept Exception:\n    pass\nprint('after')") }),
      })
      assert.are.equal("kept", result.answer)
    end)
  end)

  describe("FINAL_VAR", function()
    it("returns a dict as a Lua table", function()
      local result, err = H.run({
        root_llm = H.script({ fence("d = {'name': 'ada', 'tags': ['a', 'b'], 'n': 3}\nFINAL_VAR('d')") }),
      })
      assert.is_nil(err)
      assert.are.equal("var", result.kind)
      assert.are.equal("d", result.var)
      assert.are.same({ name = "ada", tags = { "a", "b" }, n = 3 }, result.value)
    end)

    it("returns the repr of a value JSON cannot carry", function()
      local result = H.run({
        root_llm = H.script({ fence("s = {1, 2}\nFINAL_VAR('s')") }),
      })
      assert.are.equal("{1, 2}", result.value)
      assert.are.equal("{1, 2}", result.answer)
    end)

    it("reports an undefined name as an error, not an end", function()
      local root = H.script({ fence("FINAL_VAR('nope')"), fence("FINAL('ok')") })
      local result = H.run({ root_llm = root })
      assert.are.equal("ok", result.answer)
      assert.matches("nope", root.calls[2][#root.calls[2]].content)
    end)
  end)

  describe("the answer dict", function()
    it("ends the run when ready is set", function()
      local result = H.run({
        root_llm = H.script({ fence("answer['content'] = 'from the dict'\nanswer['ready'] = True") }),
      })
      assert.are.equal("answer", result.kind)
      assert.are.equal("from the dict", result.answer)
    end)

    it("does not end the run while ready is false", function()
      local result = H.run({
        root_llm = H.script({ fence("answer['content'] = 'draft'"), fence("FINAL('final')") }),
      })
      assert.are.equal("final", result.answer)
      assert.are.equal(2, result.iterations)
    end)
  end)

  describe("the REPL", function()
    it("keeps variables across steps", function()
      local result = H.run({
        root_llm = H.script({ fence("a = [1, 2, 3]"), fence("a.append(4)"), fence("FINAL(sum(a))") }),
      })
      assert.are.equal("10", result.answer)
      assert.are.equal(3, result.iterations)
    end)

    it("shows the model what the code printed", function()
      local root = H.script({ fence("print(len(context), context.upper())"), fence("FINAL(1)") })
      H.run({ root_llm = root })
      assert.matches("11 HELLO WORLD", root.calls[2][#root.calls[2]].content, 1, true)
    end)

    it("rolls back the names a failing step set, and shows the traceback", function()
      local root = H.script({
        fence("keep = 1"),
        fence("keep = 2\nnew_name = 3\nraise ValueError('boom here')"),
        fence("FINAL(str(keep) + ':' + str('new_name' in dir()))"),
      })
      local result = H.run({ root_llm = root })
      assert.are.equal("1:False", result.answer)
      local seen = root.calls[3][#root.calls[3]].content
      assert.matches("ValueError: boom here", seen, 1, true)
      assert.matches("Traceback", seen, 1, true)
      assert.matches("raise ValueError", seen, 1, true) -- the source line
      assert.are.equal("ValueError: boom here", result.history[2].error:match("ValueError: boom here"))
    end)

    it("reports a syntax error", function()
      local root = H.script({ fence("def f(:\n  pass"), fence("FINAL('x')") })
      local result = H.run({ root_llm = root })
      assert.matches("SyntaxError", result.history[1].error)
      assert.matches("SyntaxError", root.calls[2][#root.calls[2]].content)
    end)

    it("runs every block of a response in order", function()
      local result = H.run({
        root_llm = H.script({ fence("x = 'a'") .. "\ntext\n" .. fence("x += 'b'") .. "\n" .. fence("FINAL(x)") }),
      })
      assert.are.equal("ab", result.answer)
      assert.are.equal(3, #result.history[1].blocks)
    end)

    it("truncates long output with a marker", function()
      local root = H.script({ fence("for i in range(100000):\n    print('line', i)"), fence("FINAL(1)") })
      local result = H.run({ root_llm = root, stdout_truncate_chars = 500 })
      local out = result.history[1].stdout
      assert.matches("%[truncated %d+ chars%]", out)
      assert.is_true(#out < 700)
    end)

    it("tells the model when a response has no code, and counts the turn", function()
      local root = H.script({ "I think the answer is somewhere.", fence("FINAL('x')") })
      local result = H.run({ root_llm = root })
      assert.are.equal(2, result.iterations)
      assert.matches("no ```repl code block", root.calls[2][#root.calls[2]].content, 1, true)
    end)
  end)

  describe("llm_query", function()
    it("carries the exact prompt the code built and returns the callback's text", function()
      local prompts = {}
      local result = H.run({
        context = "alpha beta",
        root_llm = H.script({ fence("r = llm_query('Summarise: ' + context[:5] + '\\n\\u00e9')\nFINAL(r)") }),
        llm_query = function(p)
          prompts[#prompts + 1] = p
          return "sub says " .. #p
        end,
      })
      assert.are.same({ "Summarise: alpha\n\195\169" }, prompts)
      assert.are.equal("sub says " .. #prompts[1], result.answer)
      assert.are.equal(1, result.sub_calls)
    end)

    it("turns an over-long prompt into an exception the code sees", function()
      local called = false
      local result = H.run({
        max_sub_prompt_chars = 10,
        root_llm = H.script({ fence("try:\n    llm_query('x' * 11)\nexcept RuntimeError as e:\n    FINAL(str(e))") }),
        llm_query = function()
          called = true
          return ""
        end,
      })
      assert.is_false(called)
      assert.matches("11 characters; the limit is 10", result.answer, 1, true)
    end)
  end)

  describe("max_iterations", function()
    it("takes a final answer from the last-chance call", function()
      local root = H.script({ fence("x = 1"), fence("x = 2"), "Out of turns, so:\nFINAL(x)" })
      local result, err = H.run({ root_llm = root, max_iterations = 2 })
      assert.is_nil(err)
      assert.are.equal("2", result.answer)
      assert.matches("no turns left", root.calls[3][#root.calls[3]].content)
    end)

    it("fails with max_iterations when the last chance gives no answer", function()
      local root = H.script({ fence("x = 1") })
      local result, err = H.run({ root_llm = root, max_iterations = 3, fallback = false })
      assert.is_nil(result)
      assert.are.equal("max_iterations", err.kind)
      assert.are.equal(3, #err.history)
      assert.are.equal(4, #root.calls)
      assert.matches("max_iterations", tostring(err))
    end)
  end)

  describe("on_event", function()
    it("reports the session, its sandbox, each step, root response, sub-call and block, and the end", function()
      local seen, ready = {}, nil
      local result = H.run({
        root_llm = H.script({ fence("print(llm_query('q'))"), fence("FINAL('z')") }),
        on_event = function(ev)
          seen[#seen + 1] = ev.type
          ready = ready or ev.type == "sandbox_ready" and ev
        end,
      })
      -- The first root call goes out while the sandbox starts; its reply is
      -- taken once the sandbox is ready (docs/api.md).
      assert.are.same({ "session_start", "step_start", "sandbox_ready", "root_response", "sub_query", "exec_result",
        "step_start", "root_response", "exec_result", "final", "run_end" }, seen)
      assert.are.same({ "bubblewrap", "bubblewrap", "cold" }, { ready.backend, ready.mode, ready.start })
      assert.are.same({ backend = "bubblewrap", mode = "bubblewrap", not_promised = {} }, result.sandbox)
    end)
  end)

  describe("step()", function()
    it("runs one root turn at a time", function()
      local s = H.session({ root_llm = H.script({ fence("print('one')"), fence("FINAL('two')") }) })
      local e1 = assert(s:step())
      assert.are.equal("one\n", e1.stdout)
      assert.is_nil(e1.final)
      local e2 = assert(s:step())
      assert.are.equal("two", e2.final.answer)
      s:close()
      s:close() -- idempotent
    end)
  end)

  describe("callbacks", function()
    it("gives callback_error when root_llm raises", function()
      local _, err = H.run({ root_llm = function() error("model down") end })
      assert.are.equal("callback_error", err.kind)
      assert.matches("model down", err.message)
    end)

    it("raises a RuntimeError in the code when llm_query returns a non-string", function()
      local result, err = H.run({
        root_llm = H.script({ fence("llm_query('x')"), fence("FINAL('on')") }),
        llm_query = function() return 42 end,
      })
      assert.is_nil(err)
      assert.are.equal("on", result.answer)
      assert.matches("RuntimeError: llm_query failed: the callback returned number, not a string",
        result.history[1].error, 1, true)
    end)
  end)
end)

-- run() and step() are a loop over the public poll() and reply(), as an
-- adapter's: the engine hands out a request and waits; it never calls a
-- model itself, whoever drives it (issue 40: it used to, under run()).
describe("run() and step()", function()
  after_each(H.assert_clean)

  -- A session whose poll() and reply() say when they run, and whose
  -- callbacks record whether they were called from inside poll().
  local function watched(answers)
    local state = { polling = false, inside = {}, replies = 0, polls = 0 }
    local s
    s = H.session({
      root_llm = H.script(answers),
      llm_query = function(prompt)
        state.inside[#state.inside + 1] = "llm_query " .. tostring(state.polling)
        return prompt:upper()
      end,
    })
    local poll, reply = s.poll, s.reply
    s.poll = function(self)
      state.polls = state.polls + 1
      state.polling = true
      local ev = poll(self)
      state.polling = false
      return ev
    end
    s.reply = function(self, ...)
      state.replies = state.replies + 1
      return reply(self, ...)
    end
    return s, state
  end

  for _, case in ipairs({
    { "run()", function(s)
      return s:run()
    end },
    { "step()", function(s)
      s:step()
      return s:step()
    end },
  }) do
    it(case[1] .. " calls every callback from its loop, outside poll(), and answers through reply()", function()
      local s, state = watched({ fence("x = llm_query('a') + llm_query('b')"), fence("FINAL(x)") })
      local out, err = case[2](s)
      s:close()
      assert.is_nil(err)
      assert.is_truthy(out)
      assert.are.same({ "llm_query false", "llm_query false" }, state.inside)
      assert.are.equal(4, state.replies) -- two root calls, two sub-calls
      assert.is_true(state.polls >= 4)
    end)
  end
end)

describe("the size of what the driver sends", function()
  after_each(H.assert_clean)

  it("turns a FINAL too large for the protocol into an error the model sees", function()
    local root = H.script({ fence("FINAL('x' * 100000)"), fence("FINAL('small')") })
    local result, err = H.run({ root_llm = root, sandbox = { max_message_bytes = 65536 } })
    assert.is_nil(err)
    assert.are.equal("small", result.answer)
    assert.matches("answer with something smaller", result.history[1].error, 1, true)
  end)

  it("turns an llm_query prompt too large for the protocol into an error", function()
    local called = false
    local result = H.run({
      sandbox = { max_message_bytes = 65536 },
      root_llm = H.script({ fence("try:\n    llm_query('y' * 70000)\nexcept ValueError as e:\n    FINAL(str(e))") }),
      llm_query = function() called = true return "" end,
    })
    assert.is_false(called)
    assert.matches("split it", result.answer)
  end)

  it("keeps invalid UTF-8 in a string context, byte for byte", function()
    local result = H.run({
      context = "ab\255\254c",
      root_llm = H.script({ fence("FINAL(len(context))") }),
    })
    assert.are.equal("5", result.answer)
  end)
end)

describe("truncation", function()
  after_each(H.assert_clean)

  it("keeps the head and the tail of long output, saying how much was cut", function()
    local result = H.run({
      stdout_truncate_chars = 300,
      root_llm = H.script({ fence("for i in range(10000):\n    print('line', i)"), fence("FINAL(1)") }),
    })
    local out = result.history[1].stdout
    assert.matches("^line 0\nline 1\n", out)
    assert.matches("line 9999\n$", out)
    local cut = tonumber(out:match("%[truncated (%d+) chars%]"))
    local printed = 0
    for i = 0, 9999 do
      printed = printed + #("line " .. i .. "\n")
    end
    assert.are.equal(printed - 300, cut)
  end)

  it("cuts again on the host what a driver sends too long", function()
    local seen
    H.run({
      guardrails = false,
      stdout_truncate_chars = 90,
      root_llm = H.script({ fence([[
import os, json
line = json.dumps({"type": "exec_result", "id": 1, "stdout": "A" * 5000 + "Z" * 100, "error": None, "final": None})
os.write(1, (line + "\n").encode())
import time
time.sleep(0.2)
os._exit(0)]]) }),
      on_event = function(ev)
        if ev.type == "exec_result" then
          seen = ev.stdout
        end
      end,
    })
    -- The forged result is taken as the step's output (a hostile driver can
    -- lie), but not at its length.
    assert.are.equal(("A"):rep(60) .. "\n[truncated 5010 chars]\n" .. ("Z"):rep(30), seen)
  end)

end)
