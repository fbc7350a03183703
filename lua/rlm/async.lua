-- Driving sessions from an event loop. A session's engine never calls a
-- model: poll() hands out requests, reply() takes the answers, fd() and
-- timeout() say when to poll again. This module runs the user's callbacks
-- the asynchronous way and keeps polling; the adapters in rlm.adapters only
-- say how their loop watches a descriptor, runs a timer and defers a call.
local dispatch = require("rlm.dispatch")
local util = require("rlm.util")

local M = {}

-- pcall and xpcall can be yielded across everywhere but on PUC Lua 5.1.
local yieldable_pcall = not (_VERSION == "Lua 5.1" and rawget(_G, "jit") == nil)

-- Calls fn(arg, done) in a coroutine of its own and calls finish(ok, text,
-- usage) exactly once. fn may
--   return text[, usage] at once (or raise, or return nil, "message");
--   yield, and be resumed later by whatever it waits on (a timer, a socket),
--     then return as above;
--   return nothing, and call done(text[, usage]) or done(nil, "message") later.
-- On PUC Lua 5.1 a raise after a yield reaches whoever resumed fn, not us:
-- the step deadline then ends the session.
function M.invoke(fn, arg, finish)
  local finished = false
  local function once(ok, a, b)
    if not finished then
      finished = true
      finish(ok, a, b)
    end
  end
  local function done(text, usage)
    if text == nil then
      once(false, usage ~= nil and tostring(usage) or "the callback called done() without a result")
    else
      once(true, text, usage)
    end
  end
  local function settle(ok, ...)
    if not ok then
      return once(false, tostring((...)))
    end
    local n, text, second = select("#", ...), ...
    if text ~= nil then
      once(true, text, second)
    elseif n >= 2 and type(second) == "string" then
      once(false, second)
    end -- nothing returned: done() will come
  end
  local co = coroutine.create(function()
    if yieldable_pcall then
      settle(xpcall(fn, debug.traceback, arg, done))
    else
      settle(true, fn(arg, done))
    end
  end)
  local ok, err = coroutine.resume(co)
  if not ok then
    once(false, debug.traceback(co, tostring(err)))
  end
end

-- Drives session s to its end on a host loop, then calls cb(err, result)
-- (err nil on success). host = {
--   watch = function(fd, fn) -> stop(): call fn whenever fd is readable;
--   timer = function() -> t with t:start(ms, fn), t:stop(), t:close();
--   defer = function(fn) (optional): run fn soon, outside the current
--     callback (Neovim's vim.schedule); without it, a 0 ms timer;
--   defer_callbacks = true (optional): start the model callbacks through
--     defer too;
-- }
-- cb is never called before drive() returns, and runs outside any pcall of
-- ours: what it raises reaches the host's loop. Returns a function that
-- cancels the run (the session is closed, cb gets a `cancelled` error).
-- Driving a session that is already driven raises, before any handle is
-- made.
function M.drive(s, host, cb)
  if not util.is_callable(cb) then
    error("rlm.async.drive: argument 3 must be a function(err, result), got " .. type(cb), 2)
  end
  dispatch.claim(s, "rlm.async.drive")
  local timer = host.timer()
  local defer = host.defer or function(fn)
    local t = host.timer()
    t:start(0, function()
      t:close()
      fn()
    end)
  end
  local stop_watch
  local busy, again, over = false, false, false
  local ended -- the event that ended the run, once
  local kick

  local function finish(ev)
    over, ended = true, ev
    if stop_watch then
      stop_watch()
      stop_watch = nil
    end
    timer:stop()
    timer:close()
    dispatch.release(s)
  end

  local function report()
    local ev = ended
    if ev.type == "done" then
      cb(nil, ev.result)
    else
      cb(ev.err)
    end
  end

  local function start(fn, arg, settle)
    local run = function()
      M.invoke(fn, arg, function(ok, text, usage)
        if over then
          return
        end
        settle(ok, text, usage)
        kick()
      end)
    end
    if host.defer_callbacks then
      defer(run)
    else
      run()
    end
  end

  local function pump()
    local ev = dispatch.next(s, start)
    if ev then
      return finish(ev)
    end
    if over then
      return
    end
    local ms = s:timeout()
    if ms >= 0 then
      timer:start(ms, kick)
    else
      timer:stop()
    end
  end

  kick = function()
    if over then
      return
    end
    if busy then
      again = true -- a callback answered at once, inside pump()
      return
    end
    busy = true
    repeat
      again = false
      local ok, err = pcall(pump)
      if not ok and not over then
        finish(dispatch.fail(s, err))
      end
    until not again or over
    busy = false
    if over then
      defer(report) -- outside our pcall, and never inside drive()
    end
  end

  -- One descriptor for the session's whole life (rlm.core's waitset).
  stop_watch = host.watch(s:fd(), function()
    kick()
  end)
  dispatch.claim_close(s, function()
    timer:start(0, kick) -- not from inside close(): the end is reported on the loop
  end)
  timer:start(0, kick)
  return function()
    if not over then
      s:close()
    end
  end
end

return M
