-- An editor of spec/hosts/nvim/durable.lua's: the plugin (rlm.nvim) set up
-- as a user's init.lua does, its models the settings in the environment,
-- then `:RlmAsk` about a buffer (RLM_CHILD_MODE=ask) or `:RlmResume`
-- (resume). Writes to RLM_CHILD_OUT, a line each: "id <journal id>" once
-- the run started, then "answer <text>", or "error <the line in
-- rlm://answer>" and "notified <the line the editor showed>", and quits.
-- luacheck: globals vim
local root = assert(os.getenv("RLM_ROOT"), "RLM_ROOT")
local build = os.getenv("RLM_BUILD") or (root .. "/build")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/5.1/?.so;" .. package.cpath
local uv = vim.uv or vim.loop

local out = assert(io.open(assert(os.getenv("RLM_CHILD_OUT")), "a"))
local function say(what, text)
  out:write(what, " ", (tostring(text):gsub("\n", "\\n")), "\n")
  out:flush()
end

local notified
vim.notify = function(msg, level)
  if level == vim.log.levels.ERROR then
    notified = msg
  end
end

local plugin = require("rlm.nvim")
plugin.setup({ sandbox = { tmpdir = assert(os.getenv("RLM_CHILD_TMPDIR")) } })
if os.getenv("RLM_CHILD_MODE") == "ask" then
  vim.api.nvim_buf_set_lines(0, 0, -1, false, { "ERROR a", "ok", "ERROR b" })
  vim.cmd("RlmAsk How many errors?")
else
  vim.cmd("RlmResume")
end
if plugin.journal_id then
  say("id", plugin.journal_id)
end

local t = uv.new_timer()
t:start(10, 10, vim.schedule_wrap(function()
  local answer = plugin.last_answer
  if answer == nil and notified == nil then
    return
  end
  t:stop()
  if answer ~= nil then
    say("answer", answer)
  else -- the line whole, as rlm://answer has it (the notified one may be cut to the message area)
    local buf = vim.fn.bufnr("rlm://answer")
    say("error", buf >= 0 and table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), "\n") or notified)
    say("notified", notified)
  end
  out:close()
  vim.cmd("qall!")
end))
