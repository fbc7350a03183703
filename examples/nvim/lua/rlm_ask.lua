-- rlm_ask: a small Neovim plugin over rlm.adapters.nvim. :RlmAsk {question}
-- runs a session whose context is the current buffer and shows the answer
-- in a scratch buffer, while the editor stays responsive.
--
-- The default models are an OpenAI-compatible endpoint, through
-- rlm.llm.openai over rlm.llm.transport.nvim (curl started by jobstart(), so
-- every model call is asynchronous, and retries wait on a timer):
--   RLM_BASE_URL (default https://api.openai.com/v1), RLM_API_KEY,
--   RLM_ROOT_MODEL, RLM_SUB_MODEL.
-- setup({ root_llm =, llm_query =, ... }) replaces them, and any other key
-- is passed to rlm.Session.new.
-- luacheck: read globals vim
local adapter = require("rlm.adapters.nvim")
local openai = require("rlm.llm.openai")
local transport = require("rlm.llm.transport.nvim")

local M = { config = {} }

-- The client for the default models, made when a question needs it (the
-- key is read then, from $RLM_API_KEY).
local function default_client()
  return openai.new({
    base_url = os.getenv("RLM_BASE_URL") or "https://api.openai.com/v1",
    model = os.getenv("RLM_ROOT_MODEL") or "gpt-4o",
    sub_model = os.getenv("RLM_SUB_MODEL") or "gpt-4o-mini",
    api_key_env = "RLM_API_KEY",
    transport = transport.new(),
    sleep = transport.sleep,
  })
end

function M.setup(config)
  M.config = config or {}
end

local function show(lines)
  local name = "rlm://answer"
  local buf = vim.fn.bufnr(name)
  if buf < 0 then
    buf = vim.api.nvim_create_buf(false, true)
    vim.api.nvim_buf_set_name(buf, name)
  end
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  if vim.fn.bufwinid(buf) < 0 then
    vim.cmd("botright split")
    vim.api.nvim_win_set_buf(0, buf)
    vim.cmd("wincmd p")
  end
end

-- Asks about buffer bufnr (default: the current one). Returns the session
-- (session:close() cancels).
function M.ask(question, bufnr)
  local opts = {}
  for k, v in pairs(M.config) do
    opts[k] = v
  end
  if not (opts.root_llm and opts.llm_query) then
    local client = default_client()
    M.client = client
    opts.root_llm = opts.root_llm or client.root_llm
    opts.llm_query = opts.llm_query or client.llm_query
  end
  opts.context = table.concat(vim.api.nvim_buf_get_lines(bufnr or 0, 0, -1, false), "\n")
  opts.query = question
  opts.on_event = opts.on_event or function(ev)
    if ev.type == "step_start" then
      vim.api.nvim_echo({ { ("rlm: step %d"):format(ev.step), "Comment" } }, false, {})
    end
  end
  M.last_answer, M.last_error = nil, nil
  if M.session then
    M.session:close()
  end
  local session
  session = adapter.run(opts, function(err, result)
    if M.session ~= session then
      return -- superseded by a later question
    end
    M.session = nil
    if err then
      M.last_error = err
      vim.notify("rlm: " .. tostring(err), vim.log.levels.ERROR)
      return
    end
    M.last_answer = result.answer
    show(vim.split(result.answer, "\n", { plain = true }))
  end)
  M.session = session
  return session
end

-- Leaving the editor ends a session still running.
vim.api.nvim_create_autocmd("VimLeavePre", {
  callback = function()
    if M.session then
      M.session:close()
    end
  end,
})

return M
