-- What the root model reads after each turn: the REPL output message and
-- its status line, the notes for a reply that ran nothing, the last-chance
-- request, and what a compaction (rlm.engine.compact) puts in place of the
-- turns it replaced. The system prompt and the first user message are
-- lua/rlm/engine/prompt.lua's. docs/prompt.md shows every text this file
-- makes; a spec (spec/prompt_spec.lua) checks that it does not drift.
local textlib = require("rlm.base.text")
local thousands = require("rlm.engine.prompt").thousands

local M = {}

M.NO_CODE = "Your response had no ```repl code block and no FINAL line, so nothing ran. " ..
  "Write code in a ```repl block, or answer on a line of its own with FINAL(answer) or " ..
  "FINAL_VAR(variable_name)."

M.REASONING_ONLY = "Your response held only reasoning (thinking tags or a reasoning channel) and nothing " ..
  "after it, so nothing ran: reasoning is never run and never taken as an answer. After your reasoning, write " ..
  "code in a ```repl block, or answer on a line of its own with FINAL(answer) or FINAL_VAR(variable_name)."

M.EMPTY_REPLY = "Your response was empty (a reasoning model may have spent all its output on thinking), so " ..
  "nothing ran. Write code in a ```repl block, or answer on a line of its own with FINAL(answer) or " ..
  "FINAL_VAR(variable_name)."

M.LAST_CHANCE = "You have no turns left: nothing more will run. Give your final answer now, " ..
  "on a line of its own, as FINAL(your answer) or FINAL_VAR(variable_name). If you do not have " ..
  "it, write your best answer as plain text; it will be taken as your answer, marked as such."

