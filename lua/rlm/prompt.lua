-- What the root model reads: the system prompt, the first user message, the
-- REPL output messages; and what it writes: the code in its responses.
local M = {}

local SYSTEM = [[
You answer a question about a context that is too large to read directly. The
context is not in this conversation. It is loaded in a persistent Python REPL,
as the variable `context` (%s). You work by writing Python code; you see only
what the code prints, cut to %d characters per run, so print summaries, counts
and short slices, never the whole context.

In the REPL:
- `context`: the data. Look at it through code first: its type, its length,
  its structure, a few samples.
- `llm_query(prompt)`: asks a sub-model (it can read about %s characters at a
  time) and returns its answer as a string. Use it to read or classify slices
  of the context that code alone cannot handle. Every call costs time and
  money: prefer regular expressions and string methods where they suffice,
  and put many items into one prompt rather than one call per line.
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

To run code, write it in a fenced block:
```repl
print(type(context), len(context))
```
All blocks of a response run in order. When you know the answer, end with one of:
- `FINAL(answer)`: the answer as text;
- `FINAL_VAR("name")`: the value of a variable you built in the REPL;
- or set `answer["content"] = ...` and then `answer["ready"] = True`.
Call it inside a code block, after checking your answer with code. Do not
guess: if you have not found it yet, keep working.]]

local NESTED = [[

- `rlm_query(prompt, context=None)`: hands a sub-task to a nested session like
  this one: a model that gets `prompt` as its question and `context` (a str,
  dict or list; the prompt itself when None) in a REPL of its own, works on it
  with code as you do, and returns its final answer as a str. It raises when
  the nested session fails. Far slower and costlier than llm_query: use it
  only for sub-tasks too large or too involved for one sub-model call.
  `rlm_query_batched(prompts, contexts=None)` runs several side by side and
  returns the answers in order (failures as `SubCallError` slots).]]

-- describe(context) -> what the system prompt says `context` is.
function M.describe(context)
  if type(context) == "string" then
    return ("a str of %d characters"):format(#context)
  end
  local n = 0
  for _ in pairs(context) do
    n = n + 1
  end
  local is_list = n == #context
  return ("a %s of %d %s, loaded from JSON"):format(
    is_list and "list" or "dict", n, is_list and "items" or "keys")
end

-- The system prompt of a session at `depth` (0 for the root); `context` is
-- how describe() put it.
function M.system(opts, context, depth)
  local extra = ""
  if #opts.allowed_modules > 0 then
    extra = ", and also " .. table.concat(opts.allowed_modules, ", ")
  end
  local window = opts.max_sub_prompt_chars and tostring(opts.max_sub_prompt_chars)
    or "100000"
  local nested = (depth or 0) + 1 < opts.max_depth and NESTED or ""
  return SYSTEM:format(context, opts.stdout_truncate_chars, window, nested, extra)
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

M.NO_CODE = "Your response had no ```repl code block, so nothing ran. " ..
  "Write code in a ```repl block, or end with FINAL(answer) in one."

M.LAST_CHANCE = "You have no runs left. Give your final answer now, on a line " ..
  "of its own, as FINAL(answer) or FINAL_VAR(\"name\"), with no other code."

-- One REPL run, as the model will read it.
function M.exec_output(i, n, stdout, err)
  local head = n > 1 and ("Output of block %d of %d:\n"):format(i, n) or "Output:\n"
  local body = stdout
  if err then
    body = (stdout ~= "" and stdout .. "\n" or "") .. "Error:\n" .. err
  elseif stdout == "" then
    body = "(nothing printed)"
  end
  return head .. body
end

local function is_final_line(line)
  return line:match("^%s*FINAL_VAR%s*%(") or line:match("^%s*FINAL%s*%(")
end

-- extract(response) -> { code, ... }: the ```repl and ```python blocks in
-- order, then any FINAL(...)/FINAL_VAR(...) written as a bare line of prose
-- outside the fences (models do this often; it runs as code).
function M.extract(response)
  local blocks, finals = {}, {}
  local in_block, lang, buf = false, nil, nil
  for line in (response .. "\n"):gmatch("(.-)\r?\n") do
    local fence = line:match("^%s*```%s*([%w_%-]*)%s*$")
    if in_block then
      if line:match("^%s*```%s*$") then
        if lang == "repl" or lang == "python" or lang == "py" then
          blocks[#blocks + 1] = table.concat(buf, "\n")
        end
        in_block = false
      else
        buf[#buf + 1] = line
      end
    elseif fence then
      in_block, lang, buf = true, fence:lower(), {}
    elseif is_final_line(line) then
      finals[#finals + 1] = (line:gsub("^%s+", ""))
    end
  end
  for _, f in ipairs(finals) do
    blocks[#blocks + 1] = f
  end
  return blocks
end

-- Only the bare FINAL lines of a response (for the last-chance answer).
function M.extract_finals(response)
  local finals = {}
  for _, code in ipairs(M.extract(response)) do
    for line in (code .. "\n"):gmatch("(.-)\n") do
      if is_final_line(line) then
        finals[#finals + 1] = (line:gsub("^%s+", ""))
      end
    end
  end
  return finals
end

return M
