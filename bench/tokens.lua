-- Figure 12, what the root model reads (issue 30): over one run of a fixed
-- scripted task, the root model's input as sent, the system prompt and the
-- history of every root call, summed over the calls, in bytes and in words
-- (runs of characters that are not white space: a measure without a
-- tokenizer); beside it our system prompt alone and the reference
-- implementation's (alexzhang13/rlm) counted the same way, so that the
-- growth of either shows.
--
-- The task: 600 support tickets (a list of dicts, made without
-- math.random, so that every Lua makes the same) and the question which
-- product has the most tickets asking for a refund. The scripted root model
-- takes 5 turns: look at the data, filter with code, have the sub-model
-- read the hits in batches of 50 (llm_query_batched), count, FINAL. The
-- sub-model is a stand-in that reads each line as a careful model would.
-- The counts depend only on the prompts, the task and the REPL's output,
-- so a run is one sample.
local common = require("bench.common")
local rlm = require("rlm")

local M = {}

-- The reference implementation's default system prompt, as its
-- build_rlm_system_prompt sends it with no custom tools and orchestrator
-- left at its default (true): RLM_SYSTEM_PROMPT, then "\n\n" and
-- ORCHESTRATOR_ADDENDUM. Counted once with common.words() from
-- rlm/utils/prompts.py at the commit named (the text is not kept here).
-- RLM_SYSTEM_PROMPT_OLD is the longer prompt that file keeps, marked
-- deprecated.
local REFERENCE = {
  repo = "alexzhang13/rlm", path = "rlm/utils/prompts.py",
  commit = "72d6940142ddfb84ee6be573dc999a37e633e671", date = "2026-06-25",
  bytes = 5384, words = 855, old_bytes = 10249, old_words = 1616,
}

local PRODUCTS = { "router X2", "thermostat T1", "camera C4", "doorbell D3", "speaker S9" }
local TEMPLATES = {
  "The %s stopped working after a week. I want a refund.",
  "How do I reset the %s to factory settings?",
  "My %s arrived damaged; please send a replacement, no refund needed.",
  "Requesting a refund for the %s: it was charged twice.",
  "The app does not find the %s on my network.",
  "Is there a firmware update for the %s?",
  "Refund policy question: can I return the %s after 30 days?",
}
local TICKETS = 600

