-- What the root model reads first: the system prompt (with what it says
-- the context is) and the first user message of a question. What it reads
-- after each turn is lua/rlm/engine/feedback.lua's; lua/rlm/engine/reply.lua
-- reads what it writes. docs/prompt.md shows every text these files make;
-- a spec (spec/prompt_spec.lua) checks that it does not drift.
local cjson_safe = require("cjson.safe")
local json = require("rlm.base.json")
local textlib = require("rlm.base.text")

local M = {}

local SYSTEM = [==[
You answer a question about a context that is too large to read directly. The
context is not in this conversation. It is loaded in a persistent Python REPL
as the variable `context`: %s.
You work by writing Python code; you see only what the code prints, cut to
%s characters per run, so print summaries, counts and short slices, never
the whole context.

In the REPL:
- `context`: the data. Look at it through code first: its type, its length,
  its structure, a few samples.
- `llm_query(prompt)`: asks a sub-model (it can read about %s characters at a
  time) and returns its answer as a str. Use it to read or classify slices
  of the context that code alone cannot handle. A call that fails raises an
  exception that names the cause. Every call costs time and money: prefer
  regular expressions and string methods where they suffice, and put many
  items into one prompt rather than one call per line.
- `llm_query_batched(prompts)`: the same for a list of prompts, run side by
  side; returns the list of answers in order. Prefer it to calling llm_query
  in a loop: chunk the context into a few dozen prompts, each well under the
  sub-model's window. A failed call's slot holds a `SubCallError` (a str
  starting "Error:"); check with isinstance and retry or skip it.%s
- Variables persist between runs; a run that raises an exception is rolled
  back (the names it set are undone) and you see the traceback.
- Imports are limited to the standard library's data modules (re, json, math,
  collections, itertools, functools, statistics, string, textwrap, datetime,
  difflib, heapq, bisect, random, hashlib, base64, csv, io, ...)%s.
- Each REPL output message says how many turns you have used and have left,
  and how many sub-calls are left. Plan for them.

To run code, write it in a fenced block tagged repl:
```repl
print(type(context).__name__, len(context))
```
All blocks of a response run in order.

Example: look before you read. Peek at the start and at the structure:
```repl
print(context[:1000])
lines = context.split("\n")
print(len(lines), "lines")
```

Example: chunk, read the chunks side by side, aggregate. Each prompt stays
well under the sub-model's window:
```repl
size = %s
chunks = [context[i:i + size] for i in range(0, len(context), size)]
prompts = [f"List every product recall this text mentions, one per line, or NONE.\n\n{c}"
           for c in chunks]
notes = [a for a in llm_query_batched(prompts)
         if not isinstance(a, SubCallError) and a.strip() != "NONE"]
print(len(chunks), "chunks,", len(notes), "with recalls")
```
Then, in the next turn, once the numbers look right:
```repl
recalls = llm_query("Merge these notes into one list without duplicates:\n\n"
                    + "\n\n".join(notes))
print(recalls[:2000])
```
and, once the printed list checks out, a line of prose (not code):
FINAL_VAR(recalls)

Example: a list of documents. Filter with code, then ask about the few that
matter:
```repl
hits = [i for i, doc in enumerate(context) if "invoice" in str(doc).lower()]
print(len(hits), "of", len(context), "documents mention an invoice")
totals = llm_query_batched([f"What is the total amount of this invoice? Reply with the number only.\n\n{context[i]}"
                            for i in hits[:50]])
```

When you know the answer, and have checked it with code, give it NOT in a
code block, on a line of its own, in a response with no code, as one of:
FINAL(your final answer here)
FINAL_VAR(variable_name)
FINAL(...) takes the answer as text, as you write it (several lines are
fine), or, of your variables, their value: FINAL(total + 1); FINAL_VAR(...)
the name of a variable you built in the REPL, whose value is the answer.
Write one final line, not two. A FINAL(text) line beside code is not taken:
you have not seen that code's output yet. Both also work as calls inside
code, as does setting `answer["content"] = ...` and then
`answer["ready"] = True`. Reasoning (thinking tags) never runs: write the
code and the final line after it. Do not guess: if you have not found the
answer yet, keep working.]==]

local NESTED = [[

- `rlm_query(prompt, context=None)`: hands a sub-task to a nested session like
  this one: a model that gets `prompt` as its question and `context` (a str,
  dict or list; the prompt itself when None) in a REPL of its own, works on it
  with code as you do, and returns its final answer as a str. It raises when
  the nested session fails. Far slower and costlier than llm_query: use it
  only for sub-tasks too large or too involved for one sub-model call.
  `rlm_query_batched(prompts, contexts=None)` runs several side by side and
  returns the answers in order (failures as `SubCallError` slots).]]

-- 1234567 -> "1,234,567"
local function thousands(n)
  local s = ("%d"):format(n)
  local head, digits = s:match("^(%-?%d)(%d*)$")
  return head .. digits:reverse():gsub("(%d%d%d)", "%1,"):reverse()
end
M.thousands = thousands

-- How many items describe() lists one by one before it sums up.
local SHOWN_ITEMS = 5

