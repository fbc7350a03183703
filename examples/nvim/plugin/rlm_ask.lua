-- :RlmAsk {question}: ask a Recursive Language Model about the current
-- buffer. See docs/adapters.md.
-- luacheck: read globals vim
vim.api.nvim_create_user_command("RlmAsk", function(cmd)
  require("rlm_ask").ask(cmd.args)
end, { nargs = "+", desc = "Ask an RLM session about the current buffer" })
