-- :RlmAsk, :RlmAskFiles and :RlmCancel when examples/nvim is on
-- 'runtimepath'; require("rlm.nvim").setup({...}) defines them too.
-- luacheck: read globals vim
require("rlm.nvim").commands()
