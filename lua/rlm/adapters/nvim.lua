-- rlm inside Neovim, on the editor's own loop (vim.loop; vim.uv on 0.10+).
--
--   local session = require("rlm.adapters.nvim").run(opts, function(err, result)
--     -- an ordinary editor context: buffers, windows and vim.fn all work here
--   end)
--
-- The session is pumped from the loop: a poll handle on its descriptor and a
-- timer for its deadlines, so the editor never waits on the sandbox.
-- root_llm and llm_query run through vim.schedule, where editor calls
-- (vim.fn.jobstart, vim.api.*) are allowed; each may return text[, usage]
-- at once, yield until a loop callback resumes its coroutine, or return
-- nothing and call done(text[, usage]) later (see rlm.util.invoke).
-- on_event is deferred with vim.schedule too; cost.usd runs inside the pump
-- (a loop callback) and must not call the editor.
-- luacheck: read globals vim
local async = require("rlm.async")
local luv = require("rlm.adapters.luv")
local rlm = require("rlm")
local util = require("rlm.base.util")

local M = {}

local function uv()
  return vim.uv or vim.loop
end

-- The host interface of rlm.async for Neovim: the loop's poll and timer
-- handles, and vim.schedule to leave the loop callback before any user code
-- runs.
function M.host()
  local host = luv.host(uv())
  host.defer = vim.schedule
  host.defer_callbacks = true
  return host
end

-- Drives an existing session; the caller closes it. cb(err, result) runs
-- through vim.schedule. Returns cancel(). An on_event given to Session.new
-- directly is called from the loop callback, where editor calls fail: run()
-- defers it.
function M.drive(session, cb)
  return async.drive(session, M.host(), cb)
end

-- opts with on_event deferred through vim.schedule (an editor context),
-- or opts itself when it has none.
local function deferred_events(opts, who)
  if type(opts) ~= "table" or opts.on_event == nil then
    return opts
  end
  local on_event = opts.on_event
  if not util.is_callable(on_event) then
    error(("%s: option 'on_event' must be a function (or a callable table), got %s")
      :format(who, type(on_event)), 3)
  end
  local o = {}
  for k, v in pairs(opts) do
    o[k] = v
  end
  o.on_event = function(ev)
    vim.schedule(function()
      on_event(ev)
    end)
  end
  return o
end

local function run_session(s, cb)
  M.drive(s, function(err, result)
    s:close()
    cb(err, result)
  end)
  return s
end

-- A new session from opts, driven to its end and closed, then cb(err,
-- result) in an editor context. Misuse raises at once, as in Session.new.
-- Returns the session: session:close() cancels the run (cb gets a
-- driver_exited error).
function M.run(opts, cb)
  if type(cb) ~= "function" then
    error("rlm.adapters.nvim.run: argument 2 must be a function(err, result)", 2)
  end
  return run_session(rlm.Session.new(deferred_events(opts, "rlm.Session.new")), cb)
end

-- The run of journal id resumed (rlm.Session.resume, docs/durability.md)
-- and driven as run() drives a new one: the session, or nil, err when it
-- cannot be resumed (`lease_held` with err.owner while another holds it).
function M.resume(id, opts, cb)
  if type(cb) ~= "function" then
    error("rlm.adapters.nvim.resume: argument 3 must be a function(err, result)", 2)
  end
  local s, err = rlm.Session.resume(id, deferred_events(opts, "rlm.Session.resume"))
  if not s then
    return nil, err
  end
  return run_session(s, cb)
end

return M