-- Compaction (option compact, rlm.engine.compact): what the first user
-- message holds, after the question, for the turns it replaced. t = {
-- first =, last = (the turns replaced, of this question), summary = the
-- model's text or nil, entries = the digest's lines (oldest first) or nil,
-- hidden = turns of the digest left out for its size, facts = one line
-- for each turn left out of the digest (all of them, under a summary)
-- that had an error or a final answer, dropped = facts left out, vars =
-- the variables' lines (M.vars_listing), or nil }.
function M.compacted(t)
  local how = t.summary and "replaced by the summary you wrote of them, below"
    or "shown below as a digest (each turn's code, the first line of its output, its error and any "
      .. "final answer), not whole"
  local out = { ("[Earlier turns were compacted to keep this conversation short: turns %d to %d are %s. The "
    .. "REPL lost nothing: every variable you set still holds its value (SHOW_VARS() lists them). The turns "
    .. "after turn %d follow in full.]"):format(t.first, t.last, how, t.last) }
  local facts = #t.facts > 0 and table.concat(t.facts, "\n") or nil
  if t.dropped > 0 then
    facts = ("(%d earlier turn%s with an error or a final answer not listed)\n"):format(t.dropped,
      t.dropped == 1 and "" or "s") .. (facts or "")
  end
  if t.summary then
    out[#out + 1] = "Your summary of turns " .. t.first .. " to " .. t.last .. ":\n" .. t.summary
    if facts then
      out[#out + 1] = "What the REPL recorded of those turns' errors and final answers:\n" .. facts
    end
  else
    if t.hidden > 0 then
      out[#out + 1] = ("Turns %d to %d: not shown (the digest keeps the most recent turns within half of "
        .. "compact.at_tokens)%s"):format(t.first, t.first + t.hidden - 1,
          facts and "; of them, these had an error or a final answer:\n" .. facts or ".")
    end
    out[#out + 1] = table.concat(t.entries, "\n")
  end
  out[#out + 1] = t.vars and ("Variables after turn %d, as the REPL listed them (its data: a line each, "
    .. "indented, a name and its type; one that is not a plain name is quoted):\n%s"):format(t.last, t.vars)
    or "(The variables could not be listed: call SHOW_VARS() to see them.)"
  return table.concat(out, "\n\n")
end

-- A name or a type name the driver gave, on one line: a plain dotted name
-- as it is; anything else quoted, its control characters and line breaks
-- (U+0085, U+2028, U+2029 too) escaped, so that no part of it can start a
-- line of its own or end the quotes. Cut to MAX_NAME_CHARS characters.
M.MAX_NAME_CHARS = 100
local ESCAPES = { ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t", ['"'] = '\\"', ["\\"] = "\\\\" }
local function quoted_name(s)
  s = textlib.cut(s, M.MAX_NAME_CHARS, false):gsub("\n%[truncated %d+ chars%]\n", "...")
  if s:find("^[%a_][%w_.]*$") then
    return s
  end
  s = s:gsub('[%c"\\]', function(ch)
    return ESCAPES[ch] or ("\\x%02x"):format(ch:byte())
  end):gsub("\194\133", "\\u0085"):gsub("\226\128([\168\169])", function(b)
    return ("\\u%04x"):format(0x2000 + b:byte() - 0x80)
  end)
  return '"' .. s .. '"'
end
M.quoted_name = quoted_name

-- The lines of a compaction's variables: vars as the driver's list_vars
-- gave them ({ name, type name, len or nil }, at most MAX_VARS of them
-- shown), more: how many it left out. Each line is indented and holds one
-- variable, so that nothing the REPL named poses as a line of the host's.
M.MAX_VARS = 100
function M.vars_listing(vars, more)
  local lines = {}
  for i = 1, math.min(#vars, M.MAX_VARS) do
    local v = vars[i]
    local size = type(v[3]) == "number" and (", len %.0f"):format(v[3]) or ""
    lines[i] = ("  %s: %s%s"):format(quoted_name(v[1]), quoted_name(v[2]), size)
  end
  more = more + math.max(#vars - M.MAX_VARS, 0)
  if more > 0 then
    lines[#lines + 1] = ("  (and %d more)"):format(more)
  elseif #lines == 0 then
    lines[1] = "  (none yet)"
  end
  return table.concat(lines, "\n")
end

-- One compacted turn of the digest: its code (cut), the first line of its
-- output, the last line of its error, the final answer it gave or had
-- refused. e is its history entry.
function M.digest_turn(turn, e, code_chars, line_chars)
  local lines = { ("Turn %d:"):format(turn) }
  local code = e.code or ""
  if code == "" then
    lines[#lines + 1] = "  (no code ran)"
  else
    code = textlib.cut(code, code_chars, false)
    lines[#lines + 1] = "  code:\n    " .. code:gsub("\n", "\n    ")
  end
  local out = e.stdout or ""
  if out:find("%S") then
    local n, first = 0, nil
    for line in out:gmatch("[^\n]+") do
      n = n + 1
      first = first or (line:find("%S") and line)
    end
    lines[#lines + 1] = ("  output (%d line%s, %s characters), its first: %s"):format(n, n == 1 and "" or "s",
      thousands(textlib.utf8_len(out)), (textlib.cut(first, line_chars, false):gsub("\n", " ")))
  elseif code ~= "" then
    lines[#lines + 1] = "  output: (nothing printed)"
  end
  if e.error then
    local last
    for line in e.error:gmatch("[^\n]+") do
      if line:find("%S") then
        last = line
      end
    end
    lines[#lines + 1] = "  error: " .. textlib.cut(last or e.error, line_chars, true):gsub("\n", " ")
  end
  if e.final then
    lines[#lines + 1] = "  final answer given: " .. textlib.cut(tostring(e.final.answer), line_chars, false)
      :gsub("\n", " ")
  elseif e.rejected then
    lines[#lines + 1] = "  a final answer was not accepted: " .. textlib.cut(tostring(e.rejected), line_chars,
      false):gsub("\n", " ")
  end
  return table.concat(lines, "\n")
end

-- One line of a compacted turn left out of the digest: its error's last
-- line, or the final answer it gave or had refused; nil when it had none.
function M.turn_fact(turn, e, line_chars)
  local final = e.final and ("final answer given: " .. tostring(e.final.answer))
    or e.rejected and ("a final answer was not accepted: " .. tostring(e.rejected))
  local err
  for line in (e.error or ""):gmatch("[^\n]+") do
    if line:find("%S") then
      err = "error: " .. line
    end
  end
  local fact = final or err
  return fact and ("Turn %d: %s"):format(turn, (textlib.cut(fact, line_chars, false):gsub("\n", " "))) or nil
end

-- What the root model is asked for when option compact's summary is
-- "model": turns first to last are to be replaced by its summary; keep
-- turns stay whole; about `words` words.
M.COMPACT_REQUEST = "This conversation is getting long: turns %d to %d will now be replaced by a summary "
  .. "that you write, and you will go on from it and the last %d turn(s). Write that summary for yourself: "
  .. "what the question needs, what you found and which variables hold it, what failed and why, and what is "
  .. "left to do. Plain text: no code block and no FINAL line; at most about %d words. The REPL keeps every "
  .. "variable."

-- The turns at the end of which the model is warned.
M.WARN_TURNS_LEFT = 2

-- The line at the end of every REPL output message: turns used and left,
-- the sub-calls left, and a warning near the end. t = { used =, max =,
-- sub_calls =, max_sub_calls = }.
function M.status(t)
  local left = t.max - t.used
  local s = ("[Turn %d of %d used, %d left. Sub-calls: %d of %d used, %d left.]"):format(
    t.used, t.max, left, t.sub_calls, t.max_sub_calls, math.max(t.max_sub_calls - t.sub_calls, 0))
  if left == 0 then
    s = s .. "\nThat was your last turn: next, give your final answer."
  elseif left <= M.WARN_TURNS_LEFT then
    s = s .. ("\nOnly %d turn%s left: finish up and answer with FINAL(...) or FINAL_VAR(...) "
      .. "on a line of its own."):format(left, left == 1 and "" or "s")
  end
  if t.sub_calls >= t.max_sub_calls then
    s = s .. "\nNo sub-calls are left: a single llm_query now ends the run; answer from what you have."
  end
  return s
end

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

return M
