-- luv helpers for the specs that drive sessions from a loop. nil when luv
-- is not installed.
local ok, uv = pcall(require, "luv")
if not ok then
  return nil
end
local core = require("rlm.core")

-- One luv for the whole busted process: busted drops package.loaded between
-- spec files, and luv frees its loop with the first module table while the
-- next require("luv") goes on using it (rlm.adapters.luv says more). Held
-- in the registry, that table and its loop stay, as in a host that loads
-- luv once.
debug.getregistry()["rlm spec: luv"] = debug.getregistry()["rlm spec: luv"] or uv

local L = { uv = uv }

-- Runs the loop until cond() holds (or the limit passes).
function L.run_until(cond, limit_ms)
  local t0 = core.now_ms()
  while not cond() do
    assert(core.now_ms() - t0 < (limit_ms or 60000), "the loop did not finish in time")
    uv.run("once")
  end
  uv.run("nowait") -- the close callbacks of the handles the run let go
end

-- Calls fn once, ms from now.
function L.after(ms, fn)
  local t = uv.new_timer()
  t:start(ms, 0, function()
    t:close()
    fn()
  end)
end

-- Yields until a timer resumes the running coroutine.
function L.sleep(ms)
  local co = coroutine.running()
  L.after(ms, function()
    assert(coroutine.resume(co))
  end)
  coroutine.yield()
end

-- Runs a session with the spec's options (H.opts) through
-- rlm.adapters.luv to its end; returns its result and its err.
function L.run_session(opts)
  local H = require("helpers")
  local out
  require("rlm.adapters.luv").run(H.opts(opts), function(err, result)
    out = { err = err, result = result }
  end)
  L.run_until(function()
    return out ~= nil
  end)
  return out.result, out.err
end

return L
