-- How much max_rss_bytes a context really needs, beside the floor
-- rlm.Session.new refuses under (engine/options.lua's context_floor_bytes),
-- for contexts of N bytes: text (ASCII, Latin-1, CJK, emoji, ASCII with one
-- emoji, bytes that are not UTF-8) and JSON tables. For each: 3 sessions
-- 1 MiB under the floor (the rule is sound when none works: a context it
-- refuses could not have loaded), and the least limit (to 1 MiB) under
-- which a session answering len(context) at once worked, by bisection: a
-- figure the poll's timing moves (during the load the mapped context and
-- the str are both in memory, and a poll may or may not land then). Not
-- part of make bench (~15 sandboxes a row):
--
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/5.4/?.so;;" lua5.4 bench/context_fit.lua [MiB [case]]
local rlm = require("rlm")
local options = require("rlm.engine.options")

local MIB = 2 ^ 20
local N = (tonumber(arg[1]) or 64) * MIB
local ONLY = arg[2] -- one case by name

local function rep_to(unit, bytes)
  return unit:rep(math.floor(bytes / #unit))
end

local CASES = {
  { "empty", "" },
  { "ASCII text", rep_to("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\n", N) },
  { "Latin-1 text (2-byte UTF-8)", rep_to("\195\169", N) },
  { "CJK text (3-byte UTF-8)", rep_to("\228\184\173", N) },
  { "emoji (4-byte UTF-8)", rep_to("\240\159\152\128", N) },
  { "ASCII + one emoji", rep_to("a", N - 4) .. "\240\159\152\128" },
  { "bytes not UTF-8", rep_to("\255", N) },
  { "JSON: one ASCII string", { text = rep_to("a", N) } },
  { "JSON: 1,000 ASCII strings", (function()
    local t = {}
    for i = 1, 1000 do
      t[i] = rep_to("b", N / 1000)
    end
    return t
  end)() },
}

-- The check under measure is turned off here, so that a limit below its
-- floor can be tried: the floor is computed apart, below.
local floor_bytes = options.context_floor_bytes
options.context_floor_bytes = function()
  return 0
end

local ANSWER = "```repl\nFINAL(str(len(context)))\n```"

-- Whether a session with this limit answers; and the error kind if not.
local function works(context, limit)
  local s = rlm.Session.new({
    context = context, query = "len", max_iterations = 1, fallback = false,
    max_rss_bytes = limit,
    root_llm = function()
      return ANSWER
    end,
    llm_query = function()
      return ""
    end,
  })
  local result, err = s:run()
  s:close()
  if result then
    return true
  end
  assert(err.kind == "memory_limit", tostring(err))
  return false, err.mechanism
end

local function least(context)
  local lo, hi = 0, math.floor((8 * (type(context) == "string" and #context or N) + 256 * MIB) / MIB)
  assert(works(context, hi * MIB), "does not work even at " .. hi .. " MiB")
  local mechanism
  while hi - lo > 1 do
    local mid = math.floor((lo + hi) / 2)
    local ok, how = works(context, mid * MIB)
    if ok then
      hi = mid
    else
      lo, mechanism = mid, how
    end
  end
  return hi * MIB, mechanism
end

-- Below the floor, 3 tries: the rule is sound if none works.
local function under_floor(context, floor)
  local limit = floor - MIB
  if limit <= 0 then
    return "-"
  end
  local worked = 0
  for _ = 1, 3 do
    if works(context, limit) then
      worked = worked + 1
    end
  end
  return ("%d of 3 worked"):format(worked), worked
end

print(("contexts of %d MiB: the floor Session.new refuses under; 3 runs 1 MiB under it; the least "
  .. "max_rss_bytes that worked (bisection, one run a limit)"):format(N / MIB))
print(("%-28s %10s %10s %16s %12s  %s"):format("context", "bytes", "floor", "floor - 1 MiB", "least works",
  "killed below it by"))
local unsound = 0
for _, case in ipairs(CASES) do
  local name, context = case[1], case[2]
  if not ONLY or name == ONLY then
    local bytes = type(context) == "string" and #context or #require("cjson").encode(context)
    local floor = floor_bytes(context)
    local under, worked = under_floor(context, floor)
    unsound = unsound + (worked or 0)
    local need, how = least(context)
    print(("%-28s %8.1f M %8.1f M %16s %10.1f M  %s"):format(name, bytes / MIB, floor / MIB, under, need / MIB,
      how or "-"))
  end
end
print(unsound == 0 and "sound: no context ran under its floor"
  or ("UNSOUND: %d runs under a floor worked"):format(unsound))
