-- rlm.nvim: the Neovim plugin. With the clone on 'runtimepath' and the core
-- built (`make nvim`):
--
--   require("rlm.nvim").setup({ base_url = "http://127.0.0.1:8080/v1", model = "qwen3" })
--
--   :RlmAsk {question}           about the current buffer
--   :'<,'>RlmAsk {question}      about the selected lines
--   :RlmAskFiles {question}      about the files of the argument list (:args *.log)
--   :RlmCancel (or cancel_key)   ends the running session
--   :RlmResume [id]              after a restart (or a crash), goes on with the
--                                last run (or run id) from its journal
--
-- The session runs on the editor's loop (rlm.adapters.nvim), so the editor
-- stays responsive; its progress shows in a small floating window (or in
-- the statusline through require("rlm.nvim").status()), and the answer in a
-- scratch buffer, rlm://answer.
--
-- The models: provider ("openai", the default, for any OpenAI-compatible
-- endpoint; "anthropic"; "gemini") through rlm.llm.<provider> over
-- rlm.llm.transport.nvim (curl started by jobstart()). provider, base_url,
-- model, sub_model and api_key_env (the NAME of the variable that holds the
-- key) come from setup(), else from the variables every host reads
-- (docs/llm.md, "Settings"): $RLM_PROVIDER, $RLM_BASE_URL, $RLM_MODEL (no
-- default: a question without one says so), $RLM_SUB_MODEL (default: the
-- model), $RLM_API_KEY_ENV (default OPENAI_API_KEY, ANTHROPIC_API_KEY or
-- GEMINI_API_KEY). stream (true: the root model's text shows in the
-- progress line as it comes). root_llm and llm_query
-- replace those models; any other key not listed below goes to
-- rlm.Session.new (max_iterations, max_sub_calls, sandbox, on_event, tools...).
-- setup() raises at once on a key that is neither ("did you mean 'model'?")
-- or a plugin option of the wrong type; every error after is one line.
--
-- The model gets two host tools (docs/api.md, "Tools"): list_buffers() and
-- read_buffer(name), the text of another loaded buffer by its name (or the
-- end of its path), bounded by max_context_bytes. buffer_tools = false
-- leaves them out; tools of your own (setup{ tools = ... }) come beside them.
--
-- Each run keeps a journal (docs/durability.md) in stdpath("state")/
-- rlm-journal (0700): journal = a directory puts it there, journal = false
-- keeps none. A run the editor left unfinished (it quit, or was killed)
-- goes on with :RlmResume, from where it was: no model or tool call whose
-- answer was recorded is made again.
-- luacheck: read globals vim
local checks = require("rlm.base.checks")
local llm_config = require("rlm.llm.config")

local M = { config = {} }

-- setup() keys of the plugin itself, checked by setup(); the others are
-- session options, checked by name there and in full by each question.
local PLUGIN_KEYS = {
  provider = { function(v)
    return M.PROVIDERS[v] ~= nil, llm_config.provider_names('"')
  end },
  base_url = { checks.non_empty_string }, model = { checks.non_empty_string },
  sub_model = { checks.non_empty_string }, api_key_env = { checks.non_empty_string },
  stream = { checks.boolean },
  progress = { function(v)
    return v == "float" or v == "statusline" or v == false, '"float", "statusline" or false'
  end },
  cancel_key = { function(v)
    return v == false or type(v) == "string" and v ~= "", "a key (a non-empty string) or false"
  end },
  max_context_bytes = { checks.integer(1) }, buffer_tools = { checks.boolean },
  journal = { function(v)
    return type(v) == "boolean" or type(v) == "string" and v:sub(1, 1) == "/", "true, false or an absolute directory"
  end },
}
M.defaults = {
  progress = "float", -- "float", "statusline" (see status()) or false
  cancel_key = "<C-c>", -- a normal-mode key mapped while a session runs; false: none
  max_context_bytes = 256 * 2 ^ 20, -- the most a list of files (or read_buffer) may add up to
  buffer_tools = true, -- list_buffers() and read_buffer(name) in the REPL
  journal = true, -- true: stdpath("state")/rlm-journal; a directory; false: none
}

local function uv()
  return vim.uv or vim.loop
end

local function option(name)
  local v = M.config[name]
  if v == nil then
    v = M.defaults[name]
  end
  return v
end

-- The providers setup() accepts (rlm.llm.settings has their key variables
-- and endpoints).
M.PROVIDERS = require("rlm.llm.settings").PROVIDERS

local ui = require("rlm.nvim.ui")
local client_of = require("rlm.nvim.client")
local load_adapter = client_of.load_adapter
local function default_client()
  return client_of.default(M.config)
