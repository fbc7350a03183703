-- Issue 28: what real models write, out of notebooks and other model
-- families' formats, gets help or runs, instead of costing turns.
local H = require("helpers")
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
    assert.matches("allowed_modules = {\"numpy\"}", result.history[2].error, 1, true)
    assert.matches("sys.path (its standard library and site-packages)", result.history[2].error, 1, true)
    assert.matches("llm_query_batched", result.history[3].error, 1, true)
  end)

  it("say that an allowed module the sandbox's Python does not have is not installed", function()
    local root = H.script({ fence("import rlm_no_such_module"), fence("FINAL('done')") })
    local result = H.run({ root_llm = root, allowed_modules = { "rlm_no_such_module" } })
    assert.matches("ModuleNotFoundError: No module named 'rlm_no_such_module': the host allows it "
      .. "(allowed_modules), but the sandbox's Python does not have it", result.history[1].error, 1, true)
  end)
end)
