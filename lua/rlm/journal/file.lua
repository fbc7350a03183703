-- rlm.journal.file(dir[, opts]): the journal's store in a directory, for
-- scripts, the command line and Neovim (docs/durability.md). An entry is a
-- file of its key's name, 0600, replaced whole (rlm.core's journal_write:
-- a temporary file, fsync, rename, fsync of the directory), in a directory
-- of 0700 that the store makes, and refuses when another user owns it or
-- others may write it (rlm.core checks it at every call, not only here).
-- set_if holds the directory's lock (an flock) for its read and its write:
-- processes of one machine that share the directory agree; a directory on
-- a network file system is not supported (flock there is not a lock
-- across machines). An entry lives opts.ttl seconds after its last write:
-- past it a get finds nothing, and sweep() removes it.
local core = require("rlm.core")
local store = require("rlm.journal.store")

---@class JournalFile
---@field dir string the directory, an absolute path
---@field ttl integer seconds an entry lives after its last write
---@field max_value_bytes integer the largest value set takes
local File = {}
File.__index = File

local M = {}

M.DEFAULT_TTL = 24 * 3600

-- opts.ttl and opts.max_value_bytes, checked (misuse raises, naming them).
function M.options(opts, where)
  if opts ~= nil and type(opts) ~= "table" then
    error(("rlm.journal: %s's options must be a table, not %s"):format(where, type(opts)), 3)
  end
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= "ttl" and k ~= "max_value_bytes" and not (where == "redis" and k == "prefix") then
      error(("rlm.journal: unknown option %q of %s"):format(tostring(k), where), 3)
    end
  end
  local ttl, max = opts.ttl or M.DEFAULT_TTL, opts.max_value_bytes or store.MAX_VALUE_BYTES
  if type(ttl) ~= "number" or ttl ~= math.floor(ttl) or ttl < 1 or ttl > 2 ^ 31 then
    error(("rlm.journal: option 'ttl' of %s must be an integer 1 to 2^31 (seconds), not %s"):format(where,
      tostring(ttl)), 3)
  end
  if type(max) ~= "number" or max ~= math.floor(max) or max < 1 or max > 2 ^ 30 then
    error(("rlm.journal: option 'max_value_bytes' of %s must be an integer 1 to 2^30, not %s"):format(where,
      tostring(max)), 3)
  end
  return ttl, max
end

-- The store, or nil, message when dir cannot be made or is not this
-- user's alone.
function M.new(dir, opts)
  if type(dir) ~= "string" or dir:sub(1, 1) ~= "/" then
    error("rlm.journal: file(dir) needs an absolute path, not " .. tostring(dir), 2)
  end
  local ttl, max = M.options(opts, "file")
  local ok, err = core.journal_dir(dir)
  if not ok then
    return nil, err
  end
  return setmetatable({ dir = dir, ttl = ttl, max_value_bytes = max }, File)
end

-- The value under key and whether it is live, or nil, message.
function File:read(key)
  local value, mtime = core.journal_read(self.dir, key, self.max_value_bytes)
  if value == nil then
    return nil, mtime
  end
  if os.time() > mtime + self.ttl then
    return nil
  end
  return value
end

function File:get(key)
  store.check_key(key)
  return self:read(key)
end

function File:set(key, value)
  store.check_key(key)
  store.check_value(value, self.max_value_bytes)
  return core.journal_write(self.dir, key, value)
end

function File:delete(key)
  store.check_key(key)
  return core.journal_remove(self.dir, key)
end

function File:set_if(guard, expected, key, value)
  store.check_key(guard, "guard")
  store.check_value(expected, self.max_value_bytes, true, "expected")
  store.check_key(key)
  store.check_value(value, self.max_value_bytes, true)
  local lock, err = core.journal_lock(self.dir)
  if not lock then
    return nil, err
  end
  local current
  current, err = self:read(guard)
  local ok
  if current == nil and err then
    ok = nil
  elseif current ~= expected then
    ok, err = false, current
  elseif value == nil then
    ok, err = core.journal_remove(self.dir, key)
  else
    ok, err = core.journal_write(self.dir, key, value)
  end
  lock:unlock()
  return ok, err
end

-- Removes the entries past their lifetime (under the lock, so that none
-- written meanwhile goes), and the temporary files as old, which a writer
-- that died between its create and its rename left; returns how many
-- entries, or nil, message.
function File:sweep()
  local lock, err = core.journal_lock(self.dir)
  if not lock then
    return nil, err
  end
  local entries
  entries, err = core.journal_list(self.dir)
  local n = 0
  if entries then
    local now = os.time()
    for name, mtime in pairs(entries) do
      if now > mtime + self.ttl then
        local ok, why = core.journal_remove(self.dir, name)
        if not ok then
          entries, err = nil, why
          break
        end
        n = n + 1
      end
    end
  end
  if entries then
    entries, err = core.journal_sweep_temps(self.dir, os.time() - self.ttl)
  end
  lock:unlock()
  if not entries then
    return nil, err
  end
  return n
end

return M
