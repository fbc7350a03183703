-- What spec/linger_spec.lua and its host (spec/helpers/linger_host.lua)
-- share: the session's options over a local rlm-keeper that lingers in a
-- directory of the spec's, the context's load, and a driver line awaited;
-- and the sandbox option of spec/resume_attach_spec.lua's sessions.
local core = require("rlm.core")
local cjson = require("cjson")
local options = require("rlm.engine.options")

local D = {}

D.KEEPER = (os.getenv("RLM_SPEC_BUILD") or "build") .. "/rlm-keeper"
-- The probe's cache, in the build tree (as keeper_spec's).
D.CACHE = os.getenv("PWD") .. "/build/keeper-cache"

-- The Lua a host of its own runs under: the spec's.
D.LUA = os.getenv("RLM_SPEC_LUA") or (rawget(_G, "jit") and "luajit" or ("lua" .. _VERSION:match("%d+%.%d+")))

D.LOAD = cjson.encode({ type = "load_context", format = "text", stdout_limit = 2000,
  rlimits = { RLIMIT_AS = 2 ^ 34, RLIMIT_CPU = 1000 } })

-- The sandbox option: the exec backend, its keeper lingering ms in dir
-- (spec/resume_attach_spec.lua's sessions too).
function D.sandbox(dir, ms, over)
  local sandbox = { backend = "exec", argv = { D.KEEPER, "--cache", D.CACHE, "--linger-dir", dir }, linger_ms = ms }
  for k, v in pairs(over or {}) do
    sandbox[k] = v
  end
  return sandbox
end

-- Options as rlm.Session.new checks them, with that sandbox.
function D.options(dir, ms, over)
  return options.check({ root_llm = function() end, llm_query = function() end, context = "",
    sandbox = D.sandbox(dir, ms, over) })
end

function D.exists(path)
  local p = assert(io.popen("test -e " .. path .. " && echo yes"))
  local yes = p:read("*a"):match("yes") ~= nil
  p:close()
  return yes
end

-- Whether pid runs (a zombie does not: its parent is gone, init reaps it).
function D.running(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  local stat = f and f:read("*l")
  if f then
    f:close()
  end
  return stat ~= nil and not stat:match("^%d+ %(.-%) Z")
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
