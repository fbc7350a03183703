-- A journaled session's driver seeds (docs/durability.md, "A replay that
-- reproduces"): its PYTHONHASHSEED and what its `random` is seeded with,
-- chosen at the run's start, kept in the journal's head, and given again
-- to a resume's fresh sandbox, so that the code's hash() of a string, a
-- set's order and random's numbers replay as they ran.
local core = require("rlm.core")
local util = require("rlm.base.util")

local M = {}

-- PYTHONHASHSEED's range but 0 (which turns hashing's randomness off):
-- exact in every Lua's numbers.
local MAX = 4294967295

-- A seed of 1 to MAX from 8 hex digits.
local function seed_of(hex)
  local n = tonumber(hex:sub(1, 8), 16)
  return n > 0 and n or 1
end

-- A new run's: { hash =, random = }, each random.
function M.new()
  return { hash = seed_of(assert(util.random_hex(4))), random = seed_of(assert(util.random_hex(4))) }
end

-- The seeds for session s's driver in the tree whose root is `root`: the
-- root's own; a nested session's made of them and its id (the same id in
-- a replay, the same seeds). nil when seeds is (a journal of before them:
-- the driver's own, as without a journal).
function M.for_session(seeds, s, root)
  if not seeds or s == root then
    return seeds
  end
  local hex = core.sha256_hex(("%d:%d:%s"):format(seeds.hash, seeds.random, s.session_id))
  return { hash = seed_of(hex:sub(1, 8)), random = seed_of(hex:sub(9, 16)) }
end

-- Whether a head's seeds are ones new() makes: absent, or two integers of
-- 1 to MAX (a resume refuses others, rather than hand them to the spawn).
function M.ok(seeds)
  if seeds == nil then
    return true
  end
  if type(seeds) ~= "table" then
    return false
  end
  for _, k in ipairs({ "hash", "random" }) do
    local v = seeds[k]
    if type(v) ~= "number" or v ~= math.floor(v) or v < 1 or v > MAX then
      return false
    end
  end
  return true
end

return M