-- The tickets, from a small linear congruential sequence (exact in a
-- double, so LuaJIT and 5.1 make the same list as 5.4).
local function tickets()
  local out, x = {}, 2
  for i = 1, TICKETS do
    x = (x * 75 + 74) % 65537
    local product = PRODUCTS[x % #PRODUCTS + 1]
    local template = TEMPLATES[math.floor(x / 7) % #TEMPLATES + 1]
    out[i] = { id = i, product = product, text = template:format(product) }
  end
  return out
end

local function asks_refund(text)
  return text:find("I want a refund", 1, true) ~= nil or text:find("Requesting a refund", 1, true) ~= nil
end

-- What the task's answer must be: checked, so that the run is the one
-- scripted.
local function expected(list)
  local counts = {}
  for _, t in ipairs(list) do
    if asks_refund(t.text) then
      counts[t.product] = (counts[t.product] or 0) + 1
    end
  end
  local best, n = nil, -1
  for _, product in ipairs(PRODUCTS) do
    if (counts[product] or 0) > n then
      best, n = product, counts[product] or 0
    end
  end
  return ("%s: %d tickets ask for a refund"):format(best, n)
end

local QUESTION = "Which product has the most support tickets asking for a refund, and how many are there?"

local TURNS = {
  "Let me see what the context holds.\n```repl\nprint(type(context).__name__, len(context))\n"
    .. "print(context[0])\nprint(sorted(context[0].keys()))\n```",
  "Tickets with a product and a text. First, the ones that mention a refund at all.\n```repl\n"
    .. "hits = [t for t in context if 'refund' in t['text'].lower()]\n"
    .. "print(len(hits), 'of', len(context), 'mention a refund')\nfor t in hits[:3]:\n    print(t)\n```",
  "Some mention a refund without asking for one. A sub-model reads them in batches of 50.\n```repl\n"
    .. "batches = [hits[i:i + 50] for i in range(0, len(hits), 50)]\n"
    .. "prompts = ['For each ticket below, say whether it asks for a refund, one line each as id=YES or id=NO.\\n\\n'\n"
    .. "           + '\\n'.join('%d: %s' % (t['id'], t['text']) for t in b) for b in batches]\n"
    .. "asks = set()\nfor reply in llm_query_batched(prompts):\n    for line in reply.splitlines():\n"
    .. "        key, _, verdict = line.partition('=')\n        if verdict.strip() == 'YES':\n"
    .. "            asks.add(int(key))\nprint(len(batches), 'batches;', len(asks), 'tickets ask for a refund')\n```",
  "Now count them by product.\n```repl\nimport collections\n"
    .. "counts = collections.Counter(t['product'] for t in hits if t['id'] in asks)\n"
    .. "print(counts.most_common(3))\n```",
  "The count is clear.\n```repl\nproduct, n = counts.most_common(1)[0]\n"
    .. "FINAL(f'{product}: {n} tickets ask for a refund')\n```",
}

-- The sub-model: YES for each "id: text" line that asks for a refund.
local function sub_model(prompt)
  local out = {}
  for id, text in prompt:gmatch("\n(%d+): ([^\n]*)") do
    out[#out + 1] = id .. "=" .. (asks_refund(text) and "YES" or "NO")
  end
  return table.concat(out, "\n")
end

local function counted(bytes, n)
  return ("%d bytes, %d words"):format(bytes, n)
end

function M.run(env)
  local list = tickets()
  local sent = { calls = 0, bytes = 0, words = 0, per_call = {} }
  local system
  local opts = common.session_opts(env, {
    context = list,
    query = QUESTION,
    max_iterations = #TURNS + 1,
    llm_query = sub_model,
    root_llm = function(messages)
      system = system or messages[1].content
      local bytes = common.count_sent(sent, messages)
      sent.per_call[#sent.per_call + 1] = bytes
      return TURNS[math.min(sent.calls, #TURNS)]
    end,
  })
  local s = rlm.Session.new(opts)
  local result, err = s:run()
  s:close()
  assert(result, "the scripted task failed: " .. tostring(err))
  local want = expected(list)
  assert(result.answer == want, ("the scripted task answered %q, not %q"):format(result.answer, want))
  assert(sent.calls == #TURNS, ("%d root calls, not %d"):format(sent.calls, #TURNS))

  local ours_bytes, ours_words = #system, common.words(system)
  local ref = REFERENCE
  local history_bytes = sent.bytes - sent.calls * ours_bytes
  return {
    common.context_row("12", ("root-model input per run, scripted task (%d root calls): system prompt + history as "
      .. "sent, summed over the calls"):format(sent.calls), sent.bytes, "bytes", counted(sent.bytes, sent.words), 1,
      ("bench/tokens.lua's task (600 tickets, which product has the most refund requests); per call %s bytes; the "
        .. "system prompt is %d of it (%d calls x %d), the history %d; deterministic: one run is the figure")
        :format(table.concat(sent.per_call, ", "), sent.calls * ours_bytes, sent.calls, ours_bytes, history_bytes)),
    common.context_row("12", "  our system prompt alone (as sent for this task)", ours_bytes, "bytes",
      counted(ours_bytes, ours_words), 1, ("%.2fx the reference's in bytes, %.2fx in words")
        :format(ours_bytes / ref.bytes, ours_words / ref.words)),
    common.context_row("12", "  the reference implementation's system prompt (alexzhang13/rlm)", ref.bytes, "bytes",
      counted(ref.bytes, ref.words), 1, ("counted the same way from %s at commit %s (%s), not at run time: "
        .. "RLM_SYSTEM_PROMPT without custom tools + ORCHESTRATOR_ADDENDUM, as its build_rlm_system_prompt sends "
        .. "it by default; x %d calls = %d bytes; its deprecated RLM_SYSTEM_PROMPT_OLD: %s")
        :format(ref.path, ref.commit:sub(1, 12), ref.date, sent.calls, sent.calls * ref.bytes,
          counted(ref.old_bytes, ref.old_words))),
  }
end

return M
