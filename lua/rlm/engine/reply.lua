-- What the root model writes: the code and the answers in its responses
-- (parse), read as lua/rlm/engine/markup.lua reads fences and final lines,
-- after its reasoning (rlm.engine.reasoning) and other families' forms
-- (rlm.engine.forms) are taken care of. What the model reads is
-- lua/rlm/engine/prompt.lua's and feedback.lua's. docs/prompt.md shows the
-- notes this file makes.
local forms = require("rlm.engine.forms")
local markup = require("rlm.engine.markup")
local strip_reasoning = require("rlm.engine.reasoning").strip

local trim, split_lines, dedent = markup.trim, markup.split_lines, markup.dedent
local final_at, open_fence, fence_end = markup.final_at, markup.open_fence, markup.fence_end
local FINAL_START = markup.FINAL_START

local M = {}

-- Fence tags whose blocks run; an untagged block runs when no block of the
-- response has one of these tags.
local RUN_TAGS = { repl = true, python = true, python3 = true, py = true }

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
  local text = trim(f.text)
  if #text > 80 then
    text = text:sub(1, 77) .. "..."
  end
  return ("%s(%s)"):format(f.kind == "var" and "FINAL_VAR" or "FINAL", text)
end

M.TWO_FINALS = "Your response has two different final lines, %s and %s, so neither was taken as the answer: "
  .. "answer again with one."

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
  response, reasoning = strip_reasoning(response)
  response, form_notes = forms.rewrite(response)
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
  return (strip_reasoning(response))
end

-- extract(response) -> { code, ... }: the blocks that run (for callers
-- that want only the code).
function M.extract(response)
  return M.parse(response).blocks
end

return M
