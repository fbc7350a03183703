-- How the lines of a model's response read: its fences (``` or ~~~, three
-- or more) and its final-answer lines. One reading, shared by the reply's
-- parse (rlm.engine.reply) and the other families' forms it rewrites
-- first (rlm.engine.forms).
local M = {}

function M.trim(s)
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


function M.split_lines(s)
  local lines = {}
  for line in (s .. "\n"):gmatch("(.-)\r?\n") do
    lines[#lines + 1] = line
  end
  return lines
end

-- The block's lines without the fence's own indent, then without the
-- indent all its lines share (a block inside a numbered list).
function M.dedent(lines, indent)
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
M.FINAL_START = "^[ \t]*[%*`>_]*[ \t]*()FINAL(_?V?A?R?)[ \t]*%("

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
function M.final_at(text)
  local start, suffix = text:match(M.FINAL_START)
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
function M.open_fence(line)
  local indent, fence, info = line:match("^([ \t]*)(```+)[ \t]*([^`]-)[ \t]*$")
  if not fence then
    indent, fence, info = line:match("^([ \t]*)(~~~+)[ \t]*(.-)[ \t]*$")
  end
  return indent, fence, info
end

-- The line that closes the fence opened at line i, or nil.
function M.fence_end(lines, i, fence)
  local ch = fence:sub(1, 1)
  for j = i + 1, #lines do
    local close = lines[j]:match("^[ \t]*([`~]+)[ \t]*$")
    if close and close:sub(1, 1) == ch and #close >= #fence and not close:find(ch == "`" and "~" or "`") then
      return j
    end
  end
  return nil
end

return M
