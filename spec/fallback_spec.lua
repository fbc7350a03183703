-- The fallback answer: when the turns or the budget run out, one more root
-- call asks for the best answer so far; the result says it is partial.
local H = require("helpers")
local L = require("helpers.luv")
local fence = H.fence

-- A root model that never answers with code, and answers in prose when
-- asked for its best answer.
local function stubborn(best)
  return H.script({ function(messages)
    local last = messages[#messages].content
    if last:match("^The run is over") then
      return best
    end
    return fence("x = 1")
  end })
end

describe("the fallback answer", function()
  after_each(H.assert_clean)

  it("returns a partial answer from a run out of turns", function()
    local evs = {}
    local root = stubborn("Probably the db service, from the first two logs.")
    local result, err = H.run({
      max_iterations = 2,
      root_llm = root,
      on_event = function(ev)
        evs[#evs + 1] = ev
      end,
    })
    assert.is_nil(err)
    assert.is_true(result.partial)
    assert.are.equal("fallback", result.kind)
    assert.are.equal("Probably the db service, from the first two logs.", result.answer)
    assert.are.equal("max_iterations", result.reason.kind)
    assert.are.equal(2, result.iterations)
    local last = root.calls[#root.calls]
    assert.matches("no final answer after max_iterations", last[#last].content, 1, true)
    local final = evs[#evs - 1]
    assert.are.equal("final", final.type)
    assert.is_true(final.partial)
    assert.is_true(evs[#evs].ok) -- run_end
  end)

  it("ends step() with the fallback answer's entry, not the last turn's", function()
    local s = H.session({ max_iterations = 2, root_llm = stubborn("Probably the db service.") })
    local entries = {}
    for _ = 1, 3 do
      local entry, err = s:step()
      assert.is_nil(err)
      entries[#entries + 1] = entry
      if entry.final then
        break
      end
    end
    local _, again = s:step()
    s:close()
    assert.are.equal("max_iterations", again.kind)
    local last = entries[#entries]
    assert.are.equal("fallback", last.final.kind)
    assert.are.equal("Probably the db service.", last.final.answer)
    assert.is_true(last.final.partial)
    assert.are.equal("max_iterations", last.final.reason.kind)
    assert.are.equal("Probably the db service.", last.response)
    assert.is_nil(entries[1].final)
    assert.are.equal(3, #entries)
  end)

  it("returns max_iterations as before with fallback = false", function()
    local root = stubborn("never asked")
    local result, err = H.run({ max_iterations = 2, fallback = false, root_llm = root })
    assert.is_nil(result)
    assert.are.equal("max_iterations", err.kind)
    for _, call in ipairs(root.calls) do
      assert.not_matches("^The run is over", call[#call].content)
    end
  end)

  it("returns a partial answer when the sub-call budget runs out", function()
    local root = H.script({ function(messages)
      if messages[#messages].content:match("^The run is over") then
        return "FINAL('best guess: 3')"
      end
      return fence("for i in range(5):\n    llm_query('q')")
    end })
    local result, err = H.run({ max_sub_calls = 2, root_llm = root })
    assert.is_nil(err)
    assert.is_true(result.partial)
    assert.are.equal("best guess: 3", result.answer) -- the FINAL(...) around it goes
    assert.are.equal("sub_call_budget", result.reason.kind)
  end)

  it("returns a partial answer when max_total_tokens runs out, past the sandbox's end", function()
    local result, err = H.run({
      max_total_tokens = 10,
      root_llm = function(messages)
        if messages[#messages].content:match("^The run is over") then
          return "what I have", { input_tokens = 1, output_tokens = 1 }
        end
        return fence("x = 1"), { input_tokens = 8, output_tokens = 8 }
      end,
    })
    assert.is_nil(err)
    assert.is_true(result.partial)
    assert.are.equal("cost_budget", result.reason.kind)
    assert.are.equal(18, result.tokens.total)
  end)

  it("returns the run's error when the fallback call fails", function()
    local result, err = H.run({
      max_iterations = 1,
      root_llm = function(messages)
        if messages[#messages].content:match("^The run is over") then
          error("the endpoint is down")
        end
        return fence("x = 1")
      end,
    })
    assert.is_nil(result)
    assert.are.equal("max_iterations", err.kind)
  end)

  it("checks a fallback answer against answer_schema; a refused one keeps the error", function()
    local result, err = H.run({
      max_iterations = 1,
      answer_schema = { type = "integer" },
      root_llm = stubborn("about twelve"),
    })
    assert.is_nil(result)
    assert.are.equal("max_iterations", err.kind)
    assert.are.equal("about twelve", err.partial_answer)
    result, err = H.run({
      max_iterations = 1,
      answer_schema = { type = "integer" },
      root_llm = stubborn("12"),
    })
    assert.is_nil(err)
    assert.are.equal(12, result.value)
    assert.is_true(result.partial)
  end)

  it("does not replace a step timeout or a protocol error", function()
    -- Code that swallows the interrupt is killed after the grace.
    local result, err = H.run({
      step_timeout_ms = 300,
      sandbox = { interrupt_grace_ms = 300 },
      root_llm = H.script({ fence("while True:\n    try:\n        while True:\n            pass\n"
        .. "    except:\n        print('caught, going on')") }),
    })
    assert.is_nil(result)
    assert.are.equal("step_timeout", err.kind)
  end)
end)

H.describe_luv("the fallback answer under the luv adapter", function()
  local luv = require("rlm.adapters.luv")
  after_each(H.assert_clean)

  it("takes the fallback answer later, through done(), after the budget closed the sandbox", function()
    local out
    luv.run(H.opts({
      max_sub_calls = 1,
      root_llm = function(messages, done)
        local best = messages[#messages].content:match("^The run is over")
        L.after(10, function()
          done(best and "partial, later" or fence("llm_query('a')\nllm_query('b')"))
        end)
      end,
    }), function(e, r)
      out = { err = e, result = r }
    end)
    L.run_until(function()
      return out ~= nil
    end)
    assert.is_nil(out.err)
    assert.is_true(out.result.partial)
    assert.are.equal("partial, later", out.result.answer)
  end)
end)
