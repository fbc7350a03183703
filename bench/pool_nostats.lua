-- By hand, beside figure 10 (bench/pool.lua), which calls stats() before
-- each sample: the warm take of a server that never calls stats().
-- Session.new{pool} plus the first step (x = 1), pool of 8, each sample
-- after an idle gap that stats() does not fill; prints the median and p90,
-- the host thread's CPU time, and how many takes the pool had vetted
-- (at a refill or a root session's close) rather than left to the take's
-- cold checks. Compare against a base tree in the same window:
--   LUA_PATH="$T/lua/?.lua;$T/lua/?/init.lua;$T/?.lua;;" LUA_CPATH="$T/build/5.4/?.so;;" \
--     lua5.4 bench/pool_nostats.lua "$T" "$(mktemp -d)" [samples=30] [gap_ms=700]
-- ($T: the tree whose lua/ and build/ run, after make all.)
local root, tmp = assert(arg[1], "root"), assert(arg[2], "tmp")
local n, gap = tonumber(arg[3] or 30), tonumber(arg[4] or 700)
local common = require("bench.common")
local rlm = require("rlm")

local env = common.env({ root = root, tmpdir = tmp .. "/sessions", scratch = tmp .. "/scratch" })
os.execute("mkdir -p " .. common.quote(env.tmpdir) .. " " .. common.quote(env.scratch))

-- A real pause: nothing of the pool's runs meanwhile.
local function sleep(ms)
  os.execute(("sleep %.3f"):format(ms / 1000))
end

local pool = assert(rlm.Pool.new({ size = 8, sandbox = { tmpdir = env.tmpdir } }))
local take, vetted = pool._take, 0
pool._take = function(self)
  local entry = take(self)
  if entry and entry.vetted then
    vetted = vetted + 1
  end
  return entry
end
local warm, cpu = {}, {}
sleep(gap * 2)
for _ = 1, n do
  sleep(gap)
  warm[#warm + 1], cpu[#cpu + 1] = common.warm_take(env, pool)
end
pool:close()
local w, c = common.summary(warm), common.summary(cpu)
print(("%s: warm take, no stats(): median %.3f ms, p90 %.3f ms; host CPU median %.3f ms; %d/%d takes vetted")
  :format(root, w.median, common.quantile(warm, 0.9), c.median, vetted, n))
