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

return M
