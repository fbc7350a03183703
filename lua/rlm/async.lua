-- Driving sessions from an event loop. A session's engine never calls a
-- model: poll() hands out requests, reply() takes the answers, fd() and
-- timeout() say when to poll again. This module runs the user's callbacks
-- the asynchronous way and keeps polling; the adapters in rlm.adapters only
-- say how their loop watches a descriptor, runs a timer and defers a call.
local dispatch = require("rlm.drive.dispatch")
local util = require("rlm.base.util")

local M = {}

-- Calls a model callback fn(arg, done) the asynchronous way and calls
-- finish(ok, text, usage) once: rlm.util.invoke, the one path of every host.
function M.invoke(fn, arg, finish)
  return util.invoke(fn, arg, finish, false)
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
