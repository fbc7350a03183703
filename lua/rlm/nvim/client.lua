-- rlm.nvim.client: what rlm.nvim needs before a question runs: the
-- adapter (with the C core, or the one line that says how to build it) and
-- the model client from setup()'s settings or the environment.
-- luacheck: read globals vim
local M = {}

-- rlm.core is built by `make nvim` (the plugin manager's build step). When
-- it is missing, require("rlm.nvim") and setup() still succeed, so that an
-- init.lua goes on; setup() says so once (vim.notify), and each command
-- says it again when used. Returns the adapter, or nil, the message.
-- The first failure is kept: under Lua 5.1 a second require of a module
-- that raised says only "loop or previous error loading module".
local load_problem
function M.load_adapter()
  if load_problem then
    return nil, load_problem
  end
  local ok, adapter = pcall(require, "rlm.adapters.nvim")
  if ok then
    return adapter
  end
  local why = tostring(adapter)
  if why:find("rlm.core", 1, true) then
    local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/lua/rlm/nvim/client%.lua$")
      or "the plugin's directory"
    why = ("rlm: run `make nvim` in %s: the C core (lua/rlm/core.so) is not built (lazy.nvim: build = "
      .. "\"make nvim\", then :Lazy build rlm, and restart Neovim); :checkhealth rlm says what else is missing")
      :format(here)
  end
  load_problem = why
  return nil, why
end

-- The client for the endpoint, made when a question needs it: the settings
-- from setup(), else from the environment, as every host reads them
-- (rlm.llm.settings; the key is read at each call). Raises one line when
-- one is missing ("rlm: no model: give setup({ model = ... }) or set
-- RLM_MODEL").
function M.default(c)
  local settings = require("rlm.llm.settings")
  local s, why = settings.read({ provider = c.provider, base_url = c.base_url, model = c.model,
    sub_model = c.sub_model, api_key_env = c.api_key_env },
    { given_as = { model = "setup({ model = ... })", provider = "setup({ provider = ... })" } })
  if not s then
    error("rlm: " .. why, 0)
  end
  local transport = require("rlm.llm.transport.nvim")
  local request, stop = transport.new()
  return settings.client(s, { stream = c.stream == true, transport = request, sleep = transport.sleep }), stop
end

return M
