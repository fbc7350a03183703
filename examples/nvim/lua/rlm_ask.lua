-- rlm_ask: a small Neovim plugin over rlm.adapters.nvim. :RlmAsk {question}
-- runs a session whose context is the current buffer and shows the answer
-- in a scratch buffer, while the editor stays responsive.
--
-- The default models are an OpenAI-compatible endpoint reached with curl
-- through jobstart(), so every model call is asynchronous:
--   RLM_BASE_URL (default https://api.openai.com/v1), RLM_API_KEY,
--   RLM_ROOT_MODEL, RLM_SUB_MODEL.
-- setup({ root_llm =, llm_query =, ... }) replaces them, and any other key
-- is passed to rlm.Session.new.
-- luacheck: read globals vim
local adapter = require("rlm.adapters.nvim")

local M = { config = {} }

-- POSTs {model=, messages=} and calls done(text, usage) or done(nil, why).
local function chat(model, messages, done)
  local base = os.getenv("RLM_BASE_URL") or "https://api.openai.com/v1"
  local body_file = vim.fn.tempname()
  vim.fn.writefile({ vim.json.encode({ model = model, messages = messages }) }, body_file)
  local out = {}
  local job = vim.fn.jobstart({ "curl", "-sS", "--fail-with-body", "-K", "-",
    "-H", "Content-Type: application/json", "--data-binary", "@" .. body_file,
    base .. "/chat/completions" }, {
    stdout_buffered = true,
    on_stdout = function(_, data)
      out = data
    end,
    on_exit = function(_, code)
      os.remove(body_file)
      local text = table.concat(out, "\n")
      local ok, reply = pcall(vim.json.decode, text)
      if code ~= 0 or not ok or type(reply) ~= "table" or not reply.choices then
        return done(nil, ("the model endpoint failed (curl exit %d): %s"):format(code, text:sub(1, 300)))
      end
      local usage = reply.usage and { input_tokens = reply.usage.prompt_tokens or 0,
        output_tokens = reply.usage.completion_tokens or 0 }
      done(reply.choices[1].message.content, usage)
    end,
  })
  if job <= 0 then
    os.remove(body_file)
    return done(nil, "could not start curl")
  end
  -- The key goes through curl's stdin, not its command line.
  local key = os.getenv("RLM_API_KEY") or ""
  vim.fn.chansend(job, ('header = "Authorization: Bearer %s"\n'):format(key))
  vim.fn.chanclose(job, "stdin")
end

local function default_root(messages, done)
  chat(os.getenv("RLM_ROOT_MODEL") or "gpt-4o", messages, done)
end

local function default_sub(prompt, done)
  chat(os.getenv("RLM_SUB_MODEL") or "gpt-4o-mini", { { role = "user", content = prompt } }, done)
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
  opts.root_llm = opts.root_llm or default_root
  opts.llm_query = opts.llm_query or default_sub
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
