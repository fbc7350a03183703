-- rlm_ask: the example plugin is rlm's own Neovim plugin, rlm.nvim (with
-- the clone on 'runtimepath', require("rlm.nvim").setup({...}) is all it
-- takes; see lua/rlm/nvim.lua). This name stays for configurations that
-- put examples/nvim on 'runtimepath'.
return require("rlm.nvim")