-- The characters an item of a list or dict context has for the model: a
-- str's own; anything else's as JSON text.
local function item_chars(v)
  if type(v) == "string" then
    return textlib.utf8_len(v), true
  end
  local ok, text = pcall(json.encode, v)
  return ok and textlib.utf8_len(text) or 0, false
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do
    keys[#keys + 1] = k
  end
  table.sort(keys, function(a, b)
    if type(a) == type(b) and (type(a) == "string" or type(a) == "number") then
      return a < b
    end
    return type(a) < type(b)
  end)
  return keys
end

-- describe(context) -> what the system prompt says `context` is: its type,
-- its total characters, and for a list or dict the lengths of its items
-- (the first few one by one, then the least, the median and the most).
function M.describe(context)
  if type(context) == "string" then
    return ("a str of %s characters"):format(thousands(textlib.utf8_len(context)))
  end
  local keys = sorted_keys(context)
  local n = #keys
  local is_list = n == #context
  if n == 0 then
    local ok, text = pcall(json.encode, context)
    return ("an empty %s"):format(ok and text == "[]" and "list" or "dict")
  end
  local lengths, shown, all_str, total = {}, {}, true, 0
  for i, k in ipairs(keys) do
    local chars, is_str = item_chars(context[k])
    all_str = all_str and is_str
    lengths[i], total = chars, total + chars
    if i <= SHOWN_ITEMS then
      shown[i] = is_list and thousands(chars) or ("%q: %s"):format(tostring(k), thousands(chars))
    end
  end
  local what = is_list and ("a list of %s %s"):format(thousands(n), n == 1 and "item" or "items")
    or ("a dict of %s %s"):format(thousands(n), n == 1 and "key" or "keys")
  local parts = { ("%s, %s characters in all"):format(what, thousands(total)) }
  local unit = all_str and "" or (" (str %s as text, others as JSON)"):format(is_list and "items" or "values")
  local label = is_list and "item lengths" or "value lengths"
  if n <= SHOWN_ITEMS then
    parts[#parts + 1] = ("%s%s: %s"):format(label, unit, table.concat(shown, ", "))
  else
    table.sort(lengths)
    parts[#parts + 1] = ("%s%s: %s, ... (the first %d of %s; least %s, median %s, most %s)"):format(
      label, unit, table.concat(shown, ", "), SHOWN_ITEMS, thousands(n), thousands(lengths[1]),
      thousands(lengths[math.floor((n + 1) / 2)]), thousands(lengths[n]))
  end
  return table.concat(parts, "; ")
end

-- The description of a nested session's JSON context (text the code sent).
function M.describe_json(text)
  local value = cjson_safe.decode(text)
  if type(value) == "table" then
    return M.describe(value)
  end
  return ("a JSON document of %s characters, loaded as a Python value"):format(
    thousands(textlib.utf8_len(text)))
end

-- A chunk size for the example: half the sub-model's window, rounded.
local function example_chunk(window)
  local size = math.floor(window / 2 / 1000) * 1000
  return size >= 1000 and size or math.max(math.floor(window / 2), 1)
end

-- The default system prompt of a session at `depth` (0 for the root);
-- `context` is how describe() put it.
function M.default_system(opts, context, depth)
  local extra = ""
  if #opts.sandbox.allowed_modules > 0 then
    extra = ", and also " .. table.concat(opts.sandbox.allowed_modules, ", ")
  end
  local window = opts.max_sub_prompt_chars or 100000
  local nested = (depth or 0) + 1 < opts.max_depth and NESTED or ""
  return SYSTEM:format(context, thousands(opts.stdout_truncate_chars), thousands(window), nested, extra,
    tostring(example_chunk(window)))
end

-- The system prompt: the default, or what option system_prompt makes of
-- it (a string replaces it; a function gets it and returns the text).
-- Returns text, or nil and why.
function M.system(opts, context, depth)
  local default = M.default_system(opts, context, depth)
  local custom = opts.system_prompt
  if custom == nil then
    return default
  elseif type(custom) == "string" then
    return custom
  end
  local ok, text = pcall(custom, default, { depth = depth or 0, context = context })
  if not ok then
    return nil, "option 'system_prompt' raised: " .. tostring(text)
  elseif type(text) ~= "string" then
    return nil, "option 'system_prompt' returned " .. type(text) .. ", not a string"
  end
  return text
end

function M.first_user(query)
  if query and query ~= "" then
    return "Question: " .. query ..
      "\n\nStart by looking at `context` with code. Answer with FINAL when you are sure."
  end
  return "Start by looking at `context` with code; it says what is asked of you. " ..
    "Answer with FINAL when you are sure."
end

-- The first user message of a follow-up question: where the last
-- conversation ended, in a few lines, and the new question.
function M.follow_up(previous, question, limit)
  local lines = { "Earlier in this session you answered other questions; the REPL still holds "
    .. "`context` and every variable you defined then. In short:" }
  for _, p in ipairs(previous) do
    local answer = p.answer
    if #answer > limit then
      answer = answer:sub(1, limit) .. " [...]"
    end
    lines[#lines + 1] = ("- Asked: %s\n  After %d step(s) you answered: %s"):format(
      p.question or "(what `context` asked)", p.steps, answer)
  end
  lines[#lines + 1] = ""
  lines[#lines + 1] = M.first_user(question)
  return table.concat(lines, "\n")
end

return M
