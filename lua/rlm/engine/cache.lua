-- The sub-call cache of a tree of sessions (option sub_call_cache): the
-- answer of an llm_query, kept under a key of what changes it, so that the
-- same prompt to the same model at the same depth is paid once per tree.
-- The tree's Budgets holds it (rlm.engine.budgets), so nested sessions
-- share it; the Scheduler looks up and stores (rlm.engine.calls). Two
-- stores: the built-in one below (bounded: entries and bytes, the least
-- recently used going first), or the host's object with get and set
-- methods (an ngx.shared dict as it is), whose calls may yield and so run
-- where the host runs callbacks: as cache_get and cache_set requests out
-- of poll() (M.start, from rlm.drive.dispatch), never in the engine.
local core = require("rlm.core")
local util = require("rlm.base.util")

---@class Cache
---@field host table|userdata|nil the host's store (get and set methods), or nil for the built-in one
---@field namespace string|nil option sub_call_cache.namespace: part of every key
---@field entries table key -> node { key =, value =, newer =, older = } (built-in)
---@field newest table|nil the most recently used node (built-in)
---@field oldest table|nil the least recently used node, the next to go (built-in)
---@field count integer entries held (built-in)
---@field bytes integer the bytes of their keys and values (built-in)
---@field hits integer calls answered from the cache, over the tree
---@field flights table key -> the calls that wait for the one call of the tree out for key (waiters: see join)
local Cache = {}
Cache.__index = Cache

local M = {}

-- The built-in store's bounds: past either, the least recently used
-- entries go. The driver keeps a rolled-back block's answers within the
-- same (python/_rlm_driver/api.py, MAX_KEPT).
M.MAX_ENTRIES = 1000
M.MAX_BYTES = 16 * 2 ^ 20

-- The option's check (rlm.engine.options): true (the built-in cache),
-- false, or { store =, namespace = }. store is the host's cache: an object
-- with get and set methods (called as cache:get(key), so that an
-- ngx.shared dict is one as it is; its other fields are its own), the
-- built-in one when absent. namespace is who the cached answers are for (a
-- tenant, a key, a model), part of every key; a bounded string, so that
-- the key's hash costs the same whatever the host puts there.
local CACHE_WANT = "true, false, or a table { store = a cache (an object with get(key) and set(key, value) "
  .. "methods), namespace = a string of 1 to 1024 bytes }"

local function field_of(v, k)
  local found, x = pcall(function()
    return v[k]
  end)
  return found and x or nil, found
end

