-- The checks an option table is made of: each takes a value and returns
-- ok, "what was wanted" (and, for a value that is wrong in a way worth
-- saying, why). Every module that takes options builds on these, the
-- model client too, so they need nothing but plain Lua (no rlm.core).
local util = require("rlm.base.util")

local M = {}

-- How a bound reads in a message: 2^31 - 1, not 2147483647.
function M.show(n)
  for e = 10, 62 do
    if n == 2 ^ e then
      return "2^" .. e
    elseif n == 2 ^ e - 1 then
      return "2^" .. e .. " - 1"
    end
  end
  return ("%.0f"):format(n)
end

-- An integer from min to max (default: below 2^53). NaN and the infinities
-- fail every comparison or the floor test.
function M.integer(min, max)
  local want = max and ("an integer from %s to %s"):format(M.show(min), M.show(max)) or "an integer >= " .. min
  max = max or 2 ^ 53 - 1
  return function(v)
    return type(v) == "number" and v == math.floor(v) and v >= min and v <= max, want
  end
end

function M.positive_number(v)
  return type(v) == "number" and v > 0 and v < math.huge, "a number > 0"
end

function M.non_negative_number(v)
  return type(v) == "number" and v >= 0 and v < math.huge, "a number >= 0"
end

-- Milliseconds, finite and at most 2^31 - 1 (24.8 days): what a deadline,
-- a CPU rlimit and a C int can all hold.
M.MAX_MS = 2 ^ 31 - 1
function M.milliseconds(v)
  return type(v) == "number" and v > 0 and v <= M.MAX_MS, "a number of milliseconds > 0, up to 2^31 - 1 (24.8 days)"
end

function M.callable(v)
  return util.is_callable(v), "a function (or a callable table)"
end

function M.string(v)
  return type(v) == "string", "a string"
end

function M.non_empty_string(v)
  return type(v) == "string" and v ~= "", "a non-empty string"
end

function M.text_or_callable(v)
  return type(v) == "string" or util.is_callable(v), "a string or a function(default, info) returning one"
end

function M.boolean(v)
  return type(v) == "boolean", "a boolean"
end

-- A list of min to max items (the keys 1..n, nothing else), each one that
-- item(v) takes; want is what the message says was wanted.
function M.list(min, max, item, want)
  return function(v)
    if type(v) ~= "table" then
      return false, want
    end
    local n = #v
    if n < min or n > max then
      return false, want
    end
    for k, x in pairs(v) do
      if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) or not item(x) then
        return false, want
      end
    end
    return true, want
  end
end

-- A string that a command line can carry: not empty, no NUL.
function M.argument(v)
  return type(v) == "string" and v ~= "" and not v:find("\0", 1, true), "a non-empty string without NUL"
end

-- How a value reads in a message: a string quoted, a number as it is,
-- anything else by its type. A secret (an API key given in place of the
-- name of its variable) is never echoed.
function M.describe(v, secret)
  if type(v) == "string" and not secret then
    return ("%q"):format(v)
  elseif type(v) == "number" then
    return tostring(v)
  end
  return type(v)
end

