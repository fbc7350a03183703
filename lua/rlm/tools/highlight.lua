-- Python, cut into the pieces a viewer colours: keywords, the REPL's and
-- Python's own functions, strings, comments, numbers, decorators, the rest.
-- A scanner, not a parser: each piece is the longest one that starts where
-- the last ended, so the pieces always join up to the text it was given, as
-- it was (bad code, half a string, bytes that are not UTF-8 included). It
-- only splits: escaping is the caller's (rlm.view escapes every piece).
--
--   for _, piece in ipairs(highlight.python(code)) do -- { class, text }
local M = {}

local function set(words)
  local t = {}
  for w in words:gmatch("%S+") do
    t[w] = true
  end
  return t
end

local KEYWORDS = set([[False None True and as assert async await break class continue def del elif else
  except finally for from global if import in is lambda nonlocal not or pass raise return try while with
  yield match case]])

-- The REPL's names (docs/prompt.md) and the builtins a model's code uses
-- most.
local NAMES = set([[context llm_query llm_query_batched rlm_query rlm_query_batched FINAL FINAL_VAR SHOW_VARS
  print len range enumerate zip sorted reversed min max sum any all map filter isinstance type str int float
  bool list dict set tuple repr open round abs]])

-- The end of a string that opened with `quote` at i (its prefix before
-- i): one past the closing quote, or the end of the line (a single-quoted
-- string cannot cross one) or of the text when it never closes.
local function string_end(s, i, quote)
  local n = #s
  local j = i + #quote
  while j <= n do
    local c = s:sub(j, j)
    if c == "\\" then
      j = j + 2
    elseif s:sub(j, j + #quote - 1) == quote then
      return j + #quote
    elseif c == "\n" and #quote == 1 then
      return j
    else
      j = j + 1
    end
  end
  return n + 1
end

-- Whether only blanks stand before i on its line (a decorator's place; a
-- @ elsewhere is matrix multiplication). Looks back over the blanks only.
local function starts_line(s, i)
  local j = i - 1
  while j >= 1 and (s:byte(j) == 32 or s:byte(j) == 9) do
    j = j - 1
  end
  return j == 0 or s:byte(j) == 10
end

-- python(code) -> { { class, text }, ... }; class is "k" (keyword), "b" (a
-- known name), "s" (string), "c" (comment), "n" (number), "d" (decorator)
-- or false (the rest).
function M.python(code)
  local pieces, n, i = {}, #code, 1
  local function add(class, j)
    local text = code:sub(i, j - 1)
    local last = pieces[#pieces]
    if last and last[1] == class and not class then
      last[2] = last[2] .. text
    else
      pieces[#pieces + 1] = { class, text }
    end
    i = j
  end
  while i <= n do
    local c = code:sub(i, i)
    local prefix = code:match("^[rRbBuUfF][rRbBuUfF]?()['\"]", i)
    if c == "#" then
      add("c", (code:find("\n", i, true) or n + 1))
    elseif c == "'" or c == '"' or prefix then
      local at = prefix or i
      local q = code:sub(at, at)
      local quote = code:sub(at, at + 2) == q:rep(3) and q:rep(3) or q
      add("s", string_end(code, at, quote))
    elseif c:find("[%a_]") then
      local j = code:match("^[%w_]*()", i + 1)
      local word = code:sub(i, j - 1)
      add(KEYWORDS[word] and "k" or NAMES[word] and "b" or false, j)
    elseif c:find("%d") or (c == "." and code:sub(i + 1, i + 1):find("%d")) then
      add("n", code:match("^[%w_.]*()", i + 1))
    elseif c == "@" and code:sub(i + 1, i + 1):find("[%a_]") and starts_line(code, i) then
      add("d", code:match("^[%w_.]*()", i + 1))
    else
      -- Up to the next piece that may start something: a run of the rest
      -- keeps a character of several bytes whole.
      add(false, code:match("^.[^%a_%d#'\"@.]*()", i))
    end
  end
  return pieces
end

return M