end
local progress, close_float, show_answer = ui.progress, ui.close_float, ui.show_answer
local function show_progress(text)
  ui.show_progress(text, option("progress"))
end

-- The running session's progress, for a statusline:
--   vim.o.statusline = "%f %= %{v:lua.require'rlm.nvim'.status()}"
function M.status()
  return M.session and progress.text or ""
end

local cancel_mapped = nil

local function unmap_cancel()
  if cancel_mapped then
    pcall(vim.keymap.del, "n", cancel_mapped)
    cancel_mapped = nil
  end
end

local function map_cancel()
  local key = option("cancel_key")
  if key and not cancel_mapped then
    vim.keymap.set("n", key, M.cancel, { desc = "Cancel the running rlm session" })
    cancel_mapped = key
  end
end

local function finished()
  M.session, M.journal_id = nil, nil
  unmap_cancel()
  close_float()
  progress.text = ""
end

-- Ends the running session, if any (its sandbox is killed at once).
function M.cancel()
  local s = M.session
  if not s then
    return false
  end
  M.cancelled = true
  finished()
  s:close()
  if M.stop_requests then
    M.stop_requests() -- the model call in flight, if any: its curl goes now
  end
  vim.notify("rlm: cancelled", vim.log.levels.WARN)
  return true
end

-- The files of the argument list as one context, and the host tools
-- (rlm.nvim.buffers), bounded by max_context_bytes.
local buffers = require("rlm.nvim.buffers")
function M.files_context(paths)
  return buffers.files_context(paths, option("max_context_bytes"))
end
M.buffer_tools = buffers.tools(function()
  return option("max_context_bytes")
end)

-- An error as the command line gives it: one line, said once, and whole
-- in rlm://answer (rlm.nvim.ui).
M.notify_error = ui.notify_error

local journal = require("rlm.nvim.journal")

-- The session options of a question: setup()'s, the models, the context,
-- the host tools, the progress line, and the journal's store (nil with
-- journal = false).
local function session_opts(question, context, what)
  local opts = {}
  for k, v in pairs(M.config) do
    if not PLUGIN_KEYS[k] then
      opts[k] = v
    end
  end
  M.stop_requests = nil
  if not (opts.root_llm and opts.llm_query) then
    local client, stop = default_client()
    M.client, M.stop_requests = client, stop
    opts.root_llm = opts.root_llm or client.root_llm
    opts.llm_query = opts.llm_query or client.llm_query
  end
  opts.context = context
  opts.query = question
  if option("buffer_tools") then
    local tools = {}
    for k, v in pairs(M.buffer_tools) do
      tools[k] = v
    end
    for k, v in pairs(opts.tools or {}) do
      tools[k] = v
    end
    opts.tools = tools
  end
  opts.on_event = ui.progress_events(what, opts.on_event, function()
    return M.session ~= nil
  end, function(text)
    local key = option("cancel_key")
    show_progress(text .. (key and (" (" .. key .. " cancels)") or ""))
  end)
  local store = journal.store(option("journal"))
  if store then
    opts.journal = { store = store, owner = journal.owner() }
  end
  return opts, store
end

