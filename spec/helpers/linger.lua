-- What spec/linger_spec.lua and its host (spec/helpers/linger_host.lua)
-- share: the session's options over a local rlm-keeper that lingers in a
-- directory of the spec's, the context's load, and a driver line awaited.
local core = require("rlm.core")
local cjson = require("cjson")
local options = require("rlm.engine.options")

local D = {}

D.KEEPER = (os.getenv("RLM_SPEC_BUILD") or "build") .. "/rlm-keeper"
-- The probe's cache, in the build tree (as keeper_spec's).
D.CACHE = os.getenv("PWD") .. "/build/keeper-cache"

D.LOAD = cjson.encode({ type = "load_context", format = "text", stdout_limit = 2000,
  rlimits = { RLIMIT_AS = 2 ^ 34, RLIMIT_CPU = 1000 } })

-- Options as rlm.Session.new checks them: the exec backend, its keeper
-- lingering ms in dir.
function D.options(dir, ms, over)
  local sandbox = { backend = "exec", argv = { D.KEEPER, "--cache", D.CACHE, "--linger-dir", dir }, linger_ms = ms }
  for k, v in pairs(over or {}) do
    sandbox[k] = v
  end
  return options.check({ root_llm = function() end, llm_query = function() end, context = "", sandbox = sandbox })
end

-- The driver's next line of type want (within 30 s); raises on an end.
function D.expect(h, want)
  local t0 = core.now_ms()
  while core.now_ms() - t0 < 30000 do
    local kind, a = h:poll(1000)
    if kind == "line" then
      local m = cjson.decode(a)
      if m.type == want then
        return m
      end
    elseif kind ~= nil then
      error(("waiting for %s: %s %s"):format(want, tostring(kind), tostring(a)))
    end
  end
  error("no " .. want .. " within 30 s")
end

return D
