-- rlm.nvim.ui: what rlm.nvim shows: the running session's progress line
-- (a floating window, or the text for a statusline) and the answer buffer.
-- luacheck: read globals vim
local errors = require("rlm.base.errors")

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

-- An error as the command line gives it: one line (rlm.base.errors.line),
-- said once, and shown in rlm://answer. A line wider than the message area
-- would stop the editor at a hit-enter prompt: it is cut to fit, keeping a
-- session error's kind and the end of its message (where a failed model
-- call's cause is), or the start of a raised one; rlm://answer has it whole.
function M.notify_error(err)
  local line = errors.line(err)
  if not line:find("^rlm") then
    line = "rlm: " .. line
  end
  M.show_answer({ line })
  local room = vim.v.echospace - 1
  if vim.fn.strdisplaywidth(line) > room and room > 40 then
    local keep = room - #"... (rlm://answer)"
    if errors.is_error(err) then
      local head = "rlm: " .. err.kind .. ": "
      line = head .. "..." .. vim.fn.strcharpart(line, vim.fn.strchars(line) - keep + #head) .. " (rlm://answer)"
    else
      line = vim.fn.strcharpart(line, 0, keep) .. "... (rlm://answer)"
    end
  end
  vim.notify(line, vim.log.levels.ERROR)
end

-- The on_event of a run's session: the user's own first, then the
-- progress line of what (its step, its sub-calls, its time, the tail of
-- the root model's text), given to show while live() says the run is on.
function M.progress_events(what, user_event, live, show)
  local t0 = (vim.uv or vim.loop).hrtime()
  local step, subs, writing = 0, 0, ""
  return function(ev)
    if user_event then
      user_event(ev)
    end
    if not live() then
      return
    end
    if ev.type == "step_start" and ev.depth == 0 then
      step, writing = ev.step, ""
    elseif ev.type == "sub_query" then
      subs = subs + 1
    elseif ev.type == "root_delta" and ev.depth == 0 then
      -- the tail of the root model's text as it comes, on one line
      writing = (writing .. ev.text):gsub("%s+", " "):sub(-40)
    end
    show(("rlm: %s, step %d, %d sub-calls, %.0f s%s"):format(what, step, subs,
      ((vim.uv or vim.loop).hrtime() - t0) / 1e9, writing ~= "" and (": " .. writing) or ""))
  end
end

return M
