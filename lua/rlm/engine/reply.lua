-- What the root model writes: the code and the answers in its responses
-- (parse), split from lua/rlm/engine/prompt.lua, which makes what the model reads.
-- docs/prompt.md shows the notes this file makes.
local M = {}

-- Fence tags whose blocks run; an untagged block runs when no block of the
-- response has one of these tags.
local RUN_TAGS = { repl = true, python = true, python3 = true, py = true }

local function trim(s)
  local first = s:find("%S")
  if not first then
    return ""
  end
  local last = #s
  while s:find("^%s", last) do
    last = last - 1
  end
  return s:sub(first, last)
end

local function split_lines(s)
  local lines = {}
  for line in (s .. "\n"):gmatch("(.-)\r?\n") do
    lines[#lines + 1] = line
  end
  return lines
end

-- The block's lines without the fence's own indent, then without the
-- indent all its lines share (a block inside a numbered list).
local function dedent(lines, indent)
  local out, common = {}, nil
  for i, l in ipairs(lines) do
    if l:sub(1, #indent) == indent then
      l = l:sub(#indent + 1)
    end
    out[i] = l
    if l:match("%S") then
      local lead = l:match("^[ \t]*")
      if not common then
        common = lead
      else
        local k = 0
        while k < #common and k < #lead and common:byte(k + 1) == lead:byte(k + 1) do
          k = k + 1
        end
        common = common:sub(1, k)
      end
    end
  end
  if common and common ~= "" then
    for i, l in ipairs(out) do
      out[i] = l:sub(1, #common) == common and l:sub(#common + 1) or l:match("^[ \t]*(.*)$")
    end
  end
  return table.concat(out, "\n")
end

-- A final-answer line: FINAL( or FINAL_VAR( at the start of a line,
-- perhaps after markdown's emphasis, inline-code ticks or a quote mark.
local FINAL_START = "^[ \t]*[%*`>_]*[ \t]*()FINAL(_?V?A?R?)[ \t]*%("

-- From the "(" at position open in s: the text up to the matching ")",
-- and the position after it; nil when it is never closed.
local function balanced(s, open)
  local depth, pos = 0, open
  while true do
    pos = s:find("[()]", pos)
    if not pos then
      return nil
    end
    if s:byte(pos) == 40 then -- "("
      depth = depth + 1
    else
      depth = depth - 1
      if depth == 0 then
        return s:sub(open + 1, pos - 1), pos + 1
      end
    end
    pos = pos + 1
  end
end

-- The final at the start of text (a line of prose, or a whole block):
-- { kind = "final" | "var", text = what is between the parentheses, rest =
-- what follows }, or nil; { unclosed = true } when its ")" is missing.
local function final_at(text)
  local start, suffix = text:match(FINAL_START)
  if not start or (suffix ~= "" and suffix ~= "_VAR") then
    return nil
  end
  local open = text:find("(", start, true)
  local inner, after = balanced(text, open)
  if not inner then
    return { kind = suffix == "" and "final" or "var", unclosed = true }
  end
  return { kind = suffix == "" and "final" or "var", text = inner, rest = text:sub(after) }
end

-- A fence's opening line: its indent, its fence (``` or ~~~, three or
-- more) and its info string; nil when the line opens none.
local function open_fence(line)
  local indent, fence, info = line:match("^([ \t]*)(```+)[ \t]*([^`]-)[ \t]*$")
  if not fence then
    indent, fence, info = line:match("^([ \t]*)(~~~+)[ \t]*(.-)[ \t]*$")
  end
  return indent, fence, info
end

-- The line that closes the fence opened at line i, or nil.
local function fence_end(lines, i, fence)
  local ch = fence:sub(1, 1)
  for j = i + 1, #lines do
    local close = lines[j]:match("^[ \t]*([`~]+)[ \t]*$")
    if close and close:sub(1, 1) == ch and #close >= #fence and not close:find(ch == "`" and "~" or "`") then
      return j
    end
  end
  return nil
end

-- Whether line last is prose (outside every fence), the lines after i read
-- as parse reads them.
local function ends_in_prose(lines, i, last)
  local k = i + 1
  while k <= last do
    local _, fence = open_fence(lines[k])
    if fence then
      local close = fence_end(lines, k, fence)
      if not close or close >= last then
        return false
      end
      k = close + 1
    else
      k = k + 1
    end
  end
  return true
end

M.UNCLOSED = "Your FINAL line has no closing parenthesis, so it was not taken as an answer."
M.CLOSED_IN_CODE = "Your FINAL line's closing parenthesis is inside a code block, so it was not taken as an "
  .. "answer: close it on a line of prose, or build the answer in a variable and give FINAL_VAR(name)."

-- The parentheses of text matched in one pass: match[open] = its close.
-- Parentheses are counted, quotes are not (docs/prompt.md).
local function paren_matches(text)
  local match, stack = {}, {}
  for at, ch in text:gmatch("()([()])") do
    if ch == "(" then
      stack[#stack + 1] = at
    elseif #stack > 0 then
      match[stack[#stack]] = at
      stack[#stack] = nil
    end
  end
  return match
end

-- The final written in prose at line i (starts[i]: where the line starts
-- in joined, the lines joined): its text runs up to the matching ")" over
-- the lines as written, fences included (a fence inside a FINAL is part of
-- the answer, and does not run). Returns the final and the line after it,
-- or nil when line i is no final; nil, nil, a note when it is not taken.
local function prose_final(lines, i, joined, starts, match)
  local start, suffix = lines[i]:match(FINAL_START)
  if not start or (suffix ~= "" and suffix ~= "_VAR") then
    return nil
  end
  local open = starts[i] + lines[i]:find("(", start, true) - 1
  local close = match[open]
  if not close then
    return nil, nil, M.UNCLOSED
  end
  local text = joined:sub(open + 1, close - 1)
  local last = i + select(2, text:gsub("\n", ""))
  if not ends_in_prose(lines, i, last) then
    return nil, nil, M.CLOSED_IN_CODE
  end
  return { kind = suffix == "" and "final" or "var", text = text }, last + 1
end

local function shown(f)
  local text = f.text:match("^%s*(.-)%s*$")
  if #text > 80 then
    text = text:sub(1, 77) .. "..."
  end
  return ("%s(%s)"):format(f.kind == "var" and "FINAL_VAR" or "FINAL", text)
end

M.TWO_FINALS = "Your response has two different final lines, %s and %s, so neither was taken as the answer: "
  .. "answer again with one."

-- Other model families' forms (docs/prompt.md, "Other families' forms"),
-- read as the blocks and FINAL lines parse reads, outside the fences:
-- Anthropic's XML tool call (<function_calls><invoke name="repl">
-- <parameter name="code">, with or without the antml: prefix), the
-- Hermes/Qwen <tool_call>{"name": "repl", "arguments": {"code": ...}}, GLM's
-- <|begin_of_box|>...<|end_of_box|> and an <answer>...</answer>. Strict: a
-- call to another tool, a second parameter, anything but whitespace
-- between the calls or an unclosed tag runs nothing, and the note says why.
local CALL_NAMES = { repl = true, python = true, python3 = true, py = true, ipython = true, python_repl = true,
  run_python = true, execute_python = true, run_code = true, execute_code = true }
M.CALL_NOT_RUN = "A %s tool call did not run: %s. Only a call to \"repl\" (or \"python\") with one \"code\" "
  .. "argument runs; or write the code in a ```repl block."

-- The fenced block lines that hold code: a fence longer than its longest
-- run of backticks.
local function fenced(code, out)
  local longest = 3
  for run in code:gmatch("`+") do
    longest = math.max(longest, #run + 1)
  end
  local fence = ("`"):rep(longest)
  out[#out + 1] = fence .. "repl"
  for _, l in ipairs(split_lines((code:gsub("^[ \t]*\r?\n", ""):gsub("%s+$", "")))) do
    out[#out + 1] = l
  end
  out[#out + 1] = fence
end

-- The code of one XML invoke (the part between <invoke ...> and
-- </invoke>), or nil and why not.
local function invoke_code(name, body, prefix)
  if not CALL_NAMES[name] then
    return nil, ("it calls %q, which is no tool here"):format(name:sub(1, 40))
  end
  local param, open_end = body:match("^%s*<" .. prefix .. "parameter%s+name%s*=%s*[\"']([%w_]+)[\"']%s*>()")
  local close = param and body:match(".*()</" .. prefix .. "parameter>%s*$")
  if not close then
    return nil, "its arguments are not one <parameter> element"
  end
  local code = body:sub(open_end, close - 1)
  if param ~= "code" or code:find("<" .. prefix .. "parameter", 1, true) then
    return nil, "its arguments are not one \"code\" parameter"
  end
  return code
end

-- <function_calls> ... </function_calls> (inner, its prefix): the blocks
-- into out, or a note.
local function xml_calls(inner, prefix, out)
  local codes, pos = {}, 1
  local open = "^%s*<" .. prefix .. "invoke%s+name%s*=%s*[\"']([^\"']*)[\"']%s*>()"
  while inner:find("%S", pos) do
    local name, body_start = inner:sub(pos):match(open)
    local close = name and inner:find("</" .. prefix .. "invoke>", pos, true)
    if not close then
      return M.CALL_NOT_RUN:format("<function_calls>", "it is not a list of <invoke> elements")
    end
    local code, why = invoke_code(name, inner:sub(pos + body_start - 1, close - 1), prefix)
    if not code then
      return M.CALL_NOT_RUN:format("<function_calls>", why)
    end
    codes[#codes + 1] = code
    pos = close + #("</" .. prefix .. "invoke>")
  end
  for _, code in ipairs(codes) do
    fenced(code, out)
  end
end

-- <tool_call>{json}</tool_call>: the block into out, or a note.
local function json_call(inner, out)
  local ok, call = pcall(require("rlm.base.json").decode, inner)
  if not ok or type(call) ~= "table" or type(call.name) ~= "string" then
    return M.CALL_NOT_RUN:format("<tool_call>", "it is not a JSON object with a \"name\"")
  end
  local args = call.arguments
  if type(args) == "string" then
    args = select(2, pcall(require("rlm.base.json").decode, args))
  end
  if not CALL_NAMES[call.name] then
    return M.CALL_NOT_RUN:format("<tool_call>", ("it calls %q, which is no tool here"):format(call.name:sub(1, 40)))
  end
  if type(args) ~= "table" or type(args.code) ~= "string" or next(args, next(args)) ~= nil then
    return M.CALL_NOT_RUN:format("<tool_call>", "its arguments are not one \"code\" string")
  end
  fenced(args.code, out)
end

-- A Python string literal of text, on one line, with no parenthesis in it.
local function py_literal(text)
  return '"' .. text:gsub('[%c\\"()]', function(c)
    return ("\\x%02x"):format(c:byte())
  end) .. '"'
end

-- The element opened at the start of lines[i]: its inner text, the rest of
-- its closing line and that line's index; nil when it is never closed.
local function element(lines, i, open, close)
  local text = table.concat(lines, "\n", i)
  local from = select(2, text:find(open, 1, true)) + 1
  local to = text:find(close, from, true)
  if not to then
    return nil
  end
  local last = i + select(2, text:sub(1, to):gsub("\n", ""))
  return text:sub(from, to - 1), text:sub(to + #close):match("^[^\n]*"), last
end

local function other_forms(response)
  if not response:find("<", 1, true) then
    return response
  end
  local lines, out, notes = split_lines(response), {}, {}
  local answers = select(2, response:gsub("<answer>", "")) == 1 and select(2, response:gsub("</answer>", "")) == 1
  local i = 1
  while i <= #lines do
    local line = lines[i]
    local _, fence = open_fence(line)
    local prefix = line:match("^%s*<(a?n?t?m?l?:?)function_calls>")
    local element_of = prefix and { "<" .. prefix .. "function_calls>", "</" .. prefix .. "function_calls>" }
      or line:match("^%s*<tool_call>") and { "<tool_call>", "</tool_call>" }
      or answers and line:match("^%s*<answer>") and { "<answer>", "</answer>" }
    local inner, rest, last
    if element_of and (prefix == nil or prefix == "" or prefix == "antml:") then
      inner, rest, last = element(lines, i, element_of[1], element_of[2])
      if not inner then
        notes[#notes + 1] = ("A %s was never closed (no %s after it), so it was not read.")
          :format(element_of[1], element_of[2])
      end
    end
    if fence then
      local j = fence_end(lines, i, fence) or #lines
      for k = i, j do
        out[#out + 1] = lines[k]
      end
      i = j + 1
    elseif inner then
      local note
      if element_of[1] == "<tool_call>" then
        note = json_call(inner, out)
      elseif element_of[1] == "<answer>" then
        inner = trim(inner)
        out[#out + 1] = final_at(inner) and inner or "FINAL(" .. py_literal(inner) .. ")"
      else
        note = xml_calls(inner, prefix, out)
      end
      notes[#notes + 1] = note
      out[#out + 1] = rest
      i = last + 1
    elseif line:find("<|begin_of_box|>", 1, true) or line:find("<|end_of_box|>", 1, true) then
      -- GLM's box around its answer: the box's text on lines of its own.
      for _, l in ipairs(split_lines((line:gsub("<|begin_of_box|>", "\n"):gsub("<|end_of_box|>", "\n")))) do
        out[#out + 1] = l
      end
      i = i + 1
    else
      out[#out + 1] = line
      i = i + 1
    end
  end
  return table.concat(out, "\n"), notes
end

local function fence_name(tag, ch)
  return (ch == "~" and "~~~" or "```") .. tag
end

-- parse(response) -> {
--   blocks = { code, ... }   the code to run, in order;
--   sole_finals = { [i] = final }: block i is only a FINAL(...) or
--            FINAL_VAR(...) call, read as a prose final when it fails;
--   finals = { { kind = "final" | "var", text = } }: the FINAL(...) or
--            FINAL_VAR(...) written as a line of prose (a fence inside its
--            parentheses is part of its text, not a block); none when two
--            final lines differ (conflict = the two, and a note);
--   reasoning = the thinking taken out before the reply was read
--            (rlm.engine.reasoning), or nil; only_reasoning = true when
--            nothing was left of the reply;
--   code_finals = { final, ... }: the FINAL lines inside the blocks (the
--            last chance runs only those), strict = true when a block had
--            other code too (its FINAL's text is no answer by itself);
--   notes = { text, ... }    what was skipped, for the model;
--   text = the prose outside the fences, without the final lines. }
-- Fences are ``` or ~~~ (three or more), tagged repl, python, python3 or
-- py, or untagged; indented fences are dedented.
function M.parse(response)
  local form_notes, reasoning
  response, reasoning = require("rlm.engine.reasoning").strip(response)
  response, form_notes = other_forms(response)
  local lines = split_lines(response)
  local found, prose, notes = {}, {}, form_notes or {}
  local out = { blocks = {}, sole_finals = {}, finals = {}, code_finals = {}, notes = notes, reasoning = reasoning,
    only_reasoning = reasoning ~= nil and not response:find("%S") }
  local joined, starts, match = table.concat(lines, "\n"), {}, nil
  local tagged, final_note, finals_done, first = false, nil, false, nil
  local at = 1
  for k, l in ipairs(lines) do
    starts[k], at = at, at + #l + 1
  end
  local i = 1
  while i <= #lines do
    local indent, fence, info = open_fence(lines[i])
    local final, after, note
    if not fence and not finals_done and lines[i]:find("FINAL", 1, true) then
      match = match or paren_matches(joined)
      final, after, note = prose_final(lines, i, joined, starts, match)
      if note and not first then
        final_note, finals_done = note, true
      elseif note or (final and first and (final.kind ~= first.kind or trim(final.text) ~= trim(first.text))) then
        -- Two final lines that differ: the model changed its mind, or
        -- guessed twice; neither is the answer.
        local other = final or { kind = "final", text = lines[i]:match("FINAL_?V?A?R?%((.*)$") or "" }
        out.conflict = { first, other }
        final_note, finals_done, out.finals = M.TWO_FINALS:format(shown(first), shown(other)), true, {}
      elseif final and not first then
        first, out.finals[1] = final, final
      end
    end
    if fence then
      local ch = fence:sub(1, 1)
      local tag = (info:match("^[{.]?([%w_%+%-]*)") or ""):lower()
      local j = fence_end(lines, i, fence)
      if not j then
        notes[#notes + 1] = ("A %s block was never closed (no %s line after it), so it did not run.")
          :format(fence_name(tag, ch), fence)
        j = #lines
      else
        local buf = {}
        for k = i + 1, j - 1 do
          buf[#buf + 1] = lines[k]
        end
        found[#found + 1] = { tag = tag, ch = ch, code = dedent(buf, indent) }
        tagged = tagged or RUN_TAGS[tag] ~= nil
      end
      i = j + 1
    elseif final then
      i = after
    else
      prose[#prose + 1] = lines[i]
      i = i + 1
    end
  end
  for _, b in ipairs(found) do
    if RUN_TAGS[b.tag] or (b.tag == "" and not tagged) then
      out.blocks[#out.blocks + 1] = b.code
      local f = final_at(b.code)
      if f and not f.unclosed and not f.rest:match("%S") then
        -- A block that is only FINAL(...): read as the reference reads it.
        out.sole_finals[#out.blocks] = { kind = f.kind, text = f.text }
        out.code_finals[#out.code_finals + 1] = out.sole_finals[#out.blocks]
      else
        for line in (b.code .. "\n"):gmatch("(.-)\n") do
          local lf = final_at(line)
          if lf and not lf.unclosed and not lf.rest:match("%S") then
            out.code_finals[#out.code_finals + 1] = { kind = lf.kind, text = lf.text, strict = true }
          end
        end
      end
    elseif b.tag == "" then
      notes[#notes + 1] = "An untagged ``` block did not run, because other blocks were tagged repl: " ..
        "tag every block you want to run ```repl."
    else
      notes[#notes + 1] = ("A %s block did not run: only blocks tagged repl (or python) run.")
        :format(fence_name(b.tag, b.ch))
    end
  end
  notes[#notes + 1] = final_note
  out.text = trim(table.concat(prose, "\n"))
  return out
end

-- The response without its reasoning (rlm.engine.reasoning).
function M.without_reasoning(response)
  return (require("rlm.engine.reasoning").strip(response))
end

-- extract(response) -> { code, ... }: the blocks that run (for callers
-- that want only the code).
function M.extract(response)
  return M.parse(response).blocks
end

return M
