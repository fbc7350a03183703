-- Text as the model sees it: UTF-8 lengths and truncation.
local core = require("rlm.core")

local M = {}

-- Room for the driver's own "[truncated N chars]" marker before the host
-- cuts again.
local MARKER_SLACK = 64

function M.utf8_len(s)
  return select(2, core.utf8_prefix(s, 2 ^ 53))
end

-- Cuts s to about `limit` characters, as the driver should have (it is not
-- trusted to). Output keeps its first two thirds and its last third, so the
-- model sees how it ended; a traceback keeps its end, where the error is.
function M.cut(s, limit, keep_end)
  if core.utf8_prefix(s, limit + MARKER_SLACK) >= #s then
    return s
  end
  local total = M.utf8_len(s)
  local tail = keep_end and limit or math.floor(limit / 3)
  local head = limit - tail
  local head_bytes = core.utf8_prefix(s, head)
  local tail_start = core.utf8_prefix(s, total - tail)
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
  s = s:sub(1, core.utf8_prefix(s, 2 * MAX_LINE))
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
  local keep = core.utf8_prefix(s, MAX_LINE)
  if keep < #s then
    s = s:sub(1, keep) .. " [cut]"
  end
  return s ~= "" and s or "(an error without a message)"
end

return M
