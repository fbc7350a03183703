-- rlm.llm.settings: the model settings of every host (bin/rlm, rlm.nvim,
-- examples/openresty), read from one set of environment variables in one
-- place. A host passes what it was given itself (flags, setup()); each of
-- those wins over its variable. See docs/llm.md, "Settings".
--
--   local s, why = settings.read({ model = flags.model }, { given_as = { model = "--model NAME" } })
--   if not s then ... why is one line: "no model: give --model NAME or set RLM_MODEL" ... end
--   local client = settings.client(s, { transport = ... }) -- with the host's own client options
local M = {}

local config = require("rlm.llm.config")

-- The variable of each setting.
M.VARIABLES = {
  provider = "RLM_PROVIDER",
  base_url = "RLM_BASE_URL",
  model = "RLM_MODEL",
  sub_model = "RLM_SUB_MODEL",
  api_key_env = "RLM_API_KEY_ENV",
}

-- The providers by name (rlm.llm.config's list: each with the variable its
-- key is in by default and its public endpoint), and their names in the
-- order messages list them.
M.PROVIDERS, M.PROVIDER_NAMES = {}, {}
for i, p in ipairs(config.PROVIDERS) do
  M.PROVIDERS[p.name] = p
  M.PROVIDER_NAMES[i] = p.name
end

-- Names read before there was one set (rlm.nvim and examples/openresty), no
-- longer read; while one is set and its successor is not, read() says so.
M.RENAMED = { RLM_ROOT_MODEL = "RLM_MODEL", RLM_API_KEY = "the provider's key variable" }

-- read(given, opts) -> settings | nil, message.
-- given: provider, base_url, model, sub_model, api_key_env as the host was
-- given them (nil: not given; they are not checked here, the client's new()
-- checks them). opts.getenv (default os.getenv; an empty variable counts
-- as unset); opts.given_as: how the host's user gives each setting, for
-- the message ({ model = "--model NAME", provider = "--provider" }).
-- settings = { provider =, module = "rlm.llm.<provider>", config = {
-- base_url, model, sub_model, api_key_env } } (config goes to the
-- module's new(), with the host's own options added).
function M.read(given, opts)
  given, opts = given or {}, opts or {}
  local getenv = opts.getenv or os.getenv
  local given_as = opts.given_as or {}
  local function env(name)
    local v = getenv(name)
    if v == "" then
      return nil
    end
    return v
  end
  local function get(name)
    if given[name] ~= nil then
      return given[name]
    end
    return env(M.VARIABLES[name])
  end

  local model = get("model")
  if model == nil then
    local how = given_as.model and ("give %s or set RLM_MODEL"):format(given_as.model) or "set RLM_MODEL"
    if env("RLM_ROOT_MODEL") then
      how = how .. " (RLM_ROOT_MODEL is no longer read)"
    end
    return nil, "no model: " .. how
  end
  local provider = get("provider") or "openai"
  local p = M.PROVIDERS[provider]
  if not p then
    local source = given.provider ~= nil and (given_as.provider or "provider") or "RLM_PROVIDER"
    return nil, ("%s wants %s, got %s"):format(source, config.provider_names(),
      type(provider) == "string" and ("%q"):format(provider) or type(provider))
  end
  local base_url = get("base_url")
  local api_key_env = get("api_key_env") or p.key_env
  if api_key_env == p.key_env and not env(p.key_env) then
    if env("RLM_API_KEY") then
      return nil, ("no key: RLM_API_KEY is no longer read; put the key in %s (or set RLM_API_KEY_ENV=RLM_API_KEY)")
        :format(p.key_env)
    end
    if base_url == nil then
      return nil, ("no key: set %s (%s needs one; a local server given as RLM_BASE_URL may not)")
        :format(p.key_env, p.base_url)
    end
  end
  return {
    provider = provider,
    module = "rlm.llm." .. provider,
    config = {
      base_url = base_url or p.base_url,
      model = model,
      sub_model = get("sub_model"),
      api_key_env = api_key_env,
    },
  }
end

-- The client of settings s: the module's new() with s.config and the
-- host's own options (extra: transport, sleep, stream, timeout_ms...),
-- s.config left as it was. A misuse raises as new() does, naming the
-- option.
function M.client(s, extra)
  local cfg = {}
  for k, v in pairs(s.config) do
    cfg[k] = v
  end
  for k, v in pairs(extra or {}) do
    cfg[k] = v
  end
  return require(s.module).new(cfg)
end

return M