function M.check(v)
  if type(v) == "boolean" then
    return true
  elseif type(v) ~= "table" or getmetatable(v) ~= nil or (v.store == nil and field_of(v, "get") ~= nil) then
    if util.is_callable(field_of(v, "get")) then
      return false, CACHE_WANT, "is a table { store = cache, namespace = \"...\" } now: give the host's cache as "
        .. "its store (and option 'sub_call_cache_namespace' as its namespace)"
    end
    return false, CACHE_WANT
  end
  for k in pairs(v) do
    if k ~= "store" and k ~= "namespace" then
      return false, CACHE_WANT .. " (no field " .. tostring(k) .. ")"
    end
  end
  if v.namespace ~= nil and not (type(v.namespace) == "string" and #v.namespace >= 1 and #v.namespace <= 1024) then
    return false, "a string of 1 to 1024 bytes", nil, "namespace", v.namespace
  end
  if v.store == nil then
    return true
  end
  for _, method in ipairs({ "get", "set" }) do
    local fn, found = field_of(v.store, method)
    if not found or not util.is_callable(fn) then
      return false, ("a function (a method: called as cache:%s(%s))"):format(method,
        method == "get" and "key" or "key, value"), nil, "store." .. method, fn
    end
  end
  return true
end

-- The cache for option value v (true, or the host's store), or nil
-- (false); namespace: option sub_call_cache.namespace (required with a
-- host's store, rlm.engine.options).
function M.new(v, namespace)
  if not v then
    return nil
  end
  return setmetatable({ host = v ~= true and v or nil, namespace = namespace, entries = {}, count = 0, bytes = 0,
    hits = 0, flights = {} }, Cache)
end

-- The key of a call: what changes its answer, the prompt, the model hint
-- (the code's model=, which the host's llm_query may follow) and the
-- depth of the session that asks (info.depth: a host may pick its model by
-- it, as rlm.llm's sub_model lists do); and whose callback answers it, the
-- namespace, since a host's store may serve sessions of other tenants,
-- keys or models. A SHA-256 of them, so that a key is 75 bytes whatever
-- the prompt (a host's store may bound keys: ngx.shared's hold 65,535
-- bytes); each variable part but the last comes after its length, so that
-- no two calls make one string.
function M.key(prompt, model, depth, namespace)
  return "rlm-sub-v2:" .. core.sha256_hex(("%d:%s:%d:%d:%s:"):format(namespace and #namespace or -1,
    namespace or "", depth, model and #model or -1, model or "") .. prompt)
end

-- Built-in: the node out of the recency list.
function Cache:unlink(node)
  if node.newer then
    node.newer.older = node.older
  else
    self.newest = node.older
  end
  if node.older then
    node.older.newer = node.newer
  else
    self.oldest = node.newer
  end
  node.newer, node.older = nil, nil
end

-- Built-in: the node first in the recency list.
function Cache:push(node)
  node.older = self.newest
  if self.newest then
    self.newest.newer = node
  end
  self.newest = node
  self.oldest = self.oldest or node
end

-- Built-in: the text kept under key, or nil; a hit makes it the newest.
function Cache:get(key)
  local node = self.entries[key]
  if not node then
    return nil
  end
  self:unlink(node)
  self:push(node)
  return node.value
end

-- Built-in: keeps text under key, then lets the oldest go past the bounds
-- (a text larger than all of MAX_BYTES is not kept).
function Cache:set(key, text)
  local size = #key + #text
  if size > M.MAX_BYTES then
    return
  end
  local node = self.entries[key]
  if node then
    self:unlink(node)
    self.bytes = self.bytes - #node.key - #node.value
    self.count = self.count - 1
  end
  node = { key = key, value = text }
  self.entries[key] = node
  self:push(node)
  self.count, self.bytes = self.count + 1, self.bytes + size
  while self.count > M.MAX_ENTRIES or self.bytes > M.MAX_BYTES do
    local old = self.oldest
    self:unlink(old)
    self.entries[old.key] = nil
    self.count, self.bytes = self.count - 1, self.bytes - #old.key - #old.value
  end
end

-- One more call answered from the cache: the count so far.
function Cache:count_hit()
  self.hits = self.hits + 1
  return self.hits
end

-- Calls in flight: a call that missed, about to go out for key, joins the
-- flight for key. true: another call of the tree is out for key, and this
-- one waits for its answer (waiter: a cache_wait request of its
-- scheduler's, which land gives back to it); false: none is, this one goes
-- out, and whatever ends it lands the flight. So that the same prompt,
-- asked side by side (a batch's repeats, sibling nested sessions), is paid
-- once too.
function Cache:join(key, waiter)
  local flight = self.flights[key]
  if flight then
    flight[#flight + 1] = waiter
    return true
  end
  self.flights[key] = {}
  return false
end

-- A call out for key ended: its answer's text, or nil (it failed, or was
-- dropped: then each waiter goes out itself, joining again). Each waiter
-- gets it as a reply in its scheduler's inbox. Any answer for key is one
-- for every call for key, so that whichever call lands a flight, none waits
-- longer than the call it waits on.
function Cache:land(key, text)
  local flight = self.flights[key]
  if flight then
    self.flights[key] = nil
    for _, waiter in ipairs(flight) do
      waiter.scheduler:landed(waiter, text)
    end
  end
end

-- What a cache request's function returns: never nil (a model callback's
-- form, rlm.base.util's invoke, reads a nil as "done() will come").
local SET = { true }

-- Runs a cache_get or cache_set request ev of session s the host's way
-- (start, as for a model callback: at once, or in a coroutine of its own
-- under an adapter, so that the store may yield) and replies: a get's
-- value (nil: a miss), a set's true, or why it failed.
function M.start(s, ev, start)
  local store = s.tree.cache.host
  local fn
  if ev.type == "cache_get" then
    fn = function()
      return { (store:get(ev.key)) }
    end
  else
    fn = function()
      store:set(ev.key, ev.value)
      return SET
    end
  end
  start(fn, nil, function(ok, box)
    if ok and type(box) == "table" then
      s:reply(ev.id, box[1])
    else
      s:reply(ev.id, nil, tostring(box))
    end
  end)
end

return M
