-- One event of a trajectory log as one line of JSON: bounded, valid UTF-8,
-- the writer's fields first. Split from lua/rlm/log.lua, the writer (its
-- file, clock and options); see docs/log.md.
local json = require("rlm.base.json")
local text = require("rlm.base.text")

-- Strings and the numbers below go through rlm.base.json's lua-cjson
-- (encode_plain: a NaN raises there, never reaching the file as `nan`;
-- they are turned into strings first). The walk of tables is this file's:
-- a line is bounded by its budget, its keys sorted, its strings cut and
-- repaired, which lua-cjson's encoder cannot do (docs/log.md).
local encode = json.encode_plain

local M = {}

-- The writer's own fields lead each line, in this order; the event's other
-- fields follow, sorted, then log_cut when the line was cut to its budget,
-- and the running cost ends it.
local LEADING = { "type", "ts", "t_ms", "depth", "step" }
local OWN = { ts = true, t_ms = true, cost_usd = true, log_cut = true }

-- UTF-8 (rlm.base.text: in C when rlm.core is there, else in Lua).
local utf8_clean, char_count = text.utf8_clean, text.utf8_len

-- The byte length of the first n characters of valid UTF-8 s.
local function prefix_bytes(s, n)
  return (text.utf8_prefix(s, n))
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
local CUT = encode("[rlm.log cut]")
local SMALL_BYTES = 256 -- an event's field that is encoded before the others

local encode_value

local function encode_string(s, limit, st)
  local enc = encode(M.truncate(s, limit))
  if #enc > st.left then
    -- Cut again to fit: a character takes at most 6 bytes of JSON
    -- ("\u001f"), the truncation marker about 40.
    st.cut = true
    local room = math.floor((st.left - 48) / 6)
    enc = room >= 16 and encode(M.truncate(s, room)) or CUT
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
  local enc = encode(M.truncate(tostring(k), o.max_key_chars))
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
      out[#out + 1] = CUT .. ":" .. encode(("%d more keys"):format(#keys - i + 1))
      return
    end
    local k = keys[i]
    out[#out + 1] = encode_key(k, o, st) .. ":" .. encode_value(t[k], o, depth, st)
    st.left = st.left - 2
  end
  if #keys > n then
    out[#out + 1] = encode("[rlm.log truncated]") .. ":"
      .. encode(("%d more keys"):format(#keys - n))
  end
end

local function encode_table(t, o, depth, st)
  if depth > o.max_depth then
    return encode("[rlm.log truncated: nested too deep]")
  end
  st.left = st.left - 2
  local out = {}
  local n = array_length(t)
  if n then
    for i = 1, math.min(n, o.max_items) do
      if st.left <= 0 then
        st.cut = true
        out[i] = encode(("[rlm.log cut %d items]"):format(n - i + 1))
        return "[" .. table.concat(out, ",") .. "]"
      end
      out[i] = encode_value(t[i], o, depth + 1, st)
      st.left = st.left - 1
    end
    if n > o.max_items then
      out[#out + 1] = encode(("[rlm.log truncated %d items]"):format(n - o.max_items))
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
    enc = encode(bounded_number(v))
  elseif tv == "boolean" or v == nil or v == json.null then
    enc = encode(v)
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
      out[#out + 1] = encode(k) .. ":" .. encode_value(v, o, 1, st)
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
    out[#out + 1] = encode("[rlm.log truncated]") .. ":"
      .. encode(("%d more keys"):format(#keys - o.max_items))
  end
  if st.cut then
    out[#out + 1] = '"log_cut":' .. encode(cut_reason or "event")
  end
  if stamp.cost_usd ~= nil then
    out[#out + 1] = '"cost_usd":' .. encode_value(stamp.cost_usd, o, 1, { left = math.huge })
  end
  return "{" .. table.concat(out, ",") .. "}"
end

return M
