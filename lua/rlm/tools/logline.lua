-- One event of a trajectory log as one line of JSON: bounded, valid UTF-8,
-- the writer's fields first. Split from lua/rlm/log.lua, the writer (its
-- file, clock and options); see docs/log.md.
local cjson = require("cjson").new()

-- Numbers that JSON cannot carry are turned into strings below; this is the
-- backstop, so that one never reaches the file as `nan`.
cjson.encode_invalid_numbers(false)

local M = {}

-- The writer's own fields lead each line, in this order; the event's other
-- fields follow, sorted, then log_cut when the line was cut to its budget,
-- and the running cost ends it.
local LEADING = { "type", "ts", "t_ms", "depth", "step" }
local OWN = { ts = true, t_ms = true, cost_usd = true, log_cut = true }

local has_core, core = pcall(require, "rlm.core")
if not (has_core and type(core) == "table") then
  core = {}
end

local REPLACEMENT = "\239\191\189" -- U+FFFD

local function cont(b)
  return b and b >= 0x80 and b <= 0xBF
end

-- The length of the valid UTF-8 sequence at byte i of s (its lead byte c is
-- >= 0x80), or nil when it is not one.
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

-- s as valid UTF-8: every byte that does not belong to a valid sequence
-- becomes U+FFFD. Returns s itself when it is valid already. In C when
-- rlm.core is there: this one's table of parts costs the host about 0.5 us
-- a bad byte (8.6 s of CPU for two tool calls of 16 MB, under Lua 5.4).
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

local utf8_clean = core.utf8_clean or lua_utf8_clean
M.lua_utf8_clean = lua_utf8_clean -- for the spec that holds the two alike

-- Characters in a string of valid UTF-8 (in a raw one, the bytes that are
-- not continuation bytes), counted in C when rlm.core is there.
local function char_count(s)
  if core.utf8_prefix then
    return select(2, core.utf8_prefix(s, 2 ^ 53))
  end
  return #s - select(2, s:gsub("[\128-\191]", ""))
end

-- The byte length of the first n characters of valid UTF-8 s.
local function prefix_bytes(s, n)
  if core.utf8_prefix then
    return (core.utf8_prefix(s, n))
  end
  local i, len = 1, #s
  while n > 0 and i <= len do
    local _, e = s:find("^[%z\1-\127]+", i)
    if e then
      local k = math.min(e - i + 1, n)
      i, n = i + k, n - k
    else
      _, e = s:find("^[\128-\255][\128-\191]*", i)
      i, n = e + 1, n - 1
    end
  end
  return i - 1
end

-- The last n characters of valid UTF-8 s.
local function suffix(s, n)
  local total = char_count(s)
  if n >= total then
    return s
  end
  return s:sub(prefix_bytes(s, total - n) + 1)
end

-- s as valid UTF-8 of at most about `limit` characters. A longer string
-- keeps its first two thirds and its last third around a marker that says
-- how much went, as the host cuts a block's output. The work is bounded by
-- `limit`, not by #s (a prompt may hold megabytes of context).
function M.truncate(s, limit)
  if #s <= limit then
    return utf8_clean(s)
  end
  local tail_n = math.floor(limit / 3)
  local head_n = limit - tail_n
  local head, tail, total
  if #s <= 4 * limit then
    local clean = utf8_clean(s)
    total = char_count(clean)
    if total <= limit then
      return clean
    end
    head, tail = clean, clean
  else
    -- Longer than any `limit` characters can be. Each end is cleaned on its
    -- own: a sequence cut in half at the inner edge becomes U+FFFD there,
    -- beyond the characters kept (4 bytes hold at least one whole one).
    total = char_count(s)
    head = utf8_clean(s:sub(1, 4 * head_n))
    tail = tail_n > 0 and utf8_clean(s:sub(-4 * tail_n)) or ""
  end
  head = head:sub(1, prefix_bytes(head, head_n))
  tail = tail_n > 0 and suffix(tail, tail_n) or ""
  return ("%s\n[rlm.log truncated %d chars]\n%s"):format(head, total - head_n - tail_n, tail)
end

local function bounded_number(v)
  if v ~= v then
    return "NaN"
  elseif v == math.huge then
    return "Infinity"
  elseif v == -math.huge then
    return "-Infinity"
  end
  return v
end

-- Every value is encoded against the line's budget of bytes, st.left (see
-- M.event): what finds it spent is left out with a marker, and st.cut says
-- so. Each value costs at least a byte or two, so the work an event takes is
-- bounded by its budget too, not by how much the event holds.
local CUT = cjson.encode("[rlm.log cut]")
local SMALL_BYTES = 256 -- an event's field that is encoded before the others

local encode_value

local function encode_string(s, limit, st)
  local enc = cjson.encode(M.truncate(s, limit))
  if #enc > st.left then
    -- Cut again to fit: a character takes at most 6 bytes of JSON
    -- ("\u001f"), the truncation marker about 40.
    st.cut = true
    local room = math.floor((st.left - 48) / 6)
    enc = room >= 16 and cjson.encode(M.truncate(s, room)) or CUT
    if #enc > st.left then
      enc = CUT
    end
    st.left = 0 -- what comes after it is cut whole
    return enc
  end
  st.left = st.left - #enc
  return enc
end

