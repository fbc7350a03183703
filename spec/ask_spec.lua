-- session:ask(question): a follow-up in the same REPL after run().
local H = require("helpers")
local fence = H.fence

describe("session:ask", function()
  after_each(H.assert_clean)

  it("keeps the REPL's variables and context, and opens with a summary of the last run", function()
    local root = H.script({
      fence("words = context.split()\nFINAL(len(words))"),
      fence("FINAL(words[-1] + '/' + context[:5])"),
    })
    local s = H.session({ context = "hello big world", query = "How many words?", root_llm = root })
    local first = assert(s:run())
    assert.are.equal("3", first.answer)
    local second = assert(s:ask("What is the last word?"))
    s:close()
    assert.are.equal("world/hello", second.answer)
    local opening = root.calls[2]
    assert.are.equal(2, #opening) -- a new conversation: system, then the summary and question
    assert.are.equal("system", opening[1].role)
    assert.matches("Asked: How many words%?", opening[2].content)
    assert.matches("you answered: 3", opening[2].content)
    assert.matches("Question: What is the last word%?", opening[2].content)
    assert.are.equal(2, second.iterations) -- the counters carry on
    assert.are.equal(2, #second.history)
  end)

  it("carries the sub-call budget across questions", function()
    local s = H.session({
      max_sub_calls = 3,
      fallback = false,
      root_llm = H.script({ fence("llm_query('a')\nllm_query('b')\nFINAL('x')"),
        fence("llm_query('c')\nllm_query('d')\nFINAL('y')") }),
    })
    assert(s:run())
    local result, err = s:ask("again?")
    s:close()
    assert.is_nil(result)
    assert.are.equal("sub_call_budget", err.kind)
  end)

  it("counts max_iterations per question", function()
    local s = H.session({ max_iterations = 2,
      root_llm = H.script({ fence("x = 1"), fence("FINAL('one')"), fence("x = 2"), fence("FINAL('two')") }) })
    assert.are.equal("one", assert(s:run()).answer)
    assert.are.equal("two", assert(s:ask("and now?")).answer)
    s:close()
  end)

  it("raises when there was no answer to follow", function()
    local s = H.session({})
    assert.has_error(function()
      s:ask("too soon")
    end, "rlm: ask() follows a run that gave its answer (run() first)")
    assert.has_error(function()
      s:ask(42)
    end, "rlm: ask(question) takes a non-empty string")
    s:close()
  end)
end)
