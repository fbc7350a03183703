-- JSON for the protocol's lines and for values that cross into the sandbox,
-- with numbers kept exact (docs/protocol.md, "Numbers"). lua-cjson does the
-- strings and whatever it writes exactly; the rest is walked here.
local cjson = require("cjson")

local M = {}

local json = cjson.new()
json.decode_invalid_numbers(false)
json.decode_max_depth(200)
json.encode_invalid_numbers(false)
json.encode_sparse_array(false)

M.null = cjson.null

-- Numbers, exactly (docs/protocol.md, "Numbers"). A Lua 5.3+ integer is
-- written as an integer (all 64 bits). A float that is integral and below
-- 2^53 in size is written as an integer too: Lua 5.1 and LuaJIT cannot tell
-- 3 from 3.0, lua-cjson decodes every number as a float, and options like
-- 16 * 2^20 are floats on 5.3+. Any other float is written with its
-- shortest round-trip digits (up to 17), as a float ("1e+20", "0.1").
-- lua-cjson's own encoder keeps 14 digits, so the walk is ours; strings go
-- through lua-cjson.
local math_type = rawget(math, "type") -- Lua 5.3+; nil on 5.1 and LuaJIT
local tointeger = rawget(math, "tointeger")
local integers
M.INT_BITS = math_type and 64 or 53 -- what a Lua number holds exactly

local function float_text(n)
  if n ~= n or n == math.huge or n == -math.huge then
    error("Cannot serialise number: must not be NaN or Infinity", 0)
  end
  local text = ("%.15g"):format(n)
  if tonumber(text) ~= n then
    text = ("%.17g"):format(n)
  end
  if not text:find("[%.eEn]") then
    text = text .. ".0"
  end
  return text
end

local function number_text(n)
  if math_type and math_type(n) == "integer" then
    return tostring(n)
  end
  if n == math.floor(n) and n > -2 ^ 53 and n < 2 ^ 53 then
    if n > -1e14 and n < 1e14 then
      return ("%d"):format(n)
    end
    return ("%.0f"):format(n)
  end
  return float_text(n)
end

-- An object key: a string as it is, a number as its text (as lua-cjson
-- does), anything else refused.
local function key_text(k)
  if type(k) == "number" then
    if k == math.floor(k) and k > -2 ^ 63 and k < 2 ^ 63 then
      return ("%.0f"):format(k)
    end
    return float_text(k)
  end
  error("Cannot serialise table: key of type " .. type(k), 0)
end

local MAX_ENCODE_DEPTH = 1000
local encode_string = json.encode

local encode_value

-- A table is a list when its keys are exactly 1..n (n >= 1); an empty table
-- is an object, as in lua-cjson. A list with holes is refused (lua-cjson
-- would fill some with null, or refuse).
local function encode_table(t, out, n, depth)
  if depth > MAX_ENCODE_DEPTH then
    error("Cannot serialise, excessive nesting (" .. MAX_ENCODE_DEPTH .. ")", 0)
  end
  local len = #t
  if len > 0 and next(t, len) == nil then
    -- 1..len present, and nothing after len in the traversal: a list
    -- unless a key other than 1..len came earlier.
    local count = 0
    for _ in pairs(t) do
      count = count + 1
    end
    if count == len then
      n = n + 1
      out[n] = "["
      for i = 1, len do
        if i > 1 then
          n = n + 1
          out[n] = ","
        end
        n = encode_value(t[i], out, n, depth)
      end
      n = n + 1
      out[n] = "]"
      return n
    end
  end
  local max, all_ints = 0, true
  for k in pairs(t) do
    if type(k) == "number" and k >= 1 and k == math.floor(k) then
      if k > max then
        max = k
      end
    else
      all_ints = false
      break
    end
  end
  if all_ints and max > 0 then
    error("Cannot serialise table: a list with holes (sparse array)", 0)
  end
  n = n + 1
  out[n] = "{"
  local first = true
  for k, v in pairs(t) do
    local name = k
    if type(k) ~= "string" then
      name = key_text(k)
      if t[name] ~= nil then
        -- {[1] = "a", ["1"] = "b"}: one JSON key; Python would keep one.
        error(("Cannot serialise table: the keys %s and %q are both %q in JSON"):format(tostring(k), name, name), 0)
      end
    end
    n = n + 1
    out[n] = first and encode_string(name) or "," .. encode_string(name)
    first = false
    n = n + 1
    out[n] = ":"
    n = encode_value(v, out, n, depth)
  end
  n = n + 1
  out[n] = "}"
  return n
end

function encode_value(v, out, n, depth)
  local tv = type(v)
  n = n + 1
  if tv == "string" then
    out[n] = encode_string(v)
  elseif tv == "number" then
    out[n] = number_text(v)
  elseif tv == "boolean" then
    out[n] = v and "true" or "false"
  elseif v == nil or v == cjson.null then
    out[n] = "null"
  elseif tv == "table" then
    return encode_table(v, out, n - 1, depth + 1)
  else
    error("Cannot serialise " .. tv .. ": type not supported", 0)
  end
  return n
end

-- Whether lua-cjson writes v as encode_value would: every number an
-- integer below 1e14 in size or a fraction its 14 digits hold exactly, no
-- number keys, no list with holes. Then lua-cjson, ten times as fast as the
-- walk above, does the writing.
local function cjson_safe(v, depth)
  local tv = type(v)
  if tv == "number" then
    if v == math.floor(v) then
      return v > -1e14 and v < 1e14
    end
    return tonumber(("%.14g"):format(v)) == v
  elseif tv ~= "table" then
    return tv == "string" or tv == "boolean" or v == cjson.null
  end
  if depth > MAX_ENCODE_DEPTH then
    return false
  end
  local len, count = #v, 0
  for k, item in pairs(v) do
    count = count + 1
    if type(k) ~= (len > 0 and "number" or "string") or not cjson_safe(item, depth + 1) then
      return false
    end
  end
  return count == len or len == 0
