-- :RlmAsk once, as a user types it in `nvim big.log` (docs/llm.md,
-- "Settings"), for spec/hosts/settings.py: the plugin is set up with no
-- options (README's packer and vim-plug lines), so every model setting
-- comes from the environment the editor was started in. Prints the
-- rlm://answer buffer's text as "answer: ..." (or the plugin's one-line
-- error as "error: ...") on stdout, then quits.
--
--   nvim --headless ... big.log -c "luafile spec/hosts/nvim/ask_once.lua"
--
-- RLM_ASK_QUESTION: the question typed after :RlmAsk.
-- luacheck: globals vim
local uv = vim.uv or vim.loop
local plugin = require("rlm.nvim")
local LIMIT_MS = 120000

plugin.setup({})
vim.cmd("RlmAsk " .. assert(os.getenv("RLM_ASK_QUESTION"), "RLM_ASK_QUESTION"))
local t0 = uv.hrtime()
local timer = uv.new_timer()
timer:start(20, 20, vim.schedule_wrap(function()
  local done = plugin.last_answer ~= nil or plugin.last_error ~= nil
  if timer:is_closing() or not done and (uv.hrtime() - t0) / 1e6 < LIMIT_MS then
    return
  end
  timer:stop()
  timer:close()
  local line
  local buf = vim.fn.bufnr("rlm://answer")
  if plugin.last_answer ~= nil and buf ~= -1 then
    line = "answer: " .. table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), "\n")
  elseif plugin.last_error ~= nil then
    line = "error: " .. tostring(plugin.last_error)
  else
    line = ("error: no answer within %d ms"):format(LIMIT_MS)
  end
  io.stdout:write(line, "\n")
  io.stdout:flush()
  vim.cmd("qa!")
end))
