-- The journal's store seam (docs/durability.md): what a store is, the keys
-- and values it takes, and the one way the journal calls it. A store is the
-- host's object (or rlm.journal.file's, rlm.journal.redis's) with four
-- methods, each of which may yield (under an adapter its calls run where the
-- host runs callbacks, as the sub-call cache's do):
--
--   store:get(key)                         -> value | nil (none)
--   store:set(key, value)                  -> true
--   store:delete(key)                      -> true (none is no failure)
--   store:set_if(guard, expected, key, value)
--                                          -> true | false, current
--
-- set_if is the one atomic operation: when guard's value is expected (nil:
-- guard is absent), key gets value (nil: key is deleted), and true comes
-- back; otherwise nothing changes and false comes back with guard's value
-- as it is (nil: absent). guard and key may be the same key (a compare and
-- swap). The lease (rlm.journal.lease) is built on it alone.
--
-- A failure either raises or returns nil, message (as ngx.shared's and
-- lua-resty-redis's methods do); call() makes both one: nil, err.
local util = require("rlm.base.util")

local M = {}

-- The methods a store has, in the order the docs list them.
M.METHODS = { "get", "set", "delete", "set_if" }

-- The longest key (the file store's names: well under NAME_MAX with the
-- room its temporary files take) and the largest value a store is given by
-- default: a step's record is some kilobytes (docs/durability.md), and the
-- bound keeps a runaway from filling a disk or a Redis.
M.MAX_KEY_BYTES = 200
M.MAX_VALUE_BYTES = 16 * 2 ^ 20

-- The journal's errors: err.kind is one of
--   lease_held     another owner holds the session's lease (err.owner,
--                  err.fence, err.expires)
--   lease_lost     this owner's lease is no longer the session's (expired
--                  and taken over, or released): its writes are refused
--   journal_error  the store failed (err.message says how), or an entry is
--                  not a record of this version
local Error = {}
Error.__index = Error

function Error.__tostring(e)
  return "rlm.journal: " .. e.kind .. ": " .. e.message
end

function M.error(kind, message, fields)
  local e = { kind = kind, message = message }
  for k, v in pairs(fields or {}) do
    e[k] = v
  end
  return setmetatable(e, Error)
end

-- Raises, naming the argument, unless key is a journal key: 1 to
-- MAX_KEY_BYTES of letters, digits, '_', '-' and '.', not first a '.'
-- (no path, no separator, nothing a store must escape).
function M.check_key(key, what)
  what = what or "key"
  if type(key) ~= "string" then
    error(("rlm.journal: %s must be a string, not %s"):format(what, type(key)), 3)
  end
  if #key == 0 or #key > M.MAX_KEY_BYTES or key:find("^%.") or key:find("[^%w_.%-]") then
    error(("rlm.journal: %s %q is not a journal key (1 to %d of A-Z a-z 0-9 _ - ., not first a .)"):format(
      what, key, M.MAX_KEY_BYTES), 3)
  end
end

-- Raises unless value is a string of at most max bytes (nil too when
-- nil_ok).
function M.check_value(value, max, nil_ok, what)
  what = what or "value"
  if value == nil and nil_ok then
    return
  end
  if type(value) ~= "string" then
    error(("rlm.journal: %s must be a string, not %s"):format(what, type(value)), 3)
  end
  if #value > max then
    error(("rlm.journal: %s of %d bytes is larger than the store's max_value_bytes (%d)"):format(what, #value, max), 3)
  end
end

-- Raises, naming the method, unless store has the four methods.
function M.check(store, name)
  name = name or "store"
  local t = type(store)
  if t ~= "table" and t ~= "userdata" then
    error(("rlm.journal: %s must be an object with get, set, delete and set_if methods, not %s"):format(name, t), 3)
  end
  for _, m in ipairs(M.METHODS) do
    local f = store[m]
    if type(f) ~= "function" and not (type(f) == "table" and getmetatable(f) and getmetatable(f).__call) then
      error(("rlm.journal: %s.%s must be a function, not %s"):format(name, m, type(f)), 3)
    end
  end
end

-- store[method](store, ...) as the journal calls it: its results, or nil,
-- err (kind journal_error) when it raised or returned nil (false for
-- set_if), message. Through rlm.base.util's protected call, so that a
-- store's yield passes through to whoever resumed the journal's caller, on
-- every Lua (PUC 5.1's pcall cannot be yielded across). Elsewhere a plain
-- pcall: no coroutine of rlm's between the store and its caller's, so
-- that a store whose wait resumes the coroutine that yielded (a luv
-- client's callback) resumes its caller's.
local protected = util.PCALL_YIELDS and pcall or util.call_protected

function M.call(store, method, ...)
  local args = util.pack(...)
  local ok, a, b = protected(function()
    return store[method](store, util.unpack(args, 1, args.n))
  end)
  if not ok then
    return nil, M.error("journal_error", ("the store's %s raised: %s"):format(method, tostring(a)))
  end
  if a == nil and b ~= nil then
    return nil, M.error("journal_error", ("the store's %s failed: %s"):format(method, tostring(b)))
  end
  if method == "set_if" and a ~= true and a ~= false then
    return nil, M.error("journal_error", ("the store's set_if returned %s, not true or false"):format(tostring(a)))
  end
  return a, b
end

return M
