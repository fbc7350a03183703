-- rlm.journal.lease(store, id, owner[, opts]): one owner of a session's
-- journal at a time (docs/durability.md, "The lease"). The lease is the
-- entry <id>.lease, whose value is
--
--   rlm-lease-1 <fence> <expires> <owner>
--
-- fence: a number that grows by one at every acquire, so that each owner
-- in turn has its own; expires: seconds (opts.clock's, os.time by
-- default) after which another owner may take the lease over; owner: who
-- holds it ("" once released). Every write of the owner's is the store's
-- set_if guarded by the lease's value exactly as this owner last wrote it:
-- once another owner took it over (a greater fence), or it was released,
-- the store refuses the write atomically, whatever this owner believes.
local store = require("rlm.journal.store")

---@class Lease
---@field store table the journal's store
---@field id string the session's id
---@field owner string who holds it: this process (docs/durability.md says how to name one)
---@field key string the lease's entry, <id>.lease
---@field value string|nil the lease's value as this owner last wrote it; nil once released or dropped
---@field fence integer this owner's fencing number
---@field expires integer when the lease ends unless renewed (opts.clock's seconds)
---@field ttl integer seconds a lease lasts from its acquire or renewal
---@field clock function seconds now
local Lease = {}
Lease.__index = Lease

local M = {}

M.DEFAULT_TTL = 30
local PREFIX = "rlm-lease-1 "

-- Raises unless id is a session's id: 1 to 64 letters, digits, '_' and
-- '-' (a key's text before its first '.').
function M.check_id(id)
  if type(id) ~= "string" or #id == 0 or #id > 64 or id:find("[^%w_%-]") then
    error(("rlm.journal: a session id is 1 to 64 of A-Z a-z 0-9 _ -, not %s"):format(
      type(id) == "string" and ("%q"):format(id) or type(id)), 3)
  end
end

local function check_owner(owner)
  if type(owner) ~= "string" or #owner == 0 or #owner > 200 or owner:find("[%c]") then
    error("rlm.journal: a lease's owner is 1 to 200 bytes without control characters, not " .. tostring(owner), 3)
  end
end

local function encode(fence, expires, owner)
  return ("%s%d %d %s"):format(PREFIX, fence, expires, owner)
end

-- fence, expires, owner of a lease's value, or nil when it is none.
local function decode(v)
  if type(v) ~= "string" or v:sub(1, #PREFIX) ~= PREFIX then
    return nil
  end
  local fence, expires, owner = v:match("^(%d+) (%d+) (.*)$", #PREFIX + 1)
  if not fence then
    return nil
  end
  return tonumber(fence), tonumber(expires), owner
end
M.decode = decode

local function held(id, fence, expires, owner)
  return store.error("lease_held",
    ("session %s is held by %s (fence %d) until %d: it may be taken over then"):format(id, owner, fence, expires),
    { owner = owner, fence = fence, expires = expires })
end

-- The lease for owner, or nil, err (lease_held: another owner holds it
-- and it has not expired; journal_error: the store failed or the lease's
-- entry is not one). opts: ttl (seconds, default 30), clock.
function M.acquire(s, id, owner, opts)
  store.check(s)
  M.check_id(id)
  check_owner(owner)
  opts = opts or {}
  local ttl, clock = opts.ttl or M.DEFAULT_TTL, opts.clock or os.time
  if type(ttl) ~= "number" or ttl ~= math.floor(ttl) or ttl < 1 or ttl > 2 ^ 31 then
    error("rlm.journal: lease option 'ttl' must be an integer 1 to 2^31 (seconds), not " .. tostring(ttl), 2)
  end
  local key = id .. ".lease"
  local current, err = store.call(s, "get", key)
  -- Two tries: a set_if lost to another acquirer reads what it wrote.
  for _ = 1, 2 do
    if err then
      return nil, err
    end
    local fence, expires, holder = 0, 0, ""
    if current ~= nil then
      fence, expires, holder = decode(current)
      if not fence then
        return nil, store.error("journal_error", ("%s holds no lease of this version"):format(key))
      end
    end
    local now = clock()
    if holder ~= "" and holder ~= owner and now < expires then
      return nil, held(id, fence, expires, holder)
    end
    local value = encode(fence + 1, now + ttl, owner)
    local ok, now_there = store.call(s, "set_if", key, current, key, value)
    if ok then
      return setmetatable({ store = s, id = id, owner = owner, key = key, value = value, fence = fence + 1,
        expires = now + ttl, ttl = ttl, clock = clock }, Lease)
    end
    current, err = now_there, ok == nil and now_there or nil
  end
  local fence, expires, holder = decode(current)
  if fence then
    return nil, held(id, fence, expires, holder)
  end
  return nil, store.error("journal_error", "the lease of session " .. id .. " changed twice while it was acquired")
end

-- The error of a write refused: the lease is another's now (or none).
function Lease:lost(current)
  local fence, _, holder = decode(current)
  self.value = nil
  if fence and holder ~= "" then
    return store.error("lease_lost", ("session %s's lease (fence %d) was taken over by %s (fence %d)"):format(
      self.id, self.fence, holder, fence), { owner = holder, fence = fence })
  end
  return store.error("lease_lost", ("session %s's lease (fence %d) is no longer held"):format(self.id, self.fence))
end

-- One write of this owner's, guarded by the lease: true, or nil, err.
function Lease:guarded(key, value)
  if not self.value then
    return nil, self:lost(nil)
  end
  local ok, current = store.call(self.store, "set_if", self.key, self.value, key, value)
  if ok == nil then
    return nil, current
  end
  if not ok then
    return nil, self:lost(current)
  end
  return true
end

-- Writes value under key (an entry of this session's: <id>.<name>) if
-- this owner still holds the lease: true, or nil, err (lease_lost).
function Lease:write(key, value)
  store.check_key(key)
  if key:sub(1, #self.id + 1) ~= self.id .. "." or key == self.key then
    error(("rlm.journal: %s is not an entry of session %s"):format(key, self.id), 2)
  end
  return self:guarded(key, value)
end

-- Deletes an entry of this session's, as write does.
function Lease:delete(key)
  return self:write(key, nil)
end

-- Extends the lease by its ttl from now: true, or nil, err (lease_lost).
function Lease:renew()
  local expires = self.clock() + self.ttl
  local value = encode(self.fence, expires, self.owner)
  local ok, err = self:guarded(self.key, value)
  if ok then
    self.value, self.expires = value, expires
  end
  return ok, err
end

-- Lets the lease go, keeping its fence (the next owner's is greater):
-- true, or nil, err (lease_lost: it was not this owner's any more).
function Lease:release()
  local ok, err = self:guarded(self.key, encode(self.fence, 0, ""))
  self.value = nil
  return ok, err
end

-- Lets go of session id's lease on behalf of its holder, which the caller
-- knows is gone (bin/rlm: a process of its own machine that has ended,
-- killed before it could release), as the holder's release() would:
-- the fence kept. Only while the lease's value is still `value`, as the
-- caller read it and judged its holder: true; false when it changed
-- meanwhile; nil, err when the store failed.
function M.release_for(s, id, value)
  store.check(s)
  M.check_id(id)
  local fence = decode(value)
  if not fence then
    return nil, store.error("journal_error", ("%s.lease holds no lease of this version"):format(id))
  end
  local key = id .. ".lease"
  local ok, err = store.call(s, "set_if", key, value, key, encode(fence, 0, ""))
  if ok == nil then
    return nil, err
  end
  return ok == true
end

-- Deletes the session's entries named in keys, then the lease itself:
-- the end of a finished or closed session. true, or nil, err.
function Lease:drop(keys)
  for _, key in ipairs(keys) do
    local ok, err = self:delete(key)
    if not ok then
      return nil, err
    end
  end
  local ok, err = self:guarded(self.key, nil)
  self.value = nil
  return ok, err
end

return M
