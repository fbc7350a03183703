-- rlm.nvim.ui: what rlm.nvim shows: the running session's progress line
-- (a floating window, or the text for a statusline) and the answer buffer.
-- luacheck: read globals vim
local M = {}

-- Progress: one line of text, shown in a floating window or left for the
-- statusline.
M.progress = { text = "", win = nil, buf = nil }
local progress = M.progress

function M.close_float()
  if progress.win and vim.api.nvim_win_is_valid(progress.win) then
    vim.api.nvim_win_close(progress.win, true)
  end
  progress.win = nil
end

-- mode: "float", "statusline" or false (rlm.nvim's progress option).
function M.show_progress(text, mode)
  progress.text = text
  if mode == "float" then
    if not (progress.buf and vim.api.nvim_buf_is_valid(progress.buf)) then
      progress.buf = vim.api.nvim_create_buf(false, true)
    end
    vim.api.nvim_buf_set_lines(progress.buf, 0, -1, false, { text })
    local width = math.max(20, math.min(#text + 2, vim.o.columns - 4))
    local conf = { relative = "editor", anchor = "NE", row = 1, col = vim.o.columns - 1, width = width,
      height = 1, style = "minimal", focusable = false, border = "rounded", noautocmd = true }
    if progress.win and vim.api.nvim_win_is_valid(progress.win) then
      conf.noautocmd = nil
      vim.api.nvim_win_set_config(progress.win, conf)
    else
      progress.win = vim.api.nvim_open_win(progress.buf, false, conf)
    end
  elseif mode == "statusline" then
    vim.cmd("redrawstatus")
  end
end

-- Shows lines in the scratch buffer rlm://answer, in a split of its own.
function M.show_answer(lines)
  local name = "rlm://answer"
  local buf = vim.fn.bufnr(name)
  if buf < 0 then
    buf = vim.api.nvim_create_buf(false, true)
    vim.api.nvim_buf_set_name(buf, name)
    vim.api.nvim_buf_set_option(buf, "filetype", "markdown")
  end
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  if vim.fn.bufwinid(buf) < 0 then
    vim.cmd("botright split")
    vim.api.nvim_win_set_buf(0, buf)
    vim.cmd("wincmd p")
  end
  return buf
end

return M
