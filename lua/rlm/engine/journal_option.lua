-- Option journal (docs/api.md, docs/durability.md): its check and the form
-- the session keeps (rlm.engine.options calls both); the journal itself
-- is rlm.engine.journal's.
local jstore = require("rlm.journal.store")

local M = {}

local WANT = "a journal store (an object with get, set, delete and set_if methods: rlm.journal.file, "
  .. "rlm.journal.redis), or a table { store = a journal store, owner = a string of 1 to 200 bytes, "
  .. "lease_ttl = seconds 1 to 2^31, on_divergence = \"error\" or \"continue\" }"

local FIELDS = { store = true, owner = true, lease_ttl = true, on_divergence = true }

local function is_store(v)
  return pcall(jstore.check, v)
end

-- The option's check.
function M.check(v)
  if type(v) == "table" and getmetatable(v) == nil and rawget(v, "store") ~= nil then
    for k in pairs(v) do
      if not FIELDS[k] then
        return false, WANT .. " (no field " .. tostring(k) .. ")"
      end
    end
    if not is_store(v.store) then
      return false, WANT, nil, "store", v.store
    end
    local owner = v.owner
    if owner ~= nil and not (type(owner) == "string" and #owner >= 1 and #owner <= 200
      and not owner:find("[%c]")) then
      return false, "a string of 1 to 200 bytes without control characters", nil, "owner", owner
    end
    local ttl = v.lease_ttl
    if ttl ~= nil and not (type(ttl) == "number" and ttl == math.floor(ttl) and ttl >= 1 and ttl <= 2 ^ 31) then
      return false, "an integer 1 to 2^31 (seconds)", nil, "lease_ttl", ttl
    end
    local div = v.on_divergence
    if div ~= nil and div ~= "error" and div ~= "continue" then
      return false, '"error" or "continue"', nil, "on_divergence", div
    end
    return true
  end
  if not is_store(v) then
    return false, WANT
  end
  return true
end

-- The option as the session keeps it: { store =, owner =, lease_ttl =,
-- on_divergence = }. An owner not given is this session's own: a resume,
-- or another process, is another owner.
function M.read(v)
  if getmetatable(v) == nil and rawget(v, "store") ~= nil then
    return { store = v.store, owner = v.owner, lease_ttl = v.lease_ttl or 30,
      on_divergence = v.on_divergence or "error" }
  end
  return { store = v, lease_ttl = 30, on_divergence = "error" }
end

return M
