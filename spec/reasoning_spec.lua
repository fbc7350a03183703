-- Issue 38: replies as 2025-2026 models write them (vLLM's reasoning
-- parsers, Qwen3, DeepSeek-R1 and its distills, gpt-oss's Harmony, Gemma 4,
-- the reference's parsing.py) never end in a wrong answer without an
-- error: reasoning never runs and is never an answer, a prose FINAL is
-- text unless it is code, and two finals that differ are neither taken.
-- The stand-in root models write those replies; the REPL is real.
local H = require("helpers")
local L = require("helpers.luv")
local fence = H.fence

-- The last message the root model was sent before its call n.
local function told(root, n)
  local m = root.calls[n]
  return m[#m].content
end

local DRAFT = "```repl\nprint('DRAFT RAN')\nFINAL('3')\n```"

-- name, the replies, the answer, the turns, what the model was told after
-- its first turn (when it took more than one).
local CASES = {
  { "Qwen3: a draft block inside <think> does not run; the block after </think> does",
    { "<think>\nLet me try:\n" .. DRAFT .. "\nNo, that misses one: it is 4.\n</think>\n\n" .. fence("FINAL('4')") },
    "4", 1 },
  { "DeepSeek-R1: a tentative prose FINAL inside <think> is not the answer",
    { "<think>\nMaybe:\nFINAL(41)\nHmm, the REPL said 42.\n</think>\nFINAL(42)" }, "42", 1 },
  { "an R1 distill: everything before a lone </think> (its template opened the tag) is reasoning",
    { "Okay, so the total...\n" .. DRAFT .. "\nWait, no.\n</think>\n\nFINAL(4)" }, "4", 1 },
  { "gpt-oss: Harmony's analysis channel does not run; its final channel is the reply",
    { "<|channel|>analysis<|message|>Let me run:\n" .. DRAFT .. "<|end|><|start|>assistant<|channel|>final"
      .. "<|message|>FINAL(4)<|return|>" }, "4", 1 },
  { "gpt-oss: Harmony's final channel alone is the reply",
    { "<|start|>assistant<|channel|>final<|message|>FINAL(42)<|return|>" }, "42", 1 },
  { "gpt-oss served with its special tokens skipped (analysis...assistantfinal...)",
    { "analysisWe could say FINAL(3).assistantfinalFINAL(4)" }, "4", 1 },
  { "Gemma 4: the thought channel is reasoning", { "<|channel>thought\n" .. DRAFT .. "\n<channel|>FINAL(4)" }, "4", 1 },
  { "a reply that is only reasoning is a turn, and the model is told so",
    { "<think>\n" .. DRAFT .. "\n</think>", "FINAL(4)" }, "4", 2, "held only reasoning" },
  { "Harmony's analysis channel alone is a turn too",
    { "<|channel|>analysis<|message|>" .. DRAFT .. "<|end|>", "FINAL(4)" }, "4", 2, "held only reasoning" },
  { "an empty reply is a turn, and the model is told so", { "", "FINAL(4)" }, "4", 2, "Your response was empty" },
  -- Prose finals: the model's text, as the reference reads it.
  { "a date is text", { "FINAL(2024-12-25)" }, "2024-12-25", 1 },
  { "a score is text", { "FINAL(3-1)" }, "3-1", 1 },
  { "a power is text", { "FINAL(2^10)" }, "2^10", 1 },
  { "a word is text (the paper's FINAL(Paris))", { "FINAL(Paris)" }, "Paris", 1 },
  { "ok is text", { "FINAL(ok)" }, "ok", 1 },
  { "a module's name is text", { fence("import json\nprint(json.dumps([1]))"), "FINAL(json)" }, "json", 2 },
  { "a function's name is text", { fence("def helper():\n    return 1"), "FINAL(helper)" }, "helper", 2 },
  { "a call of something the REPL does not have is text", { "FINAL(O(n))" }, "O(n)", 1 },
  { "a str literal is its value", { 'FINAL("Paris")' }, "Paris", 1 },
  { "an expression of the model's variables is evaluated",
    { fence("total = 41\nrows = [1, 2, 3]"), "FINAL(total + 1)" }, "42", 2 },
  { "a call of a builtin on the model's data is evaluated", { fence("rows = [1, 2, 3]"), "FINAL(len(rows))" }, "3", 2 },
  { "an f-string of the model's data is evaluated", { fence("n = 3"), 'FINAL(f"{n} items")' }, "3 items", 2 },
  { "llm_query's answer is evaluated", { "FINAL(llm_query('hi'))" }, "echo: hi", 1 },
  { "a name only a rolled-back block bound is a NameError, not its name as the answer",
    { fence("result = 42\nraise ValueError('late')"), "FINAL(result)", "FINAL(\"ok\")" }, "ok", 3 },
  -- Two finals in one reply.
  { "two final lines that differ: neither is taken, and the model is told which two",
    { "FINAL(41)\nWait, the REPL printed 42.\nFINAL(42)", "FINAL(42)" }, "42", 2,
    "two different final lines, FINAL(41) and FINAL(42)" },
  { "a FINAL and a FINAL_VAR: neither", { fence("x = 1"), "FINAL(1)\nFINAL_VAR(x)", "FINAL(2)" }, "2", 3 },
  { "the same final twice is that final", { "FINAL(42)\nTo repeat:\nFINAL( 42 )" }, "42", 1 },
  -- Beside code.
  { "FINAL_VAR beside code that ran without an error is taken (the code's value)",
    { fence("found = 'svc-b'") .. "\nFINAL_VAR(found)" }, "svc-b", 1 },
  { "a FINAL of a str literal beside code is a guess too",
    { fence("print('svc-b failed')") .. '\nFINAL("svc-a")', "FINAL(svc-b)" }, "svc-b", 2,
    "you wrote it before you saw what your code printed" },
  { "a FINAL of code beside code that ran without an error is taken", { fence("n = 6 * 7") .. "\nFINAL(n)" },
    "42", 1 },
  { "a FINAL of text beside code is a guess: not taken",
    { fence("print('svc-b failed')") .. "\nFINAL(svc-a)", "FINAL(svc-b)" }, "svc-b", 2,
    "you wrote it before you saw what your code printed" },
  { "FINAL_VAR beside a block that raised is not taken",
    { fence("found = 'svc-a'\nraise KeyError('k')") .. "\nFINAL_VAR(found)", "FINAL(svc-b)" }, "svc-b", 2,
    "because a block raised" },
  { "a FINAL in a code block stays code", { fence("FINAL(2024-12-25)") }, "1987", 1 },
}

local function check(case, result, err, root)
  assert.is_nil(err, err and err.message)
  assert.are.equal(case[3], result.answer)
  assert.are.equal(case[4], result.iterations)
  for _, entry in ipairs(result.history) do
    assert.not_matches("DRAFT RAN", entry.stdout or "", 1, true)
  end
  if case[5] then
    assert.matches(case[5], told(root, 2), 1, true)
  end
end

describe("issue 38's replies under run()", function()
  after_each(H.assert_clean)

  for _, case in ipairs(CASES) do
    it(case[1], function()
      local root = H.script(case[2])
      local result, err = H.run({ root_llm = root })
      check(case, result, err, root)
    end)
  end

  it("a raised final of code is an error the model sees; NameError of a rolled-back name says so", function()
    local root = H.script({ fence("result = 42\nraise ValueError('late')"), "FINAL(result)", "FINAL(\"ok\")" })
    H.run({ root_llm = root })
    assert.matches("NameError: name 'result' is not defined", told(root, 3), 1, true)
    assert.matches("Your FINAL line did not give an answer: it is code", told(root, 3), 1, true)
  end)

  it("keeps the reasoning in the history and the log, and sends the reply back without it", function()
    local evs = {}
    local root = H.script({ "<think>the draft " .. DRAFT .. "</think>\n" .. fence("x = 4"), "FINAL_VAR(x)" })
    local result = H.run({ root_llm = root, on_event = function(ev)
      evs[#evs + 1] = ev
    end })
    assert.are.equal("4", result.answer)
    assert.matches("the draft", result.history[1].reasoning, 1, true)
    assert.matches("the draft", H.events_of(evs, "root_response")[1].response, 1, true)
    local sent = root.calls[2][#root.calls[2] - 1]
    assert.are.equal("assistant", sent.role)
    assert.not_matches("the draft", sent.content, 1, true)
    assert.matches("x = 4", sent.content, 1, true)
  end)

  it("reads a reply of 20,000 fenced blocks that hold <think> in linear time", function()
    local core = require("rlm.core")
    local text = ("```repl\ns = '<think>'\n```\n"):rep(20000) .. "</think> in prose"
    local t0 = core.now_ms()
    local parsed = require("rlm.engine.reply").parse(text)
    -- A scan from the start for each tag would read 6 GB here (0.3 s on
    -- an idle core for the linear walk).
    assert.is_true(core.now_ms() - t0 < 10000, "took " .. (core.now_ms() - t0) .. " ms")
    assert.are.equal(20000, #parsed.blocks)
    assert.is_nil(parsed.reasoning)
  end)

  it("gives no answer at the last chance from two finals that differ, nor from reasoning", function()
    local root = H.script({ fence("print('42?')"), "FINAL(41)\nor rather\nFINAL(42)" })
    local result, err = H.run({ root_llm = root, max_iterations = 1, fallback = false })
    assert.is_nil(result)
    assert.are.equal("max_iterations", err.kind)
    root = H.script({ fence("print('42?')"), "<think>It is FINAL(41)</think>" })
    result, err = H.run({ root_llm = root, max_iterations = 1, fallback = false })
    assert.is_nil(result)
    assert.are.equal("42?", err.partial)
  end)
end)

-- An OpenAI-compatible server's reply whose content is empty while the
-- reasoning holds the text: a turn, never code run from the reasoning.
describe("issue 38 through rlm.llm.openai", function()
  local F = require("helpers.fake_openai")
  local cjson = require("cjson")
  local srv

  setup(function()
    srv = F.start()
  end)

  teardown(function()
    srv:stop()
  end)

  it("takes a reply of reasoning_content (or reasoning) and no content as an empty turn", function()
    for _, field in ipairs({ "reasoning_content", "reasoning" }) do
      local message = { role = "assistant", content = cjson.null }
      message[field] = "Let me run:\n" .. DRAFT
      srv:script({ { json = { choices = { { index = 0, message = message, finish_reason = "length" } } } },
        { content = "FINAL(4)" } })
      local c = require("rlm.llm.openai").new({ base_url = srv.url, model = "fake-root",
        api_key_env = "RLM_SPEC_SECRET", timeout_ms = 10000 })
      local result, err = H.run({ root_llm = c.root_llm })
      assert.is_nil(err, err and err.message)
      assert.are.equal("4", result.answer)
      assert.are.equal(2, result.iterations)
      assert.not_matches("DRAFT RAN", result.history[1].stdout, 1, true)
      local reqs = srv:requests()
      local last = reqs[2].json.messages
      assert.matches("Your response was empty", last[#last].content, 1, true)
    end
    assert.are.same({ srv.pid }, H.settled_children(1))
    assert.are.same({}, H.workdirs())
  end)
end)

H.describe_luv("issue 38's replies under the luv adapter", function()
  after_each(H.assert_clean)

  local picked = { "^Qwen3", "^an R1 distill", "^gpt%-oss: Harmony's analysis", "^a reply that is only reasoning",
    "^a date", "^a word", "^an expression of", "^two final lines", "^FINAL_VAR beside code that ran",
    "^a FINAL in a code block" }
  local cases = {}
  for _, case in ipairs(CASES) do
    for _, p in ipairs(picked) do
      if case[1]:find(p) then
        cases[#cases + 1] = case
      end
    end
  end
  assert(#cases == #picked)
  for _, case in ipairs(cases) do
    it(case[1], function()
      local root = H.script(case[2])
      local result, err = L.run_session({ root_llm = root })
      check(case, result, err, root)
    end)
  end
end)