-- Starts a run with start(opts, cb) (the adapter's run, or its resume),
-- the question's session replacing any still running; the answer lands in
-- M.last_answer and rlm://answer, a failure in M.last_error. Returns the
-- session.
local function launch(start, opts, store, what, question, context)
  local t0 = uv().hrtime()
  M.last_answer, M.last_error, M.cancelled = nil, nil, false
  if M.session then
    local old = M.session
    finished()
    old:close()
  end
  local session, id
  local err
  session, err = start(opts, function(e, result)
    if store and id then
      journal.forget(store, id) -- finished: the session deleted its entries
    end
    if M.session ~= session then
      return -- cancelled, or superseded by a later question
    end
    finished()
    if e then
      M.last_error = e
      M.notify_error(e)
      return
    end
    M.last_answer = result.answer
    local lines = vim.split(result.answer, "\n", { plain = true })
    lines[#lines + 1] = ""
    lines[#lines + 1] = ("-- %s: %d steps, %d sub-calls, %.1f s"):format(question, result.iterations,
      result.sub_calls, (uv().hrtime() - t0) / 1e9)
    show_answer(lines)
  end)
  if not session then
    error(err, 0)
  end
  if store then
    id = session:journal_id()
    M.journal_id = id
    journal.remember(store, { id = id, question = question, what = what, context = context })
  end
  M.session = session
  map_cancel()
  show_progress(("rlm: %s, starting"):format(what))
  return session
end

-- Asks question about context (a string; default: the current buffer).
-- Returns the session; M.cancel() or session:close() ends it. The answer
-- lands in M.last_answer and rlm://answer, a failure in M.last_error.
function M.ask(question, context, what)
  -- An unbuilt core first: it is what the settings' message would hide.
  local adapter, why = load_adapter()
  if not adapter then
    error(why, 0)
  end
  if type(context) == "number" or context == nil then
    context = table.concat(vim.api.nvim_buf_get_lines(context or 0, 0, -1, false), "\n")
  end
  what = what or "the buffer"
  local opts, store = session_opts(question, context, what)
  return launch(adapter.run, opts, store, what, question, context)
end

-- Goes on with run id (default: the last run the journal remembers) from
-- its journal, as a question goes; raises one line when there is none, or
-- when it cannot be resumed (another editor holds it: its owner named).
function M.resume(id)
  local adapter, why = load_adapter()
  if not adapter then
    error(why, 0)
  end
  local store, dir = journal.store(option("journal"))
  if not store then
    error("rlm: :RlmResume needs the journal (setup({ journal = false }) turned it off)", 0)
  end
  local run = journal.last(store)
  if id == nil or id == "" then
    if not run then
      error("rlm: no run to resume in " .. dir, 0)
    end
    id = run.id
  elseif not (run and run.id == id) then
    run = { id = id }
  end
  local what = run.what or ("run " .. id)
  local opts = session_opts(run.question, run.context, what)
  journal.release_if_gone(store, id)
  return launch(function(o, cb)
    local s, err = adapter.resume(id, o, cb)
    if not s then
      err = journal.held_line(err)
    end
    return s, err
  end, opts, store, what, run.question or id, run.context)
end

local function complain(f)
  return function(cmd)
    local ok, err = pcall(f, cmd)
    if not ok then
      M.notify_error(err)
    end
  end
end

-- Defines :RlmAsk, :RlmAskFiles, :RlmCancel and :RlmResume (setup() calls
-- it).
function M.commands()
  vim.api.nvim_create_user_command("RlmAsk", complain(function(cmd)
    if cmd.range and cmd.range > 0 then
      local lines = vim.api.nvim_buf_get_lines(0, cmd.line1 - 1, cmd.line2, false)
      M.ask(cmd.args, table.concat(lines, "\n"), ("lines %d-%d"):format(cmd.line1, cmd.line2))
    else
      M.ask(cmd.args, 0, vim.fn.expand("%:t") ~= "" and vim.fn.expand("%:t") or "the buffer")
    end
  end), { nargs = "+", range = true, desc = "Ask an RLM session about the buffer or the selected lines" })
  vim.api.nvim_create_user_command("RlmAskFiles", complain(function(cmd)
    local files = vim.fn.argv()
    if #files == 0 then
      error("rlm: the argument list is empty (:args *.log first)", 0)
    end
    M.ask(cmd.args, M.files_context(files), ("%d files"):format(#files))
  end), { nargs = "+", desc = "Ask an RLM session about the files of the argument list" })
  vim.api.nvim_create_user_command("RlmCancel", function()
    M.cancel()
  end, { desc = "Cancel the running RLM session" })
  vim.api.nvim_create_user_command("RlmResume", complain(function(cmd)
    M.resume(cmd.args)
  end), { nargs = "?", desc = "Go on with the last RLM run (or run id) from its journal" })
end

-- setup(config): the plugin's options (above) and session options; defines
-- the commands.
function M.setup(config)
  -- The core first: the session options' names come with it (a failed
  -- require of them first would hide why under Lua 5.1).
  local adapter, why = load_adapter()
  local schema = {}
  for k, rule in pairs(PLUGIN_KEYS) do
    schema[k] = rule
  end
  local any = { function()
    return true
  end }
  for _, name in ipairs(adapter and require("rlm.engine.options").names or {}) do
    schema[name] = schema[name] or any
  end
  if adapter or type(config) ~= "table" then
    checks.options("rlm.nvim.setup", config, schema, nil, 2)
  else -- unbuilt: the plugin's own keys only
    for k, v in pairs(config) do
      if PLUGIN_KEYS[k] then
        checks.option("rlm.nvim.setup", k, PLUGIN_KEYS[k], v, 2)
      end
    end
  end
  M.config = config or {}
  M.commands()
  if why and not M.warned then
    M.warned = true
    vim.notify(why, vim.log.levels.ERROR)
  end
  return M
end

-- Leaving the editor ends a session still running; one with a journal is
-- left to :RlmResume (closing it would delete its journal).
vim.api.nvim_create_autocmd("VimLeavePre", {
  callback = function()
    if M.session and not M.journal_id then
      local s = M.session
      finished()
      s:close()
    end
  end,
})

return M
