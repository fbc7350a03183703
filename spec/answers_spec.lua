-- Answers as real root models write them: prose FINAL and FINAL_VAR lines
-- (the paper's format), slips in FINAL_VAR, odd fences, answers at the last
-- chance. The stand-in root models below write what GPT- and Qwen-class
-- models write; the REPL and the sandbox are real.
local H = require("helpers")
local fence = H.fence

-- The last message the root model was sent before its call n.
local function told(root, n)
  local m = root.calls[n]
  return m[#m].content
end

describe("answers", function()
  after_each(H.assert_clean)

  describe("a prose FINAL line", function()
    local cases = {
      { "takes plain words up to the closing parenthesis",
        "I checked all three documents.\n\nFINAL(The capital is Paris, per the 3rd document)\n",
        "The capital is Paris, per the 3rd document" },
      { "takes several lines (a numbered list) up to the matching parenthesis",
        "The items are:\nFINAL(1. alpha\n2. beta (the second)\n3. gamma)\nThat is all.",
        "1. alpha\n2. beta (the second)\n3. gamma" },
      { "takes a FINAL in markdown bold", "**FINAL(42 apples)**", "42 apples" },
      { "takes a FINAL in inline code", "My answer: \n`FINAL(Ada Lovelace)`", "Ada Lovelace" },
      -- Issue 38: arithmetic of numbers may be a date or a score: text.
      { "takes arithmetic of numbers as written", "FINAL(6 * 7)", "6 * 7" },
      { "evaluates a variable's name to its value", "FINAL(context)", "hello world" },
      { "takes a block that is only FINAL(prose) as its text", fence("FINAL(The answer is 42)"),
        "The answer is 42" },
    }
    for _, case in ipairs(cases) do
      it(case[1], function()
        local result, err = H.run({ root_llm = H.script({ case[2] }) })
        assert.is_nil(err)
        assert.are.equal(case[3], result.answer)
        assert.are.equal(1, result.iterations)
      end)
    end

    it("is marked answer_source 'prose' (code's answers are 'code')", function()
      local result = H.run({ root_llm = H.script({ "FINAL(The capital is Paris)" }) })
      assert.are.equal("prose", result.answer_source)
      result = H.run({ root_llm = H.script({ fence("x = 1\nFINAL(x)") }) })
      assert.are.equal("code", result.answer_source)
    end)

    it("is not taken when a block of the same response raised, and the model is told", function()
      local root = H.script({ fence("result = 1 / 0") .. "\nFINAL_VAR(result)", fence("result = 2"), "FINAL_VAR(result)" })
      local result, err = H.run({ root_llm = root })
      assert.is_nil(err)
      assert.are.equal("2", result.answer)
      assert.are.equal(3, result.iterations)
      assert.matches("ZeroDivisionError", told(root, 2), 1, true)
      assert.matches("Your FINAL line was not taken as the answer, because a block raised", told(root, 2), 1, true)
    end)

    -- Issue 28: the model had not seen what its code printed, so a FINAL
    -- beside code is a guess, however the code went.
    it("beside code that ran is not taken (a guess), the model is told, and the turn is spent", function()
      local root = H.script({ fence("print('svc-b failed')") .. "\nFINAL(svc-a is the cause)",
        "FINAL(svc-b is the cause)" })
      local result, err = H.run({ root_llm = root })
      assert.is_nil(err)
      assert.are.equal("svc-b is the cause", result.answer)
      assert.are.equal(2, result.iterations)
      assert.is_nil(result.history[1].final)
      assert.matches("svc-b failed", told(root, 2), 1, true)
      assert.matches("Your FINAL line was not taken as the answer, because you wrote it before you saw what your "
        .. "code printed", told(root, 2), 1, true)
    end)

    -- Issue 38: a FINAL_VAR's value is what the model's code computed, as
    -- the reference reads it.
    it("beside code that ran without an error is taken as a FINAL_VAR", function()
      local root = H.script({ fence("found = 'svc-b'") .. "\nFINAL_VAR(found)", "FINAL_VAR(found)" })
      local result, err = H.run({ root_llm = root })
      assert.is_nil(err)
      assert.are.equal("svc-b", result.answer)
      assert.are.equal("found", result.var)
      assert.are.equal(1, result.iterations)
    end)

    -- Issue 28: the answer came back with the code cut out, and the code ran.
    it("holding a fenced block answers with the block in it, and the block does not run", function()
      local text = "Here is the function:\n```python\nprint('RAN')\ndef f(x):\n    return (x + 1)\n```\nCall f(41)."
      local result, err = H.run({ root_llm = H.script({ "Done.\nFINAL(" .. text .. ")\n" }) })
      assert.is_nil(err)
      assert.are.equal(text, result.answer)
      assert.are.equal("prose", result.answer_source)
      assert.are.equal(1, result.iterations)
      assert.are.equal("", result.history[1].stdout)
      assert.are.same({}, result.history[1].blocks)
    end)

    it("whose closing parenthesis is inside a code block is not taken, and the model is told", function()
      local root = H.script({ "FINAL(see\n```repl\nx = ')'\nprint(len(context))\n```\n", "FINAL(\"done\")" })
      local result = H.run({ root_llm = root })
      assert.are.equal(2, result.iterations)
      assert.matches("Your FINAL line's closing parenthesis is inside a code block", told(root, 2), 1, true)
    end)

    it("too large for the host is an error the model sees, not its text as the answer", function()
      local root = H.script({ "FINAL('x' * 100000)", "FINAL(small)" })
      local result = H.run({ root_llm = root, sandbox = { max_message_bytes = 65536 } })
      assert.are.equal("small", result.answer)
      assert.matches("answer with something smaller", told(root, 2), 1, true)
    end)
  end)

  -- Issue 32: the prose reading is for text that is not Python. A FINAL
  -- that is Python and raised once answered with its own source text.
  describe("a FINAL whose argument raised", function()
    local function down()
      error("sub-model down")
    end
    local cases = {
      { "a sub-call that raised", "FINAL(llm_query('summarise context'))", "llm_query failed: ", { llm_query = down } },
      { "a sub-call that returned nil, why", "FINAL(llm_query('summarise context'))", "llm_query failed: why: quota",
        { llm_query = function() return nil, "why: quota" end } },
      { "an rlm_query that failed", "FINAL(rlm_query('summarise context'))", "failed", { llm_query = down } },
      { "a tool that raised", "FINAL(lookup('k1'))", "ToolError",
        { tools = { lookup = function() error("no such key") end } } },
      { "a name that is not defined beside the model's data", "FINAL(context + undefined_name)",
        "NameError: name 'undefined_name' is not defined" },
      { "1/0 of the model's data", "FINAL(len(context) / 0)", "ZeroDivisionError" },
    }
    for _, case in ipairs(cases) do
      for _, form in ipairs({ "prose", "block" }) do
        it(("is an error the model sees and costs a turn (%s, written as a %s)"):format(case[1], form), function()
          local opts = { root_llm = H.script({ form == "block" and fence(case[2]) or case[2], "FINAL(\"svc-b\")" }) }
          for k, v in pairs(case[4] or {}) do
            opts[k] = v
          end
          local result, err = H.run(opts)
          assert.is_nil(err)
          assert.are.equal("svc-b", result.answer)
          assert.are.equal(2, result.iterations)
          assert.matches(case[3], told(opts.root_llm, 2), 1, true)
          if form == "prose" then
            assert.matches("Your FINAL line did not give an answer: it is code", told(opts.root_llm, 2), 1, true)
          end
        end)
      end
    end

    it("is no answer at the last chance either: the run ends with max_iterations", function()
      local root = H.script({ fence("print('svc-b is down')"), "FINAL(llm_query('summarise context'))" })
      local result, err = H.run({ root_llm = root, llm_query = down, max_iterations = 1, fallback = false })
      assert.is_nil(result)
      assert.are.equal("max_iterations", err.kind)
      assert.are.equal("svc-b is down", err.partial)
    end)

    it("text that is not Python is still the answer; a quoted string is its value", function()
      for reply, answer in pairs({ ["FINAL(The service was auth)"] = "The service was auth",
        ['FINAL("auth")'] = "auth", ["FINAL(auth's pool, then svc-b)"] = "auth's pool, then svc-b" }) do
        local result, err = H.run({ root_llm = H.script({ reply }) })
        assert.is_nil(err)
        assert.are.equal(answer, result.answer)
        assert.are.equal(1, result.iterations)
      end
    end)
  end)

  -- Issue 28: the REPL put its own answer dict back over `answer`, and
  -- FINAL(answer) answered "{'content': '', 'ready': False}".
  describe("the name answer", function()
    it("bound to llm_query's answer (the paper's prompt) keeps it, and FINAL(answer) gives it", function()
      for _, last in ipairs({ "FINAL(answer)", "FINAL_VAR(answer)", fence("FINAL(answer)") }) do
        local root = H.script({ fence("answer = llm_query('summarise')\nprint(answer[:5])"), last })
        local result, err = H.run({ root_llm = root })
        assert.is_nil(err)
        assert.are.equal("echo: summarise", result.answer)
        assert.are.equal(2, result.iterations)
        assert.not_matches("REPL's own", result.history[1].stdout, 1, true)
      end
    end)

    it("still the REPL's own dict (the block that bound it was rolled back) is no answer", function()
      for _, last in ipairs({ "FINAL(answer)", "FINAL_VAR(answer)", fence("FINAL_VAR('answer')") }) do
        local root = H.script({ fence("answer = llm_query('summarise')"), last, 'FINAL("svc-b")' })
        local result, err = H.run({ root_llm = root, llm_query = function() return nil, "quota" end })
        assert.is_nil(err)
        assert.are.equal("svc-b", result.answer)
        assert.are.equal(3, result.iterations)
        assert.matches("was given the REPL's own `answer` dict ({'content': '', 'ready': False}), not an answer",
          told(root, 3), 1, true)
      end
    end)
  end)

  describe("a prose FINAL_VAR line", function()
    for _, form in ipairs({ "FINAL_VAR(result)", "FINAL_VAR('result')", 'FINAL_VAR("result")',
      "FINAL_VAR( result )" }) do
      it("takes the variable's name written as " .. form, function()
        local root = H.script({ fence("result = 'The outage was caused by svc-b'"),
          "I have the answer in `result`.\n\n" .. form })
        local result, err = H.run({ root_llm = root })
        assert.is_nil(err)
        assert.are.equal("The outage was caused by svc-b", result.answer)
        assert.are.equal("var", result.kind)
        assert.are.equal("result", result.var)
      end)
    end

    it("that fails costs one turn, keeps the variables, and the corrected call answers", function()
      local root = H.script({ fence("result = {'service': 'svc-b'}"), "FINAL_VAR(reslt)", "FINAL_VAR(result)" })
      local result, err = H.run({ root_llm = root })
      assert.is_nil(err)
      assert.are.same({ service = "svc-b" }, result.value)
      assert.are.equal(3, result.iterations)
      assert.matches("no variable named 'reslt'. Did you mean FINAL_VAR('result')?", told(root, 3), 1, true)
    end)
  end)

  describe("FINAL_VAR in code", function()
    it("given a global's value instead of its name, finds the global", function()
      local result, err = H.run({ root_llm = H.script({
        fence("result = 'The outage was caused by svc-b'\nFINAL_VAR(result)") }) })
      assert.is_nil(err)
      assert.are.equal("result", result.var)
      assert.are.equal("The outage was caused by svc-b", result.answer)
    end)

    it("given a list a global holds, finds it too", function()
      local result = H.run({ root_llm = H.script({ fence("found = ['a', 'b']\nFINAL_VAR(found)") }) })
      assert.are.equal("found", result.var)
      assert.are.same({ "a", "b" }, result.value)
    end)

    it("given a value no variable holds, says how to fix the call", function()
      local root = H.script({ fence("FINAL_VAR(6 * 7)"), fence("FINAL('ok')") })
      H.run({ root_llm = root })
      assert.matches("FINAL_VAR takes the name of a variable, as a string: FINAL_VAR('result'). It was given "
        .. "a int value that no variable holds", told(root, 2), 1, true)
    end)
  end)

  describe("a failed final", function()
    -- The issue's run: the block is rolled back, the variable goes, and
    -- the corrected FINAL_VAR fails too, turn after turn.
    it("keeps the variables the same block set (FINAL_VAR of a misspelt name)", function()
      local root = H.script({ fence("result = 'kept'\nFINAL_VAR('reslt')"), fence("FINAL_VAR('result')") })
      local result, err = H.run({ root_llm = root, max_iterations = 3 })
      assert.is_nil(err)
      assert.are.equal("kept", result.answer)
      assert.are.equal(2, result.iterations)
    end)

    it("keeps them when FINAL's argument raises", function()
      local root = H.script({ fence("total = 41\nFINAL(totl + 1)"), fence("FINAL(total + 1)") })
      local result = H.run({ root_llm = root, max_iterations = 3 })
      assert.are.equal("42", result.answer)
      assert.matches("NameError", told(root, 2), 1, true)
    end)

    it("still rolls back a block that failed elsewhere", function()
      local root = H.script({ fence("gone = 1\nraise ValueError('no')"), fence("try:\n    gone\n    FINAL('kept')\nexcept NameError:\n    FINAL('rolled back')") })
      local result = H.run({ root_llm = root })
      assert.are.equal("rolled back", result.answer)
    end)
  end)

  describe("the last chance", function()
    it("takes a prose FINAL(42 apples)", function()
      local root = H.script({ fence("x = 1"), "FINAL(42 apples)" })
      local result, err = H.run({ root_llm = root, max_iterations = 1 })
      assert.is_nil(err)
      assert.are.equal("42 apples", result.answer)
      assert.are.equal("prose", result.answer_source)
      assert.matches("no turns left", told(root, 2), 1, true)
    end)

    -- Issue 28: an answer the model could not check was a plain success.
    it("marks its answer partial (reason max_iterations), under run(), step() and the final event", function()
      local evs = {}
      local result = H.run({ root_llm = H.script({ fence("x = 1"), "FINAL(42 apples)" }), max_iterations = 1,
        on_event = function(ev)
          evs[#evs + 1] = ev
        end })
      assert.is_true(result.partial)
      assert.are.equal("max_iterations", result.reason.kind)
      assert.matches("after max_iterations (1)", result.reason.message, 1, true)
      local final
      for _, ev in ipairs(evs) do
        final = ev.type == "final" and ev or final
      end
      assert.is_true(final.partial)
      assert.are.equal("max_iterations", final.reason)
      local text = H.run({ root_llm = H.script({ fence("x = 1"), "It is svc-b." }), max_iterations = 1 })
      assert.is_true(text.partial)
      local s = H.session({ root_llm = H.script({ fence("x = 1"), "FINAL_VAR(x)" }), max_iterations = 1 })
      assert.is_nil(s:step().final)
      local entry = s:step()
      s:close()
      assert.are.equal("1", entry.final.answer)
      assert.is_true(entry.final.partial)
      local within = H.run({ root_llm = H.script({ fence("x = 1"), "FINAL(42 apples)" }), max_iterations = 2 })
      assert.is_nil(within.partial)
    end)

    it("takes a prose FINAL_VAR(name)", function()
      local root = H.script({ fence("best = 'svc-b'"), "FINAL_VAR(best)" })
      local result = H.run({ root_llm = root, max_iterations = 1 })
      assert.are.equal("svc-b", result.answer)
      assert.are.equal("best", result.var)
    end)

    it("takes a FINAL line of a code block, and runs nothing else", function()
      local root = H.script({ fence("best = 'svc-b'"), fence("print('not run')\nFINAL(best)") })
      local result = H.run({ root_llm = root, max_iterations = 1 })
      assert.are.equal("svc-b", result.answer)
      assert.are.equal("", result.history[2].stdout)
    end)

    it("takes plain text as the answer, marked answer_source 'text'", function()
      local root = H.script({ fence("x = 1"), "I could not verify it, but the failing service is svc-b." })
      local result, err = H.run({ root_llm = root, max_iterations = 1 })
      assert.is_nil(err)
      assert.are.equal("I could not verify it, but the failing service is svc-b.", result.answer)
      assert.are.equal("text", result.answer_source)
      assert.are.equal("text", result.kind)
    end)

    it("fails with max_iterations carrying the best partial answer (err.partial)", function()
      local root = H.script({ fence("print('candidates: svc-b, svc-c')"), fence("print('more work')\nx = 2") })
      local result, err = H.run({ root_llm = root, max_iterations = 2, fallback = false })
      assert.is_nil(result)
      assert.are.equal("max_iterations", err.kind)
      assert.are.equal("more work", err.partial)
      assert.are.equal("repl_output", err.partial_source)
    end)

    it("falls back on the model's prose for err.partial when nothing was printed", function()
      local root = H.script({ "Thinking: it is probably svc-b.\n" .. fence("x = 1"), fence("x = 2") })
      local _, err = H.run({ root_llm = root, max_iterations = 1, fallback = false })
      assert.are.equal("Thinking: it is probably svc-b.", err.partial)
      assert.are.equal("response", err.partial_source)
    end)
  end)

  describe("every REPL output message", function()
    it("says the turns used and left and the sub-calls used and left", function()
      local root = H.script({ fence("print(llm_query('a'))"), fence("print(1)"), fence("FINAL('x')") })
      H.run({ root_llm = root, max_iterations = 10, max_sub_calls = 5 })
      assert.matches("[Turn 1 of 10 used, 9 left. Sub-calls: 1 of 5 used, 4 left.]", told(root, 2), 1, true)
      assert.matches("[Turn 2 of 10 used, 8 left. Sub-calls: 1 of 5 used, 4 left.]", told(root, 3), 1, true)
    end)

    it("says it after a response with no code too", function()
      local root = H.script({ "Let me think about it.", fence("FINAL('x')") })
      H.run({ root_llm = root, max_iterations = 4 })
      assert.matches("no ```repl code block", told(root, 2), 1, true)
      assert.matches("[Turn 1 of 4 used, 3 left.", told(root, 2), 1, true)
    end)

    it("warns at the last turns, and after the last one", function()
      local root = H.script({ fence("x = 1") })
      H.run({ root_llm = root, max_iterations = 3 })
      assert.not_matches("turn left", told(root, 2), 1, true)
      assert.matches("Only 1 turn left: finish up and answer", told(root, 3), 1, true)
      local m = root.calls[4]
      assert.matches("That was your last turn", m[#m - 1].content, 1, true)
    end)

    it("says when no sub-calls are left", function()
      local root = H.script({ fence("print(llm_query('a'))"), fence("FINAL('x')") })
      H.run({ root_llm = root, max_sub_calls = 1 })
      assert.matches("No sub-calls are left", told(root, 2), 1, true)
    end)
  end)

  describe("code extraction", function()
    local cases = {
      { "runs a block indented inside a numbered list (dedented)",
        "Plan:\n1. Count the lines:\n   ```python\n   n = 0\n   for l in context.split(' '):\n       n += 1\n   ```\n"
          .. "2. Answer:\n   ```repl\n   FINAL(n)\n   ```", "2" },
      { "runs an untagged fence when nothing is tagged", "```\nFINAL(len(context))\n```", "11" },
      { "runs a ~~~ fence", "~~~python\nFINAL('tilde')\n~~~", "tilde" },
      { "runs a python3 fence", "```python3\nFINAL('py3')\n```", "py3" },
      { "runs a py fence", "```py\nFINAL('py')\n```", "py" },
      { "runs a four-backtick fence holding a triple-backtick string",
        "````repl\ns = '```'\nFINAL(len(s))\n````", "3" },
      { "runs a fence written ```Python with a space", "``` Python\nFINAL('cap')\n```", "cap" },
    }
    for _, case in ipairs(cases) do
      it(case[1], function()
        local result, err = H.run({ root_llm = H.script({ case[2] }) })
        assert.is_nil(err)
        assert.are.equal(case[3], result.answer)
      end)
    end

    it("reads a reply of 20,000 unclosed FINAL lines in linear time", function()
      local core = require("rlm.core")
      local reply = ("FINAL(never closed (\n"):rep(20000)
      local t0 = core.now_ms()
      local parsed = require("rlm.engine.reply").parse(reply)
      -- A scan from each line to the end would read 4 GB here.
      assert.is_true(core.now_ms() - t0 < 2000, "took " .. (core.now_ms() - t0) .. " ms")
      assert.are.equal(0, #parsed.finals)
      assert.are.equal(1, #parsed.notes)
    end)

    local skipped = {
      { "a block in another language", "```bash\nls\n```\n" .. fence("print(1)"),
        "A ```bash block did not run: only blocks tagged repl (or python) run." },
      { "an untagged block beside tagged ones", fence("print(1)") .. "\n```\nprint(2)\n```",
        "An untagged ``` block did not run" },
      { "a block never closed", "```repl\nprint(1)\n", "A ```repl block was never closed" },
      { "a FINAL line never closed", "FINAL(the answer is", "Your FINAL line has no closing parenthesis" },
    }
    for _, case in ipairs(skipped) do
      it("tells the model about " .. case[1], function()
        local root = H.script({ case[2], fence("FINAL('x')") })
        H.run({ root_llm = root })
        assert.matches(case[3], told(root, 2), 1, true)
      end)
    end
  end)
end)
