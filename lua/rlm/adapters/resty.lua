-- rlm inside OpenResty (ngx_lua), without stalling the nginx worker.
--
--   local resty = require("rlm.adapters.resty")
--   local result, err = resty.run(opts)         -- rewrite, access, content, timer
--   local h = resty.start(opts)                 -- the same, with a handle first:
--   local result, err = h:wait()                --   h:cancel() from anywhere ends it
--   resty.run(opts, function(err, result) end)  -- any phase with ngx.timer.at
--   local h, err = resty.resume(id, opts)       -- a journaled run goes on
--
-- ngx_lua has no way to wait on a raw descriptor, so the session is pumped
-- with s:poll() and a short wait between polls: ngx.semaphore's wait, which
-- yields the request's coroutine to nginx (the worker serves its other
-- requests meanwhile) and wakes at once when a model callback answers.
-- Each root_llm / llm_query call runs in a light thread of its own
-- (ngx.thread.spawn), so callbacks may use cosockets, ngx.sleep and
-- ngx.location.capture, and several sub-calls run at once. A callback may
-- also return nothing and call done(text[, usage]) later, from any request
-- or timer of the same worker (see rlm.util.invoke). on_event and cost.usd
-- run inside the pump and must not yield.
-- luacheck: read globals ngx
local util = require("rlm.base.util")
local dispatch = require("rlm.drive.dispatch")
local errors = require("rlm.base.errors")
local rlm = require("rlm")

local M = {}

-- The wait between polls while nothing happens: it starts short after any
-- activity (the driver tends to speak again soon) and doubles up to the cap.
-- Replies from callbacks wake the loop at once.
M.MIN_WAIT_MS = 1
M.MAX_WAIT_MS = 10

-- Phases where the worker lets a request's coroutine wait (ngx.sleep,
-- ngx.semaphore, ngx.thread). The TLS handshake phases allow it too, but
-- a session there would hold the handshake.
local WAITABLE = { rewrite = true, access = true, content = true, timer = true }

local function check_phase(who)
  local p = ngx.get_phase()
  if not WAITABLE[p] then
    error(("rlm.adapters.resty.%s: a session cannot wait in the '%s' phase (only in rewrite, access, "
      .. "content and timer); pass a callback to run it in a timer"):format(who, p), 3)
  end
end

local function exiting_error(s)
  return errors.new("driver_exited", "the nginx worker is exiting; the session was closed",
    { history = s.conversation.history })
end

-- The blocking loop: drives s in the current request (or timer) coroutine
-- until its end (rlm.dispatch's loop, with each callback in a light
-- thread). Returns result | nil, err.
local function loop(s)
  local semaphore = require("ngx.semaphore")
  local wake = semaphore.new()
  local threads, over = {}, false -- the light threads still running
  local started = 0 -- callbacks started: activity, so the wait starts short again

  local function start(fn, arg, settle)
    local t = ngx.thread.spawn(util.invoke, fn, arg, function(ok, text, usage)
      if over then
        return
      end
      -- done() may come from another request: raise nothing into it.
      local sent, e = pcall(settle, ok, text, usage)
      if not sent then
        ngx.log(ngx.ERR, "rlm: ", tostring(e))
      end
      wake:post(1)
    end)
    threads[t] = true
    started = started + 1
  end

  -- A finished light thread stays a zombie until its parent waits for it.
  local function reap()
    for t in pairs(threads) do
      if coroutine.status(t) == "dead" then
        threads[t] = nil
        ngx.thread.wait(t)
      end
    end
  end

  local function finish()
    over = true
    for t in pairs(threads) do
      threads[t] = nil
      if coroutine.status(t) == "dead" then
        ngx.thread.wait(t)
      else
        ngx.thread.kill(t)
      end
    end
    dispatch.release(s)
  end

  dispatch.claim(s, "rlm.adapters.resty", function()
    wake:post(1) -- closed from elsewhere (an abort, a cancel): look now
  end)
  local wait_ms = M.MIN_WAIT_MS
  while true do
    if ngx.worker.exiting() then
      finish()
      s:close()
      return nil, exiting_error(s)
    end
    reap()
    local before = started
    local ok, ev = pcall(dispatch.next, s, start)
    if not ok then
      ev = dispatch.fail(s, ev)
    end
    if started ~= before then
      wait_ms = M.MIN_WAIT_MS
    end
    if ev == nil then
      local ms = s:timeout()
      ms = (ms >= 0 and ms < wait_ms) and math.ceil(ms) or wait_ms
      if ms > 0 then
        wake:wait(ms / 1000)
      else
        -- "Poll again now", letting the worker run its other events first:
        -- 1 ms, since ngx.sleep(0) warns in error.log on an nginx without
        -- OpenResty's delayed-events patch (Debian's).
        ngx.sleep(0.001)
      end
      wait_ms = math.min(wait_ms * 2, M.MAX_WAIT_MS)
    else
      finish()
      if ev.type == "done" then
        return ev.result
      end
      return nil, ev.err
    end
  end