-- A table is written as a JSON array when its keys are exactly 1..n.
local function array_length(t)
  local n, max = 0, 0
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k % 1 ~= 0 then
      return nil
    end
    n = n + 1
    if k > max then
      max = k
    end
  end
  return (n > 0 and n == max) and n or nil
end

local function sorted_keys(t, skip)
  local keys = {}
  for k in pairs(t) do
    if not (skip and skip[k]) then
      keys[#keys + 1] = k
    end
  end
  table.sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then
      return ta < tb
    end
    if ta == "number" or ta == "string" then
      return a < b
    end
    return tostring(a) < tostring(b)
  end)
  return keys
end

-- A key is never cut to the budget (two would be the same marker); it is
-- short (max_key_chars), and counts against the budget all the same.
local function encode_key(k, o, st)
  local enc = cjson.encode(M.truncate(tostring(k), o.max_key_chars))
  st.left = st.left - #enc
  return enc
end

-- Appends the members of t named by keys to out as "key":value pairs, at
-- most o.max_items of them, and while the budget lasts.
local function encode_members(t, keys, out, o, depth, st)
  local n = math.min(#keys, o.max_items)
  for i = 1, n do
    if st.left <= 0 then
      st.cut = true
      out[#out + 1] = CUT .. ":" .. cjson.encode(("%d more keys"):format(#keys - i + 1))
      return
    end
    local k = keys[i]
    out[#out + 1] = encode_key(k, o, st) .. ":" .. encode_value(t[k], o, depth, st)
    st.left = st.left - 2
  end
  if #keys > n then
    out[#out + 1] = cjson.encode("[rlm.log truncated]") .. ":"
      .. cjson.encode(("%d more keys"):format(#keys - n))
  end
end

local function encode_table(t, o, depth, st)
  if depth > o.max_depth then
    return cjson.encode("[rlm.log truncated: nested too deep]")
  end
  st.left = st.left - 2
  local out = {}
  local n = array_length(t)
  if n then
    for i = 1, math.min(n, o.max_items) do
      if st.left <= 0 then
        st.cut = true
        out[i] = cjson.encode(("[rlm.log cut %d items]"):format(n - i + 1))
        return "[" .. table.concat(out, ",") .. "]"
      end
      out[i] = encode_value(t[i], o, depth + 1, st)
      st.left = st.left - 1
    end
    if n > o.max_items then
      out[#out + 1] = cjson.encode(("[rlm.log truncated %d items]"):format(n - o.max_items))
    end
    return "[" .. table.concat(out, ",") .. "]"
  end
  encode_members(t, sorted_keys(t), out, o, depth + 1, st)
  return "{" .. table.concat(out, ",") .. "}"
end

function encode_value(v, o, depth, st)
  local tv = type(v)
  if tv == "string" then
    return encode_string(v, o.max_field_chars, st)
  elseif tv == "table" then
    return encode_table(v, o, depth, st)
  end
  local enc
  if tv == "number" then
    enc = cjson.encode(bounded_number(v))
  elseif tv == "boolean" or v == nil or v == cjson.null then
    enc = cjson.encode(v)
  else
    return encode_string(tostring(v), o.max_field_chars, st) -- a function, a coroutine, userdata
  end
  st.left = st.left - #enc
  return enc
end

-- One event as one line of JSON (no newline): the writer's fields and the
-- leading ones first, the rest sorted, every value bounded, the whole about
-- `budget` bytes at most (a few hundred more for the markers). A line that
-- was cut says so in `log_cut`, as `cut_reason` (the writer's "event" or
-- "run": which budget it was).
function M.event(ev, stamp, o, budget, cut_reason)
  local st = { left = budget or math.huge, cut = false }
  local out = {}
  local done = {}
  for _, k in ipairs(LEADING) do
    local v
    if stamp[k] ~= nil then
      v = stamp[k]
    else
      v = ev[k]
    end
    if v ~= nil then
      out[#out + 1] = cjson.encode(k) .. ":" .. encode_value(v, o, 1, st)
    end
    done[k] = true
  end
  for k in pairs(OWN) do
    done[k] = true
  end
  -- The event's own fields all stay, and the small ones first: a big
  -- one (a tool's args) cannot push out the event's name or index, and
  -- is "[rlm.log cut]" itself when the budget is spent.
  local keys = sorted_keys(ev, done)
  local values = {}
  for pass = 1, 2 do
    for i = 1, math.min(#keys, o.max_items) do
      local v = ev[keys[i]]
      local small = type(v) ~= "table" and (type(v) ~= "string" or #v <= SMALL_BYTES)
      if small == (pass == 1) then
        if st.left > 0 then
          values[i] = encode_value(v, o, 1, st)
        else
          st.cut, values[i] = true, CUT
        end
      end
    end
  end
  for i = 1, math.min(#keys, o.max_items) do
    out[#out + 1] = encode_key(keys[i], o, st) .. ":" .. values[i]
  end
  if #keys > o.max_items then
    out[#out + 1] = cjson.encode("[rlm.log truncated]") .. ":"
      .. cjson.encode(("%d more keys"):format(#keys - o.max_items))
  end
  if st.cut then
    out[#out + 1] = '"log_cut":' .. cjson.encode(cut_reason or "event")
  end
  if stamp.cost_usd ~= nil then
    out[#out + 1] = '"cost_usd":' .. encode_value(stamp.cost_usd, o, 1, { left = math.huge })
  end
  return "{" .. table.concat(out, ",") .. "}"
end

return M
