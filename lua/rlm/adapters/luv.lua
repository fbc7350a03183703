-- rlm on a plain luv loop (require "luv"; also Neovim's vim.loop).
--
--   local session = require("rlm.adapters.luv").run(opts, function(err, result) ... end)
--   uv.run()
--
-- root_llm and llm_query may answer at once, yield until a luv callback
-- resumes them, or call done(text[, usage]) later: see rlm.util.invoke.
local async = require("rlm.async")
local rlm = require("rlm")
local util = require("rlm.base.util")

local M = {}

-- luv (1.44 in Debian 12, still so in 1.52.1) keeps the loop it makes alive
-- through its first module table only (the _loop field). Once that table is
-- collected the loop is closed and freed, yet require("luv") after
-- package.loaded.luv was dropped (busted's insulation between spec files, a
-- module reloader) returns a table over that loop, and the next handle is a
-- use after free: EEXIST or a segfault in the host (luvit/luv#819; #821,
-- in no release yet, leaves a NULL loop instead). A module a session is
-- driven on is held in the registry, which no reloader clears, for the Lua
-- state's life.
local KEPT = "rlm.adapters.luv: the luv modules sessions ran on"

local function keep(uv)
  local registry = debug.getregistry()
  local kept = registry[KEPT] or {}
  registry[KEPT] = kept
  kept[uv] = true
end

-- The host interface of rlm.async over a luv module (luv, or vim.loop).
function M.host(uv)
  keep(uv)
  return {
    watch = function(fd, fn)
      local p = assert(uv.new_poll(fd))
      p:start("r", function()
        fn()
      end)
      return function()
        p:stop()
        p:close()
      end
    end,
    timer = function()
      local t = assert(uv.new_timer())
      return {
        start = function(_, ms, fn)
          t:stop()
          t:start(ms, 0, fn)
        end,
        stop = function()
          t:stop()
        end,
        close = function()
          t:close()
        end,
      }
    end,
  }
end

-- Drives an existing session; the caller closes it. Returns cancel().
function M.drive(session, cb, uv)
  return async.drive(session, M.host(uv or require("luv")), cb)
end

-- The callback-last entry point: a new session from opts, driven to its end
-- and closed, then cb(err, result). Misuse raises at once, as in
-- Session.new. Returns the session (close() cancels the run).
function M.run(opts, cb, uv)
  if not util.is_callable(cb) then
    error("rlm.adapters.luv.run: argument 2 must be a function(err, result), got " .. type(cb), 2)
  end
  local s = rlm.Session.new(opts)
  M.drive(s, function(err, result)
    s:close()
    cb(err, result)
  end, uv)
  return s
end

return M