end

-- Raises on what JSON cannot carry (functions, sparse arrays, NaN, keys
-- that collide).
function M.encode(v)
  if cjson_safe(v, 0) then
    return json.encode(v)
  end
  local out = {}
  encode_value(v, out, 0, 0)
  return table.concat(out)
end

-- Turns every number of a decoded value into an integer (all were
-- integers within 2^53: see rlm.protocol's decode).
function integers(v)
  for k, item in pairs(v) do
    if type(item) == "number" then
      v[k] = tointeger(item) or item
    elseif type(item) == "table" then
      integers(item)
    end
  end
end

-- Whether every number in a decoded value is finite. lua-cjson reads a
-- number past a double's range (1e999, an integer of 310 digits) as
-- inf; the protocol carries no such number (the driver's json.dumps
-- writes none). Tables nest at most decode_max_depth (200) deep.
function M.finite(v)
  if type(v) == "number" then
    return v == v and v ~= math.huge and v ~= -math.huge
  elseif type(v) == "table" then
    for _, item in pairs(v) do
      if type(item) ~= "string" and not M.finite(item) then
        return false
      end
    end
  end
  return true
end

-- Decodes the JSON text of a FINAL_VAR value, keeping what lua-cjson loses:
-- an integer token is a Lua integer on 5.3+ (a float past 64 bits, which
-- the driver refuses to send), a token with a fraction or an exponent a
-- float. At most max_values values and 200 levels. -> value | nil, why.
function M.decode_value(text, max_values)
  local pos, count = 1, 0
  local parse
  local function fail(why)
    error({ why = why .. " at byte " .. pos }, 0)
  end
  local function skip()
    pos = text:find("[^ \t\r\n]", pos) or #text + 1
  end
  local function parse_string()
    local i = pos + 1
    while true do
      local j = text:find('["\\]', i)
      if not j then
        fail("an unterminated string")
      end
      if text:sub(j, j) == '"' then
        local ok, str = pcall(json.decode, text:sub(pos, j))
        if not ok then
          fail("a bad string")
        end
        pos = j + 1
        return str
      end
      i = j + 2
    end
  end
  function parse(depth)
    if depth > 200 then
      fail("nesting deeper than 200")
    end
    count = count + 1
    if count > max_values then
      fail(("more than %d values"):format(max_values))
    end
    skip()
    local c = text:sub(pos, pos)
    if c == "{" then
      local t = {}
      pos = pos + 1
      skip()
      if text:sub(pos, pos) == "}" then
        pos = pos + 1
        return t
      end
      while true do
        skip()
        if text:sub(pos, pos) ~= '"' then
          fail("an object key that is not a string")
        end
        local k = parse_string()
        skip()
        if text:sub(pos, pos) ~= ":" then
          fail("a missing ':'")
        end
        pos = pos + 1
        t[k] = parse(depth + 1)
        skip()
        c = text:sub(pos, pos)
        pos = pos + 1
        if c == "}" then
          return t
        elseif c ~= "," then
          fail("a missing ',' or '}'")
        end
      end
    elseif c == "[" then
      local t, n = {}, 0
      pos = pos + 1
      skip()
      if text:sub(pos, pos) == "]" then
        pos = pos + 1
        return t
      end
      while true do
        n = n + 1
        t[n] = parse(depth + 1)
        skip()
        c = text:sub(pos, pos)
        pos = pos + 1
        if c == "]" then
          return t
        elseif c ~= "," then
          fail("a missing ',' or ']'")
        end
      end
    elseif c == '"' then
      return parse_string()
    elseif text:find("^true", pos) then
      pos = pos + 4
      return true
    elseif text:find("^false", pos) then
      pos = pos + 5
      return false
    elseif text:find("^null", pos) then
      pos = pos + 4
      return cjson.null
    end
    local int = text:match("^-?%d+", pos)
    if not int then
      fail("an unexpected character")
    end
    local frac = text:match("^%.%d+", pos + #int) or ""
    local exp = text:match("^[eE][-+]?%d+", pos + #int + #frac) or ""
    local token = int .. frac .. exp
    pos = pos + #token
    local n = tonumber(token)
    if n ~= n or n == math.huge or n == -math.huge then
      fail("a number past a double's range")
    end
    if frac == "" and exp == "" then
      -- 5.3+: an integer when it fits in 64 bits. One past what a Lua
      -- number holds exactly the driver refuses to send.
      if math_type and math_type(n) ~= "integer" or not math_type and (n > 2 ^ 53 or n < -2 ^ 53) then
        fail("an integer past " .. M.INT_BITS .. " bits")
      end
      return n
    end
    if math_type and math_type(n) == "integer" then
      return n + 0.0
    end
    return n
  end
  local ok, v = pcall(function()
    local value = parse(0)
    skip()
    if pos <= #text then
      fail("text after the value")
    end
    return value
  end)
  if not ok then
    return nil, type(v) == "table" and v.why or tostring(v)
  end
  return v
end

-- lua-cjson's encoder alone, for a message the host built of strings,
-- booleans and integers below 1e14 in size (an llm_result): what it writes
-- for those is what M.encode writes, without the walk that checks.
M.encode_plain = json.encode

-- The raw decoder (lua-cjson, numbers as it reads them; raises on bad JSON)
-- and the walk that makes every number of a decoded value an integer.
M.decode = json.decode
M.integers = integers

return M
