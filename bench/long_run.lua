-- Figure 16, a long run (issue 29): one scripted task of 30 root turns,
-- run four ways. What the root model is sent, summed over the run's root
-- calls (the contents of every message, in bytes and in words as
-- bench/tokens.lua counts them), with option compact (a digest, and the
-- root model's summary) beside the same run without it, the floor; and
-- the sub-calls paid for the task's repeated prompts with
-- sub_call_cache = true beside the same run without it.
--
-- The task: 40 documents (made without math.random, the same on every
-- Lua); at each turn the scripted root model looks at one document
-- (printing 600 characters of it) and has the sub-model read 8 of them
-- side by side (llm_query_batched), a window that moves 3 documents a turn,
-- so most prompts were asked before; it keeps the notes in a variable of
-- the turn, and the last turn answers from the variables of turns 1, 2
-- and 5. The counts depend only on the prompts and the REPL's output, so a
-- run is one sample.
local common = require("bench.common")
local rlm = require("rlm")

local M = {}

local DOCS = 40
local WINDOW = 8

local function documents()
  return common.documents(DOCS, 120, 7)
end

-- Turn t's code (t from 1): look, read a window of documents, keep notes.
local function turn(t, turns)
  if t > turns then
    return "The notes of the first turns answer it.\n```repl\n"
      .. "FINAL(str(len(notes_1) + len(notes_2) + len(notes_5)) + ' notes; ' + notes_1[0][:40])\n```"
  end
  local first = (3 * (t - 1)) % DOCS
  return ("Turn %d: document %d, then the sub-model reads documents %d to %d.\n```repl\n"
    .. "print(context[%d][:600])\n"
    .. "ids = [(%d + k) %% %d for k in range(%d)]\n"
    .. "notes_%d = llm_query_batched(['Summarize this document in one line.\\n\\n' + context[i] for i in ids])\n"
    .. "for i, n in zip(ids, notes_%d):\n    print(i, n[:90])\n```"):format(t, t % DOCS, first,
      first + WINDOW - 1, t % DOCS, first, DOCS, WINDOW, t, t)
end

-- The sub-model: the document's number and its first words.
local function sub_model(prompt)
  local n, rest = prompt:match("Document (%d+)%. ([^\n]*)")
  return ("Document %s is about %s"):format(n or "?", (rest or ""):sub(1, 80))
end

-- One run of the task: what the root model was sent, the sub-calls paid,
-- and the result.
local function run(env, turns, extra)
  local sent = { calls = 0, bytes = 0, words = 0, most = 0 }
  local paid = 0
  local turn_no = 0
  local opts = common.session_opts(env, {
    context = documents(),
    query = "Which topics do the documents cover, and how many notes did the first turns keep?",
    max_iterations = turns + 2,
    max_sub_calls = 1000,
    llm_query = function(p)
      paid = paid + 1
      return sub_model(p)
    end,
    root_llm = function(messages)
      local bytes = common.count_sent(sent, messages)
      sent.most = math.max(sent.most, bytes)
      if messages[#messages].content:find("will now be replaced by a summary that you write", 1, true) then
        return ("Summary so far: turns 1 to %d each read a window of documents with llm_query_batched and "
          .. "kept the answers in notes_<turn>; the documents mix invoices, refunds, outages and audits. "
          .. "Left: answer from notes_1, notes_2 and notes_5."):format(turn_no)
      end
      turn_no = turn_no + 1
      return turn(turn_no, turns)
    end,
  })
  for k, v in pairs(extra or {}) do
    opts[k] = v
  end
  local s = rlm.Session.new(opts)
  local result, err = s:run()
  s:close()
  assert(result, "the scripted task failed: " .. tostring(err))
  local want = "24 notes; " .. sub_model("Document " .. documents()[1]:match("^Document (.*)")):sub(1, 40)
  assert(result.answer == want, ("the scripted task answered %q, not %q"):format(tostring(result.answer), want))
  assert(turn_no == turns + 1, ("%d turns, not %d"):format(turn_no, turns + 1))
  return sent, paid, result
end

local function counted(sent)
  return ("%d bytes, %d words"):format(sent.bytes, sent.words)
end

local function ratio_row(figure, name, sent, floor_name, floor, note)
  return {
    figure = figure, name = name, unit = "bytes", value = sent.bytes, n = 1, text = counted(sent), note = note,
    floor = { name = floor_name, value = floor.bytes, n = 1, text = counted(floor) },
    ratio = sent.bytes / floor.bytes, ratio_text = ("%.2fx"):format(sent.bytes / floor.bytes),
  }
end

function M.run(env)
  local size = common.sizes(env, {
    full = { turns = 30, at_tokens = 8000, keep_turns = 4 },
    tiny = { turns = 8, at_tokens = 3000, keep_turns = 2 },
  })
  local turns = size.turns
  local compact = { at_tokens = size.at_tokens, keep_turns = size.keep_turns }
  local plain, plain_paid = run(env, turns)
  local digest, _, digest_result = run(env, turns, { compact = compact })
  local model, _, model_result = run(env, turns, { compact = { at_tokens = compact.at_tokens,
    keep_turns = compact.keep_turns, summary = "model" } })
  local _, cached_paid, cached_result = run(env, turns, { sub_call_cache = true })
  -- The least any cache pays: the distinct prompts the task asks.
  local distinct = math.min(DOCS, 3 * (turns - 1) + WINDOW)
  local bound = compact.at_tokens * 4
  return {
    ratio_row("16", ("root input sent over a %d-turn run, compact = { at_tokens = %d, keep_turns = %d } (a digest)")
      :format(turns, compact.at_tokens, compact.keep_turns), digest, "the same run without compaction", plain,
      ("%d root calls, %d compactions; the largest call %d bytes (%.0f tokens at 4 bytes a token, the bound %d), "
        .. "without compaction %d bytes; deterministic: one run is the figure")
        :format(digest.calls, digest_result.compactions, digest.most, digest.most / 4, compact.at_tokens,
          plain.most)),
    ratio_row("16", "  the same with summary = \"model\" (the root model's summary, its calls counted)", model,
      "the same run without compaction", plain,
      ("%d root calls (%d of them summaries), %d compactions; the largest call %d bytes (bound %d bytes); the "
        .. "summaries' input is in the figure"):format(model.calls, model.calls - (turns + 1),
        model_result.compactions, model.most, bound)),
    {
      figure = "16", name = ("sub-calls paid over the same %d-turn run (%d llm_query_batched prompts), "
        .. "sub_call_cache = true"):format(turns, turns * WINDOW), unit = "calls", value = cached_paid, n = 1,
      text = ("%d paid, %d cache hits"):format(cached_paid, cached_result.cache_hits),
      floor = { name = "the same run without the cache", value = plain_paid, n = 1,
        text = ("%d paid"):format(plain_paid) },
      ratio = cached_paid / plain_paid, ratio_text = ("%.2fx"):format(cached_paid / plain_paid),
      note = ("%d distinct prompts (the least any cache pays); result.sub_calls %d; deterministic")
        :format(distinct, cached_result.sub_calls),
    },
  }
end

return M
