-- rlm.journal.redis(client[, opts]): the journal's store in Redis, through
-- the client the host already has: lua-resty-redis under OpenResty (its
-- calls yield to nginx), Debian's lua-redis (redis-lua) in scripts. Both
-- have get, set, del and eval, and this store uses nothing else; a client
-- that raises on failure (redis-lua) and one that returns nil, message
-- (lua-resty-redis, and ngx.null for a missing value) are both read. The
-- host connects, authenticates, selects and pools the connection.
--
-- A key k is kept as prefix .. "{" .. s .. "}" .. rest, s being k up to
-- its first '.' (the session's id, rlm.journal.record's keys), so that a
-- session's keys share one Redis Cluster slot, as EVAL's keys must. Every
-- set, set_if's included, gives the key opts.ttl seconds (EX): an entry
-- lives that long after its last write. set_if is one EVAL of SET_IF.
local store = require("rlm.journal.store")
local file = require("rlm.journal.file")

---@class JournalRedis
---@field client table the host's Redis client
---@field prefix string what every key begins with
---@field ttl integer seconds an entry lives after its last write
---@field max_value_bytes integer the largest value set takes
local Redis = {}
Redis.__index = Redis

local M = {}

M.DEFAULT_PREFIX = "rlm:journal:"

-- KEYS[1] guard, KEYS[2] key; ARGV: whether a value is expected ("1") and
-- it, whether key gets a value ("1": else it is deleted) and it, the ttl.
-- GET of a missing key is false in Redis's Lua. Returns {1}, or {0} and
-- the guard's value when it has one.
M.SET_IF = [[
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '1' then
  if current ~= ARGV[2] then
    if current then return {0, current} end
    return {0}
  end
elseif current then
  return {0, current}
end
if ARGV[3] == '1' then
  redis.call('SET', KEYS[2], ARGV[4], 'EX', tonumber(ARGV[5]))
else
  redis.call('DEL', KEYS[2])
end
return {1}
]]

local CLIENT_METHODS = { "get", "set", "del", "eval" }

function M.new(client, opts)
  local t = type(client)
  if t ~= "table" and t ~= "userdata" then
    error("rlm.journal: redis(client) needs a Redis client (lua-resty-redis's or redis-lua's), not " .. t, 2)
  end
  for _, m in ipairs(CLIENT_METHODS) do
    if type(client[m]) ~= "function" then
      error(("rlm.journal: redis(client): client.%s must be a function, not %s"):format(m, type(client[m])), 2)
    end
  end
  local ttl, max = file.options(opts, "redis")
  local prefix = opts and opts.prefix or M.DEFAULT_PREFIX
  if type(prefix) ~= "string" or #prefix > 200 or prefix:find("[{}%s]") then
    error("rlm.journal: option 'prefix' of redis must be a string of at most 200 bytes without braces or spaces", 2)
  end
  return setmetatable({ client = client, prefix = prefix, ttl = ttl, max_value_bytes = max }, Redis)
end

function Redis:name(key)
  local s, rest = key:match("^([^.]*)(.*)$")
  return self.prefix .. "{" .. s .. "}" .. rest
end

-- A reply's value: nil for Redis's nil (nil, or lua-resty-redis's ngx.null).
local function value_of(v)
  if type(v) == "string" then
    return v
  end
  return nil
end

function Redis:get(key)
  store.check_key(key)
  local v, err = self.client:get(self:name(key))
  if v == nil and err ~= nil then
    return nil, err
  end
  return value_of(v)
end

function Redis:set(key, value)
  store.check_key(key)
  store.check_value(value, self.max_value_bytes)
  local ok, err = self.client:set(self:name(key), value, "EX", self.ttl)
  if not ok then
    return nil, err or "SET failed"
  end
  return true
end

function Redis:delete(key)
  store.check_key(key)
  local ok, err = self.client:del(self:name(key))
  if ok == nil then
    return nil, err or "DEL failed"
  end
  return true
end

function Redis:set_if(guard, expected, key, value)
  store.check_key(guard, "guard")
  store.check_value(expected, self.max_value_bytes, true, "expected")
  store.check_key(key)
  store.check_value(value, self.max_value_bytes, true)
  if guard:match("^[^.]*") ~= key:match("^[^.]*") then
    error("rlm.journal: redis set_if's guard and key must be of one session (the same text before the first '.')", 2)
  end
  local res, err = self.client:eval(M.SET_IF, 2, self:name(guard), self:name(key), expected and "1" or "0",
    expected or "", value and "1" or "0", value or "", self.ttl)
  if type(res) ~= "table" then
    return nil, err or ("EVAL returned " .. tostring(res))
  end
  if res[1] == 1 then
    return true
  end
  return false, value_of(res[2])
end

return M
