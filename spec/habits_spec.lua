-- Issue 28: what real models write, out of notebooks and other model
-- families' formats, gets help or runs, instead of costing turns.
local H = require("helpers")
local L = require("helpers.luv")
local fence = H.fence

-- What the REPL told the model after its nth turn.
local function told(root, n)
  local call = root.calls[n + 1]
  return call[#call].content
end

describe("notebook habits", function()
  after_each(H.assert_clean)

  it("echo a bare last-line expression's repr, as a notebook shows it", function()
    local root = H.script({
      fence("x = [1, 2]\nlen(context), x"),
      fence("for i in range(2):\n    i\nx.append(3)"),
      fence("y = 'a' * 5000\ny"),
      fence("print('shown')\nNone"),
      fence("FINAL('done')"),
    })
    local result, err = H.run({ root_llm = root, context = "abcd", stdout_truncate_chars = 1000 })
    assert.is_nil(err)
    assert.are.equal("(4, [1, 2])\n", result.history[1].stdout)
    assert.are.equal("", result.history[2].stdout) -- None is not shown, nor a block's inner lines
    assert.matches("^'aaaa.*%[truncated %d+ chars%].*aaa'\n$", result.history[3].stdout)
    assert.are.equal("shown\n", result.history[4].stdout)
    assert.matches("(4, [1, 2])", told(root, 1), 1, true)
  end)

  it("echo the last expression under the guardrails' screen too, and raise its error", function()
    local root = H.script({
      fence("d = {'k': 'v'}\nf'{d}'"),
      fence("undefined_name"),
      fence("FINAL('done')"),
    })
    local result = H.run({ root_llm = root })
    assert.are.equal("\"{'k': 'v'}\"\n", result.history[1].stdout)
    assert.matches("NameError: name 'undefined_name' is not defined", result.history[2].error, 1, true)
  end)

  it("list the variables with SHOW_VARS()", function()
    local root = H.script({ fence("SHOW_VARS()"), fence("rows = [1, 2, 3]\nname = 'x'\nSHOW_VARS()"),
      fence("FINAL('done')") })
    local result = H.run({ root_llm = root })
    assert.is_nil(result.history[1].error)
    assert.matches("no variables yet", result.history[1].stdout, 1, true)
    assert.are.equal("rows: list, len 3\nname: str, len 1\n", result.history[2].stdout)
  end)

  it("point top-level await at llm_query without await and llm_query_batched", function()
    local root = H.script({ fence("answer = await llm_query('hi')"),
      fence("async for x in y:\n    pass"), fence("FINAL('done')") })
    local result = H.run({ root_llm = root })
    for i = 1, 2 do
      assert.matches("SyntaxError", result.history[i].error, 1, true)
      assert.matches("without await; for many prompts at once, llm_query_batched([prompt, ...])",
        result.history[i].error, 1, true)
    end
  end)

  it("point import asyncio at llm_query_batched, and numpy at allowed_modules", function()
    local root = H.script({ fence("import asyncio"), fence("import numpy as np"),
      fence("from concurrent.futures import ThreadPoolExecutor"), fence("FINAL('done')") })
    local result = H.run({ root_llm = root })
    assert.matches("import of 'asyncio' is refused", result.history[1].error, 1, true)
    assert.matches("llm_query_batched([prompt, ...]), which runs them concurrently", result.history[1].error, 1, true)
    assert.matches("sandbox = { allowed_modules = {\"numpy\"} }", result.history[2].error, 1, true)
    assert.matches("sys.path (its standard library and site-packages)", result.history[2].error, 1, true)
    assert.matches("llm_query_batched", result.history[3].error, 1, true)
  end)

  it("say that an allowed module the sandbox's Python does not have is not installed", function()
    local root = H.script({ fence("import rlm_no_such_module"), fence("FINAL('done')") })
    local result = H.run({ root_llm = root, sandbox = { allowed_modules = { "rlm_no_such_module" } } })
    assert.matches("ModuleNotFoundError: No module named 'rlm_no_such_module': the host allows it "
      .. "(sandbox.allowed_modules), but the sandbox's Python does not have it", result.history[1].error, 1, true)
  end)
end)

describe("other model families' forms", function()
  local reply = require("rlm.engine.reply")
  local function xml(prefix, name, code, param)
    return ("<%sfunction_calls>\n<%sinvoke name=\"%s\">\n<%sparameter name=\"%s\">%s</%sparameter>\n"
      .. "</%sinvoke>\n</%sfunction_calls>"):format(prefix, prefix, name, prefix, param or "code", code, prefix,
      prefix, prefix)
  end

  it("run an XML tool call's code (with and without antml:), strictly", function()
    for _, prefix in ipairs({ "", "antml:" }) do
      local r = reply.parse("Let me look.\n" .. xml(prefix, "repl", "\nx = '```'\nprint(x < 'b')\n") .. "\nDone.")
      assert.are.same({ "x = '```'\nprint(x < 'b')" }, r.blocks)
      assert.are.equal("Let me look.\n\nDone.", r.text)
      assert.are.same({}, r.notes)
    end
    local two = reply.parse("<function_calls>\n<invoke name=\"python\">\n<parameter name=\"code\">a = 1</parameter>\n"
      .. "</invoke>\n<invoke name=\"repl\">\n<parameter name=\"code\">b = 2</parameter>\n</invoke>\n</function_calls>")
    assert.are.same({ "a = 1", "b = 2" }, two.blocks)
    for _, bad in ipairs({ xml("", "bash", "ls"), xml("", "repl", "ls", "command"),
      "<function_calls>\n<invoke name=\"repl\">\n<parameter name=\"code\">x = 1</parameter>\n"
        .. "<parameter name=\"timeout\">5</parameter>\n</invoke>\n</function_calls>",
      "<function_calls>\nprint(1)\n</function_calls>" }) do
      local r = reply.parse(bad)
      assert.are.same({}, r.blocks)
      assert.matches("tool call did not run", r.notes[1], 1, true)
    end
    local unclosed = reply.parse("<function_calls>\n<invoke name=\"repl\">")
    assert.are.same({}, unclosed.blocks)
    assert.matches("was never closed", unclosed.notes[1], 1, true)
    -- Inside a fence it is the block's text, not a call.
    assert.are.same({ xml("", "repl", "x = 1") }, reply.parse("```repl\n" .. xml("", "repl", "x = 1") .. "\n```").blocks)
  end)

  it("run a Hermes/Qwen <tool_call>, strictly", function()
    local r = reply.parse('<tool_call>\n{"name": "repl", "arguments": {"code": "print(1)"}}\n</tool_call>')
    assert.are.same({ "print(1)" }, r.blocks)
    local s = reply.parse('<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"y = 2\\"}"}</tool_call>')
    assert.are.same({ "y = 2" }, s.blocks)
    for _, bad in ipairs({ '<tool_call>{"name": "search", "arguments": {"code": "x"}}</tool_call>',
      '<tool_call>{"name": "repl", "arguments": {"code": "x", "lang": "py"}}</tool_call>',
      "<tool_call>not json</tool_call>" }) do
      local b = reply.parse(bad)
      assert.are.same({}, b.blocks)
      assert.matches("tool call did not run", b.notes[1], 1, true)
    end
  end)

  it("read GLM's box and an <answer> element as a FINAL line", function()
    assert.are.same({ { kind = "final", text = "42" } },
      reply.parse("The total is <|begin_of_box|>FINAL(42)<|end_of_box|>").finals)
    assert.are.same({ { kind = "final", text = [["svc-b\x0a\x28the \x22db\x22\x29"]] } },
      reply.parse("<answer>\nsvc-b\n(the \"db\")\n</answer>").finals)
    assert.are.same({ { kind = "var", text = "best" } }, reply.parse("<answer>FINAL_VAR(best)</answer>").finals)
    -- Two answers are ambiguous: neither is taken.
    assert.are.same({}, reply.parse("<answer>a</answer>\n<answer>b</answer>").finals)
  end)

  describe("under run()", function()
    after_each(H.assert_clean)

    it("answer through each form in the turns a fence would take", function()
      local root = H.script({
        xml("antml:", "repl", "rows = [3, 4]"),
        '<tool_call>{"name": "repl", "arguments": {"code": "total = sum(rows)"}}</tool_call>',
        "<|begin_of_box|>FINAL_VAR(total)<|end_of_box|>",
      })
      local result, err = H.run({ root_llm = root })
      assert.is_nil(err)
      assert.are.equal("7", result.answer)
      assert.are.equal(3, result.iterations)
      local answered = H.run({ root_llm = H.script({ "<answer>It is svc-b (from the logs).</answer>" }) })
      assert.are.equal("It is svc-b (from the logs).", answered.answer)
      assert.are.equal("prose", answered.answer_source)
    end)
  end)
end)

-- Issue 28: a block that raised mid-loop lost every answer it had paid for.
describe("a block that raised", function()
  after_each(H.assert_clean)

  local loop = "notes = []\nfor i in range(10):\n    notes.append(llm_query('chunk %d' % i))\n"
    .. "    if i == 6 and not fixed:\n        raise KeyError('parse')\n"

  local function rerun()
    local root = H.script({ fence("fixed = False"), fence(loop), fence("fixed = True\n" .. loop .. "FINAL(len(notes))") })
    return H.run({ root_llm = root })
  end

  it("keeps its llm_query answers for the next try, and names what it rolled back", function()
    local result, err = rerun()
    assert.is_nil(err)
    assert.are.equal("10", result.answer)
    assert.are.equal(7 + 3, result.sub_calls) -- 17 before: the 7 answers asked again
    local e = result.history[2].error
    assert.matches("KeyError: 'parse'", e, 1, true)
    assert.matches("rolled back: notes, i are as before the block", e, 1, true)
    assert.matches("Its 7 llm_query answers are kept", e, 1, true)
  end)

  it("gives each kept answer back once, batched too, and a block that succeeds keeps none", function()
    local root = H.script({
      fence("a = llm_query('p')\nb = llm_query('p')\nraise ValueError('x')"),
      fence("r = llm_query_batched(['p', 'q', 'p'])\nprint(r)"),
      fence("FINAL(llm_query('p'))"),
    })
    local result, err = H.run({ root_llm = root })
    assert.is_nil(err)
    assert.are.equal("['echo: p', 'echo: q', 'echo: p']\n", result.history[2].stdout)
    assert.are.equal(2 + 1 + 1, result.sub_calls) -- the batch asked for 'q' alone
  end)
end)

-- The same cases of issue 28 under an adapter: each its run() case's
-- figure, through rlm.adapters.luv.
H.describe_luv("issue 28's cases under the luv adapter", function()
  after_each(H.assert_clean)
  local run = L.run_session

  it("answer a FINAL_VAR past 2^53, mark a last-chance answer partial, echo, read other forms, keep answers", function()
    local big = run({ root_llm = H.script({ fence("v = [2**62, 2**53 + 1]\nFINAL_VAR('v')") }) })
    assert.are.equal("[4611686018427387904,9007199254740993]", big.answer)
    assert.are.equal(1, big.iterations)
    local last = run({ root_llm = H.script({ fence("x = 1"), "FINAL(42 apples)" }), max_iterations = 1 })
    assert.are.equal("42 apples", last.answer)
    assert.is_true(last.partial)
    local forms, err = run({ root_llm = H.script({
      "<function_calls>\n<invoke name=\"repl\">\n<parameter name=\"code\">rows = [3, 4]\nsum(rows)</parameter>\n"
        .. "</invoke>\n</function_calls>",
      fence("a = llm_query('p')\nraise ValueError('x')"),
      "<|begin_of_box|>FINAL(llm_query('p') + ' ' + str(sum(rows)))<|end_of_box|>",
    }) })
    assert.is_nil(err)
    assert.are.equal("7\n", forms.history[1].stdout)
    assert.are.equal("echo: p 7", forms.answer)
    assert.are.equal(1, forms.sub_calls)
  end)
end)