end

-- Runs fn in a timer (a context of its own, detached from the request), so
-- that it may wait whatever phase the caller is in.
local function in_timer(who, fn)
  local ok, err = ngx.timer.at(0, function(premature)
    fn(premature)
  end)
  if not ok then
    error(("rlm.adapters.resty.%s: ngx.timer.at failed: %s"):format(who, tostring(err)), 3)
  end
end

local function call_back(cb, err, result)
  local ok, e = pcall(cb, err, result)
  if not ok then
    ngx.log(ngx.ERR, "rlm: the session's callback raised: ", tostring(e))
  end
end

-- Drives an existing session to its end; the caller closes it.
--   drive(s) -> result | nil, err        (rewrite, access, content, timer)
--   drive(s, function(err, result) end)  (in a timer; returns at once)
function M.drive(s, cb)
  if cb == nil then
    check_phase("drive")
    return loop(s)
  end
  if type(cb) ~= "function" then
    error("rlm.adapters.resty.drive: argument 2 must be a function(err, result)", 2)
  end
  in_timer("drive", function(premature)
    if premature then
      return call_back(cb, exiting_error(s))
    end
    local ok, result, err = pcall(loop, s)
    if not ok then
      result, err = nil, result -- an internal error: its message, as rlm.async gives it
    end
    call_back(cb, err, result)
  end)
end

-- A run in the current request (or timer), as a handle (vim.system's
-- shape): start returns at once; wait() drives the session to its end in
-- this request's coroutines and closes it; cancel() (= close()), from a
-- light thread, a timer or a callback, ends the run: wait() then returns
-- nil, err of kind `cancelled`.
local Handle = {}
Handle.__index = Handle

function Handle:wait()
  if self.waited then
    error("rlm.adapters.resty: wait() is called once per handle", 2)
  end
  self.waited = true
  local s = self.session
  local ok, result, err = pcall(loop, s)
  s:close()
  if not ok then
    error(result, 0)
  end
  return result, err
end

function Handle:cancel()
  self.session:close()
end
Handle.close = Handle.cancel

-- start(opts) -> handle (rewrite, access, content, timer). Misuse raises
-- at once, as in Session.new. With lua_check_client_abort on, a client that
-- goes away cancels the run (ngx.on_abort) instead of leaving it to spend
-- tokens, and the sandbox is killed then and there; with it off (nginx's
-- default) the run goes on to its end. A request that registered its own
-- ngx.on_abort first keeps it: call h:cancel() from there. nginx sees a
-- client go away only once the request's body is read, and read in a phase
-- before the one that waits (`lua_need_request_body on;` does it): start
-- says so in error.log, once per worker, when the body is unread.
local warned_body = false
local function warn_unread_body()
  if warned_body or ngx.req.get_body_data() or ngx.req.get_body_file() then
    return
  end
  local h = ngx.req.get_headers()
  local length = tonumber(h["content-length"])
  if (length and length > 0) or h["transfer-encoding"] then
    warned_body = true
    ngx.log(ngx.WARN, "rlm: the request body is unread, so nginx cannot see this client go away ",
      "(lua_check_client_abort): set `lua_need_request_body on;` in the location")
  end
end

local function handle(s)
  if ngx.get_phase() ~= "timer" then
    warn_unread_body()
    pcall(ngx.on_abort, function()
      s:close()
    end)
  end
  return setmetatable({ session = s }, Handle)
end

function M.start(opts)
  check_phase("start")
  return handle(rlm.Session.new(opts))
end

-- resume(id, opts) -> handle | nil, err: start's handle over
-- rlm.Session.resume (docs/durability.md): the run of journal id goes on
-- in this request, in this worker or another; err as resume gives it
-- (`lease_held` with err.owner while another owner holds it).
function M.resume(id, opts)
  check_phase("resume")
  local s, err = rlm.Session.resume(id, opts)
  if not s then
    return nil, err
  end
  return handle(s)
end

-- A new session from opts, driven to its end and closed. Misuse raises at
-- once, as in Session.new.
--   run(opts) -> result | nil, err        (rewrite, access, content, timer;
--     start(opts):wait(), client aborts included)
--   run(opts, function(err, result) end)  (any phase with ngx.timer.at:
--     the session runs in a timer; returns the session, whose cancel()
--     (= close()) cancels the run: cb gets an err of kind `cancelled`)
function M.run(opts, cb)
  if cb == nil then
    check_phase("run")
    return M.start(opts):wait()
  end
  if type(cb) ~= "function" then
    error("rlm.adapters.resty.run: argument 2 must be a function(err, result)", 2)
  end
  local s = rlm.Session.new(opts)
  in_timer("run", function(premature)
    local result, err
    if premature then
      err = exiting_error(s)
    else
      local ok
      ok, result, err = pcall(loop, s)
      if not ok then
        result, err = nil, result -- an internal error: its message, as rlm.async gives it
      end
    end
    s:close()
    call_back(cb, err, result)
  end)
  return s
end

return M
