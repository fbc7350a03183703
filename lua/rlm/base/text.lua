-- Text as the model sees it: UTF-8 lengths, validity and truncation. The
-- one Lua module over UTF-8: rlm.core's (csrc/utf8.c) when it loads, else
-- the same rules in Lua, for what runs without the core (rlm.log: docs/log.md).
local has_core, core = pcall(require, "rlm.core")
if not (has_core and type(core) == "table") then
  core = {}
end

local M = {}

-- Room for the driver's own "[truncated N chars]" marker before the host
-- cuts again.
local MARKER_SLACK = 64

local function cont(b)
  return b and b >= 0x80 and b <= 0xBF
end

-- The length of the valid UTF-8 sequence at byte i of s (its lead byte c is
-- >= 0x80), or nil when it is not one: no overlong form, no surrogate,
-- nothing past U+10FFFF (what Python's strict decoder takes).
local function sequence_len(s, i, c)
  local c1, c2, c3 = s:byte(i + 1, i + 3)
  if c >= 0xC2 and c <= 0xDF then
    return cont(c1) and 2 or nil
  end
  if c >= 0xE0 and c <= 0xEF then
    local lo = (c == 0xE0) and 0xA0 or 0x80 -- no overlong forms
    local hi = (c == 0xED) and 0x9F or 0xBF -- no surrogates
    return (c1 and c1 >= lo and c1 <= hi and cont(c2)) and 3 or nil
  end
  if c >= 0xF0 and c <= 0xF4 then
    local lo = (c == 0xF0) and 0x90 or 0x80
    local hi = (c == 0xF4) and 0x8F or 0xBF -- nothing past U+10FFFF
    return (c1 and c1 >= lo and c1 <= hi and cont(c2) and cont(c3)) and 4 or nil
  end
  return nil
end

-- The length of the longest prefix of s that is valid UTF-8.
local function lua_valid_prefix(s)
  local i = 1
  while true do
    i = s:find("[\128-\255]", i)
    if not i then
      return #s
    end
    local len = sequence_len(s, i, s:byte(i))
    if not len then
      return i - 1
    end
    i = i + len
  end
end
local valid_prefix = core.utf8_valid or lua_valid_prefix

-- Whether s is valid UTF-8: true, or false and the position of its first
-- bad byte.
function M.utf8_valid(s)
  local n = valid_prefix(s)
  if n == #s then
    return true
  end
  return false, n + 1
end

local REPLACEMENT = "\239\191\189" -- U+FFFD

-- s as valid UTF-8: every byte that does not belong to a valid sequence
-- becomes U+FFFD; s itself when it is valid. (In Lua, its table of parts
-- costs about 0.5 us a bad byte: 8.6 s of CPU for two tool calls of 16 MB
-- under Lua 5.4, against one pass in C.)
local function lua_utf8_clean(s)
  local i, n = 1, #s
  local parts, from = nil, 1
  while true do
    i = s:find("[\128-\255]", i)
    if not i then
      break
    end
    local len = sequence_len(s, i, s:byte(i))
    if len then
      i = i + len
    else
      parts = parts or {}
      parts[#parts + 1] = s:sub(from, i - 1)
      parts[#parts + 1] = REPLACEMENT
      i = i + 1
      from = i
    end
  end
  if not parts then
    return s
  end
  parts[#parts + 1] = s:sub(from, n)
  return table.concat(parts)
end
M.utf8_clean = core.utf8_clean or lua_utf8_clean

-- utf8_prefix(s, n) -> bytes, chars: the byte length of the first n
-- characters of s (a lead byte starts one; a stray continuation byte
-- counts with the character before it), and how many that is (all of s's
-- when it holds fewer). The Lua one is for valid UTF-8 (what the log cuts
-- is cleaned first).
local function lua_utf8_prefix(s, n)
  local i, len, chars = 1, #s, 0
  while n > 0 and i <= len do
    local _, e = s:find("^[%z\1-\127]+", i)
    if e then
      local k = math.min(e - i + 1, n)
      i, n, chars = i + k, n - k, chars + k
    else
      _, e = s:find("^[\128-\255][\128-\191]*", i)
      i, n, chars = e + 1, n - 1, chars + 1
    end
  end
  return i - 1, chars
end
local utf8_prefix = core.utf8_prefix or lua_utf8_prefix
M.utf8_prefix = utf8_prefix

-- utf8_str_size(s) -> bytes, chars: what Python's str of s holds (PEP 393:
-- 1, 2 or 4 bytes a character; a surrogate for each byte that is not
-- UTF-8), and its characters. rlm.core's only (the session's checks).
M.utf8_str_size = core.utf8_str_size

function M.utf8_len(s)
  if core.utf8_prefix then
    return select(2, core.utf8_prefix(s, 2 ^ 53))
  end
  return #s - select(2, s:gsub("[\128-\191]", ""))
end

-- Cuts s to about `limit` characters, as the driver should have (it is not
-- trusted to). Output keeps its first two thirds and its last third, so the
-- model sees how it ended; a traceback keeps its end, where the error is.
function M.cut(s, limit, keep_end)
  if utf8_prefix(s, limit + MARKER_SLACK) >= #s then
    return s
  end
  local total = M.utf8_len(s)
  local tail = keep_end and limit or math.floor(limit / 3)
  local head = limit - tail
  local head_bytes = utf8_prefix(s, head)
  local tail_start = utf8_prefix(s, total - tail)
  local marker = ("[truncated %d chars]"):format(total - limit)
  if keep_end then
    return marker .. "\n" .. s:sub(tail_start + 1)
  end
  return s:sub(1, head_bytes) .. "\n" .. marker .. "\n" .. s:sub(tail_start + 1)
end

-- Lua's position of a raise is "chunk:line: " (luaL_where), the chunk a
-- file's path (spaces, drive letters and all), a `[string "..."]` or a
-- `=name`, cut to LUA_IDSIZE (60) bytes. Every search below looks at most
-- this far from where it starts: a long error line costs linear time.
local MAX_CHUNK = 60
local WINDOW = MAX_CHUNK + 24 -- the chunk, ":line:" and the space after it

-- Where a position that starts at `at` ends (the index after it), or nil.
local function position_end(s, at)
  local head = s:sub(at, at + WINDOW)
  local _, j = head:find('^%[string ".-"%]:%d+:')
  if not j then
    local i
    i, j = head:find(":%d+:")
    if not i or i == 1 or i > MAX_CHUNK + 1 then
      return nil
    end
    -- A chunk name never holds ": " (prose does), and one with spaces
    -- starts as a path does ("/", ".", "~", "\", "C:"): "failed - x.lua:3: "
    -- keeps its "failed - " (the path in it goes below).
    local chunk = head:sub(1, i - 1)
    if chunk:find(": ", 1, true) or (chunk:find(" ", 1, true) and not chunk:find("^[/.~\\]")
        and not chunk:find("^%a:[/\\]")) then
      return nil
    end
  end
  local after = head:sub(j + 1, j + 1)
  if after == " " then
    return at + j + 1
  end
  return after == "" and at + j or nil
end

-- The start of a position that ends at `i` (its ":line: "), away from the
-- starts position_end looks at: a `[string "..."]`, or a space-free token
-- that names a file (a "/" or "\", or a .lua chunk). Or nil.
local function inner_position(s, i)
  local from = math.max(1, i - MAX_CHUNK)
  local before = s:sub(from, i - 1)
  local at = before:match('()%[string "[^\n]-"%]$')
  if not at then
    at = before:match("()%S+$")
    local token = at and before:sub(at)
    if not token or not (token:find("[/\\]") or token:find("%.lua$")) then
      return nil
    end
  end
  return from + at - 1
end

-- tostring's "table: 0x55..." (LuaJIT's "cdata<...>: 0x..." and "file
-- (0x...)" below): the type stays, the address goes.
local ADDRESSED = { table = true, ["function"] = true, thread = true, userdata = true, proto = true }
local function address(kind)
  return ADDRESSED[kind] and kind or nil
end

-- The characters of an error line the sandbox gets (a cause goes in its
-- first line, and a child's driver writes its own fatal message).
local MAX_LINE = 4000

-- What the sandbox sees of an error raised or returned on the host (a
-- callback's, a nested session's): its first line, without the host's
-- paths and heap addresses that Lua puts in it. Gone: the position of a
-- raise ("chunk:line: ", docs/security.md) at the start and after each
-- ": " (where a rethrow or a prefix joined it to its cause, stacked ones
-- too), a `[string "..."]:line: ` or a path's "file:line: " anywhere, and
-- the address of a table, function, thread or userdata ("table: 0x55...",
-- from tostring). The rest of the words are the host's own, up to
-- MAX_LINE characters.
function M.error_line(e)
  if type(e) ~= "string" and type(e) ~= "number" then
    local mt = getmetatable(e)
    local ok, text = false, nil
    if type(mt) == "table" and mt.__tostring then
      ok, text = pcall(tostring, e)
    end
    e = ok and type(text) == "string" and text or ("an error value of type " .. type(e))
  end
  local s = tostring(e):match("^[^\n]*")
  s = s:sub(1, utf8_prefix(s, 2 * MAX_LINE))
  -- The positions at the start and after each ": ".
  local out, at = {}, 1
  while true do
    local stop = position_end(s, at)
    while stop do
      at = stop
      stop = position_end(s, at)
    end
    local sep = s:find(": ", at, true)
    out[#out + 1] = s:sub(at, sep and sep + 1)
    if not sep then
      break
    end
    at = sep + 2
  end
  -- The positions anywhere else.
  s, out, at = table.concat(out), {}, 1
  while true do
    local i, j = s:find(":%d+: ", at)
    local start = i and inner_position(s, i)
    if start and start >= at then
      out[#out + 1] = s:sub(at, start - 1)
      at = j + 1
    elseif not i then
      out[#out + 1] = s:sub(at)
      break
    else
      out[#out + 1] = s:sub(at, j)
      at = j + 1
    end
  end
  s = table.concat(out):gsub("%f[%a](%a+): 0x%x+", address):gsub("(cdata<[^<>]*>): 0x%x+", "%1")
  s = s:gsub("file %(0x%x+%)", "file")
  local keep = utf8_prefix(s, MAX_LINE)
  if keep < #s then
    s = s:sub(1, keep) .. " [cut]"
  end
  return s ~= "" and s or "(an error without a message)"
end

return M
