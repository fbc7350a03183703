-- The Neovim plugin before `make nvim`: a clone on 'runtimepath' with no
-- lua/rlm/core.so, set up from the init file, as a plugin manager's config
-- does at every start. Run by spec/hosts/run as the init file itself:
--
--   nvim --headless --clean -u spec/hosts/nvim/unbuilt.lua -i NONE -n --cmd "set rtp^=$CLONE"
--
-- setup() must raise nothing (it raised E5113 at every start), say once
-- with vim.notify what to run, and a command must say it again when used.
-- Prints one "ok - ..." / "not ok - ..." line per case, then quits.
-- luacheck: globals vim
local notes = {}
vim.notify = function(msg, level)
  notes[#notes + 1] = { msg = tostring(msg), level = level }
end

local function report(ok, name, detail)
  io.stdout:write((ok and "ok - " or "not ok - ") .. "nvim-unbuilt: " .. name
    .. ((not ok and detail) and (": " .. tostring(detail)) or "") .. "\n")
end

local function said(i)
  local n = notes[i]
  return n and n.level == vim.log.levels.ERROR and n.msg:find("run `make nvim` in ", 1, true) ~= nil
end

local loaded = pcall(require, "rlm.core")
report(not loaded, "no rlm.core on this path (the clone is not built)")

local ok, err = pcall(function()
  require("rlm.nvim").setup({})
  require("rlm.nvim").setup({}) -- a second setup() says nothing more
end)
report(ok, "require('rlm.nvim').setup() raises nothing", err)
report(#notes == 1 and said(1), "setup() says once, as an error through vim.notify, to run make nvim",
  notes[1] and notes[1].msg or ("%d notes"):format(#notes))

local ran, cmd_err = pcall(vim.cmd, "RlmAsk what is in here?")
report(ran and #notes == 2 and said(2), ":RlmAsk says it again, and raises nothing",
  cmd_err or (notes[2] and notes[2].msg) or ("%d notes"):format(#notes))

io.stdout:flush()
vim.cmd("qa!")
