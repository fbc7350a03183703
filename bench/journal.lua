-- Figure 18, the journal's size per step (issue 41, docs/durability.md):
-- one scripted task of 20 root turns with sub-calls, its records made as
-- a session will write them (rlm.journal's layout: a step's entry with the
-- messages it added and the answers its code received, the head rewritten
-- at each step boundary, an entry per answer while the step is in flight)
-- and written to a file store in the scratch directory. The records are
-- built here from what the run's callbacks see, since the engine does not
-- write a journal yet; the bytes are the format's. Beside each figure its
-- floor: the bytes of what the record carries (the messages' contents and
-- the answers' texts), so that the ratio is the format's overhead.
--
-- The task: 20 documents (made without math.random, the same on every
-- Lua); at each turn the scripted root model prints 600 characters of one
-- document and has the sub-model summarize 3 (llm_query, one at a time),
-- printing the notes; the 20th answers. The bytes depend only on the
-- prompts and the REPL's output, so a run is one sample.
local common = require("bench.common")
local core = require("rlm.core")
local journal = require("rlm.journal")
local rlm = require("rlm")

local M = {}

local TURNS = 20
local DOCS = 20

local function documents()
  return common.documents(DOCS, 150, 11)
end

local function turn(t)
  if t >= TURNS then
    return "The notes answer it.\n```repl\nFINAL(str(len(notes)) + ' notes; ' + notes[0][:40])\n```"
  end
  return ("Turn %d: document %d, then the sub-model summarizes three.\n```repl\n"
    .. "print(context[%d][:600])\n"
    .. "notes = [llm_query('Summarize this document in two sentences.\\n\\n' + context[(%d + k) %% %d]) "
    .. "for k in range(3)]\nfor n in notes:\n    print(n)\n```"):format(t, t % DOCS, t % DOCS, t, DOCS)
end

local function sub_model(prompt)
  local n, rest = prompt:match("Document (%d+)%. ([^\n]*)")
  return ("Document %s is mostly about %s. It mentions %s and asks for nothing else."):format(n or "?",
    (rest or ""):sub(1, 60), (rest or ""):sub(61, 120))
end

local function kb(bytes)
  return ("%.1f KB"):format(bytes / 1024)
end

function M.run(env)
  local docs = documents()
  local dir = env.scratch .. "/journal-figure"
  local s = assert(journal.file(dir))
  local id = "bench18"
  local lease = assert(journal.lease(s, id, "bench"))
  local seq, step, calls, seen = 0, 0, {}, 0
  local sizes, payloads, written, write_ms = {}, {}, {}, {}
  local head_bytes, payload = 0, 0
  local created = os.time()

  local function write(key, kind, t)
    seq = seq + 1
    t.seq = seq
    local text = journal.encode(kind, t)
    local t0 = core.now_ms()
    assert(lease:write(key, text))
    write_ms[#write_ms + 1] = core.now_ms() - t0
    written[step] = (written[step] or 0) + #text
    return #text
  end

  -- The end of step n: its entry, the head, and its answers' entries go.
  local function step_done(messages)
    local added = {}
    for i = seen + 1, #messages do
      added[#added + 1] = { role = messages[i].role, content = messages[i].content }
      payload = payload + #messages[i].content
    end
    seen = #messages
    local bytes = write(journal.step_key(id, step), "step", { n = step, messages = added, calls = calls })
    sizes[#sizes + 1], payloads[#payloads + 1] = bytes, payload
    head_bytes = write(journal.head_key(id), "head", { id = id, steps = step, created = created,
      updated = os.time(), counts = { iterations = step, sub_calls = 3 * step, tokens = { input = 0, output = 0,
        total = 0 } }, seeds = { hash = 2718281828, random = 3141592653 },
      -- a keeper that lingers (the exec backend with linger_ms): the most a
      -- head holds
      sandbox = { backend = "exec", id = id .. "-1", token = ("0"):rep(32), fence = 1, seen = 4 * step,
        sent = 4 * step, exec = step } })
    for k = 1, #calls do
      assert(lease:delete(journal.call_key(id, step, k)))
    end
    calls, payload = {}, 0
  end

  local opts = common.session_opts(env, {
    context = docs,
    query = "What are the documents about?",
    max_iterations = TURNS + 1,
    llm_query = function(prompt)
      local text = sub_model(prompt)
      local call = { k = #calls + 1, via = "llm", call = core.sha256_hex(prompt), text = text }
      calls[#calls + 1] = call
      payload = payload + #text
      write(journal.call_key(id, step, call.k), "call", { n = step, k = call.k, via = "llm",
        call = call.call, text = text })
      return text
    end,
    root_llm = function(messages)
      if step == 0 then
        seen = #messages -- the system prompt and the question: the run's, not a step's
      else
        step_done(messages)
      end
      step = step + 1
      return turn(step)
    end,
  })
  local session = rlm.Session.new(opts)
  local result, err = session:run()
  session:close()
  assert(result, "the scripted task failed: " .. tostring(err))
  assert(step == TURNS, ("%d root calls, not %d"):format(step, TURNS))
  local keys, stored = { journal.head_key(id) }, 0
  for n = 1, step - 1 do
    keys[#keys + 1] = journal.step_key(id, n)
  end
  for _, key in ipairs(keys) do
    stored = stored + #assert(s:get(key))
  end
  assert(lease:drop(keys))
  assert(next(core.journal_list(dir)) == nil, "the journal's delete left entries")
  common.remove_tree(dir)

  local med, max = common.median(sizes), 0
  for _, n in ipairs(sizes) do
    max = math.max(max, n)
  end
  local floor = common.median(payloads)
  local per_step_written = {}
  for n = 1, step - 1 do
    per_step_written[#per_step_written + 1] = written[n] or 0
  end
  local row = common.context_row("18", ("journal: a step's entry, %d-turn scripted run with 3 sub-calls a turn "
    .. "(median over the %d steps before the answer's)"):format(TURNS, #sizes), med, "bytes",
    ("%d bytes (%s)"):format(med, kb(med)), #sizes,
    ("largest %d bytes; the head %d bytes, rewritten at each step; written per step, the answers' entries and "
      .. "the head included: median %d bytes; the whole journal before its delete: %s in %d entries; a "
      .. "fsync'd write to the file store (%s): median %.2f ms")
      :format(max, head_bytes, common.median(per_step_written), kb(stored), #keys + 1, "the scratch directory",
        common.median(write_ms)))
  row.floor = { name = "what the entry carries: the step's messages' contents and its answers' texts",
    text = ("%d bytes"):format(floor), n = #payloads, value = floor }
  row.ratio = med / floor
  row.ratio_text = ("%.2fx"):format(row.ratio)
  return { row }
end

return M