-- The edit distance of a and b (insertions, deletions, substitutions,
-- and swaps of two neighbours), counted up to limit + 1.
local function distance(a, b, limit)
  if math.abs(#a - #b) > limit then
    return limit + 1
  end
  local prev2, prev = {}, {}
  for j = 0, #b do
    prev[j] = j
  end
  for i = 1, #a do
    local cur = { [0] = i }
    local least = i
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      local d = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
      if i > 1 and j > 1 and a:byte(i) == b:byte(j - 1) and a:byte(i - 1) == b:byte(j) then
        d = math.min(d, prev2[j - 2] + 1)
      end
      cur[j] = d
      least = math.min(least, d)
    end
    if least > limit then
      return limit + 1
    end
    prev2, prev = prev, cur
  end
  return prev[#b]
end

-- The name among names that a misspelt one most likely meant, or nil:
-- the nearest within two edits (one for names of four characters or
-- fewer), or the only one it is a prefix of.
function M.suggest(name, names)
  if type(name) ~= "string" or name == "" then
    return nil
  end
  local limit = #name <= 4 and 1 or 2
  local best, best_d, prefixed, n_prefixed = nil, limit + 1, nil, 0
  for _, candidate in ipairs(names) do
    local d = distance(name:lower(), candidate:lower(), limit)
    if d < best_d then
      best, best_d = candidate, d
    end
    if #name >= 3 and candidate:sub(1, #name) == name then
      prefixed, n_prefixed = candidate, n_prefixed + 1
    end
  end
  return best or (n_prefixed == 1 and prefixed or nil)
end

-- The sorted names of a schema (below).
function M.names(schema)
  local names = {}
  for name in pairs(schema) do
    names[#names + 1] = name
  end
  table.sort(names)
  return names
end

-- One option's value, checked or defaulted. rule = { check, default,
-- required = bool, secret = bool, fields = schema }; check(v) returns ok,
-- what was wanted, and, for a value wrong in a way worth saying, why; a
-- check of a table may name the field that is wrong, and its value, as a
-- fourth and fifth result (the message then names 'name.field'). With
-- `fields`, a table's fields are options themselves, checked by M.options
-- as 'name.field' and returned in a new table with their defaults. Raises
-- "<where>: option 'name' ..." at level: the level the caller would give
-- error() for the same place.
function M.option(where, name, rule, v, level)
  if v == nil then
    if rule.required then
      error(("%s: option '%s' is required"):format(where, name), level + 1)
    end
    return rule[2]
  end
  local ok, want, why, field, got = rule[1](v)
  if field ~= nil then
    name, v = name .. "." .. tostring(field), got
  end
  if why then
    error(("%s: option '%s' %s"):format(where, name, why), level + 1)
  elseif not ok then
    error(("%s: option '%s' must be %s, got %s"):format(where, name, want, M.describe(v, rule.secret)),
      level + 1)
  end
  if rule.fields then
    local fields = M.options(where, v, rule.fields, nil, level + 1, name .. ".")
    return fields -- not a tail call: the level counts this frame on every Lua
  end
  return v
end

-- The `backend` field of a `sandbox` option, which names the schema the
-- other fields are checked against (rlm.sandbox.backend checked it).
function M.backend_name(v)
  return type(v) == "string", "a backend's name"
end

-- The fields of a table-valued option (`sandbox`), each checked as an
-- option of its own named "option.field" (M.option), a field the schema
-- does not know refused with the nearest known one; note is said after
-- the option's name (for which backend). Returns a new table of every
-- field, set or defaulted. level as for M.options.
function M.fields(where, option, v, schema, level, note)
  level = level + 1
  local names = M.names(schema)
  for k in pairs(v) do
    if type(k) ~= "string" or not schema[k] then
      local near = M.suggest(k, names)
      error(("%s: option '%s' has no field '%s'%s (%sknown: %s)"):format(where, option, tostring(k), note or "",
        near and ("did you mean '%s'? "):format(near) or "", table.concat(names, ", ")), level)
    end
  end
  local out = {}
  for name, rule in pairs(schema) do
    out[name] = M.option(where, option .. "." .. name, rule, v[name], level)
  end
  return out
end

-- The one option validator: opts checked against schema (name -> rule, as
-- for M.option), unknown names refused with the nearest known one, and a
-- new table returned with every option of the schema set or defaulted
-- (opts itself is left as it was). nil opts is an empty table. names is
-- M.names(schema), when the caller keeps it. level is the level the caller
-- would give error() for the same place (default 2: the caller of a new()
-- that calls this itself). prefix, for the fields of a table option
-- ("compact."), goes before every name in the messages.
function M.options(where, opts, schema, names, level, prefix)
  level = (level or 2) + 1
  prefix = prefix or ""
  if opts == nil then
    opts = {}
  elseif type(opts) ~= "table" then
    error(("%s: expected a table of options, got %s"):format(where, type(opts)), level)
  end
  names = names or M.names(schema)
  for k in pairs(opts) do
    if type(k) ~= "string" or not schema[k] then
      local near = M.suggest(k, names)
      local known = {}
      for i, name in ipairs(names) do
        known[i] = prefix .. name
      end
      error(("%s: unknown option '%s%s' (%sknown: %s)"):format(where, prefix, tostring(k),
        near and ("did you mean '%s%s'? "):format(prefix, near) or "", table.concat(known, ", ")), level)
    end
  end
  local out = {}
  for name, rule in pairs(schema) do
    out[name] = M.option(where, prefix .. name, rule, opts[name], level)
  end
  return out
end

return M
