-- What a run is given: the model client the flags and the environment
-- make (rlm.llm.settings), and the session's options (rlm.Session.new):
-- the files read, the question, the limits, the tools and the schema.
local args = require("rlm.cli.args")
local is_terminal = require("rlm.cli.console").is_terminal

local M = {}

-- A file's text ("-": standard input, which can be read once: stdin_taken
-- says whether it was); one that cannot be read is the run's failure.
function M.read_file(name, stdin_taken, console)
  if name == "-" then
    if stdin_taken[1] then
      console:usage_error("standard input (\"-\") can be read only once")
    end
    stdin_taken[1] = true
    return io.stdin:read("*a")
  end
  local f, err = io.open(name, "rb")
  if not f then
    console:failure("cannot read " .. tostring(err))
  end
  -- A directory opens, and its read fails: say why (EISDIR).
  local text, why = f:read("*a")
  f:close()
  if not text then
    why = tostring(why or "read failed")
    if why:find("directory", 1, true) then
      why = why .. " (give its files, each with --context)"
    end
    console:failure(("cannot read %s: %s"):format(name, why))
  end
  return text
end

-- The model client: flags, else their variables, else the defaults. cfg
-- (its config, with base_url for the messages) and the client.
function M.client(flags, given, console)
  -- The model settings as every host reads them (rlm.llm.settings): a flag
  -- wins over its variable.
  local settings = require("rlm.llm.settings")
  local s, missing = settings.read({ provider = flags.provider, base_url = flags["base-url"], model = flags.model,
    sub_model = flags["sub-model"], api_key_env = flags["api-key-env"] },
    { given_as = { model = "--model NAME", provider = "--provider" } })
  if not s then
    console:usage_error(missing)
  end
  local cfg = s.config
  cfg.timeout_ms = 180000
  cfg.stream = flags.trace == true -- --trace shows the root model's text as it comes
  for name, spec in pairs(args.FLAGS) do
    if spec[2] == "client" and flags[name] ~= nil then
      cfg[name:gsub("%-", "_")] = flags[name]
    end
  end
  if #flags.price > 0 then
    cfg.prices = {}
    for _, text in ipairs(flags.price) do
      local m, p = args.parse_price(text, console)
      cfg.prices[m] = p
    end
  end

  -- On a terminal, the status line's clock moves while a model call is
  -- out: the transport redraws it as it waits.
  local has_socket, luasocket = pcall(require, "rlm.llm.transport.luasocket")
  if has_socket and not flags.quiet and is_terminal(2) then
    cfg.transport = luasocket.new({ idle = function()
      if console.live then
        console.live.draw()
      end
    end })
  end
  local ok, client = pcall(settings.client, s)
  if not ok then
    local message = tostring(client)
    if message:find("option '", 1, true) then
      console:usage_error(args.option_error(message, given))
    end
    console:failure(message) -- e.g. LuaSocket is not installed
  end
  return cfg, client
end

-- The session's options, every file read.
function M.session(flags, positional, client, console)
  local stdin_taken = {}
  local context
  if #flags.context == 1 then
    context = M.read_file(flags.context[1], stdin_taken, console)
  else
    context = {}
    for _, name in ipairs(flags.context) do
      if context[name] then
        console:usage_error("--context " .. name .. " is given twice")
      end
      context[name] = M.read_file(name, stdin_taken, console)
    end
  end
  local question = positional[1]
  if question == "-" then
    question = M.read_file("-", stdin_taken, console):gsub("%s+$", "")
  end

  local opts = {
    context = context,
    query = question,
    root_llm = client.root_llm,
    llm_query = client.llm_query,
    llm_query_batch = client.llm_query_batch, -- a batch's calls side by side (LuaSocket's select)
    cost = { usd = client.cost_usd },
    step_timeout_ms = 600000,
    sandbox = { python = flags.python },
  }
  for name, spec in pairs(args.FLAGS) do
    if spec[2] == "session" and flags[name] ~= nil then
      opts[name:gsub("%-", "_")] = flags[name]
    end
  end
  if #flags["allow-module"] > 0 then
    opts.sandbox.allowed_modules = flags["allow-module"]
  end
  if flags.tools then
    local chunk, why = loadfile(flags.tools)
    if not chunk then
      console:failure("--tools: " .. tostring(why))
    end
    local loaded, tools = pcall(chunk)
    if not loaded or type(tools) ~= "table" then
      console:failure("--tools " .. flags.tools .. " must return a table of tools: " .. tostring(tools))
    end
    opts.tools = tools
  end
  if flags.schema then
    local text = M.read_file(flags.schema, stdin_taken, console)
    local decoded, schema = pcall(require("cjson").decode, text)
    if not decoded or type(schema) ~= "table" then
      console:usage_error("--schema " .. flags.schema .. " is not a JSON object: " .. tostring(schema))
    end
    opts.answer_schema = schema
  end
  if flags["no-fallback"] then
    opts.fallback = false
  end
  if flags["max-cost-usd"] then
    for _, m in ipairs({ client.model, client.sub_model }) do
      if not client.has_price(m) then
        console:usage_error(("--max-cost-usd needs a price for model %s: add --price %s=IN:OUT"):format(m, m))
      end
    end
    opts.cost.max_usd = flags["max-cost-usd"]
  end
  return opts
end

return M
