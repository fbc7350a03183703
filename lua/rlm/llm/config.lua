-- The options every model client takes (rlm.llm.openai, rlm.llm.anthropic,
-- rlm.llm.gemini): their checks and defaults, and the check of a whole cfg
-- against them plus a provider's own. See docs/llm.md.
local M = {}

local checks = require("rlm.base.checks")
local callable, integer, non_empty_string = checks.callable, checks.integer, checks.non_empty_string
local positive_number, non_negative_number = checks.positive_number, checks.non_negative_number

local function base_url(v)
  return type(v) == "string" and v:match("^[hH][tT][tT][pP][sS]?://[^/]") ~= nil,
    "an http:// or https:// URL such as \"https://api.openai.com/v1\""
end

local function env_name(v)
  return type(v) == "string" and v:match("^[%a_][%w_]*$") ~= nil,
    "the NAME of an environment variable (letters, digits, _) that holds the key, not the key"
end

-- A number from lo to hi: a provider's temperature range.
function M.number_in(lo, hi)
  return function(v)
    return type(v) == "number" and v >= lo and v <= hi, ("a number from %s to %s"):format(lo, hi)
  end
end

local function string_map(v)
  if type(v) ~= "table" then
    return false, "a table of header names to string values"
  end
  for k, s in pairs(v) do
    if type(k) ~= "string" or type(s) ~= "string" or k:find("[\r\n:]") or s:find("[\r\n]") then
      return false, "a table of header names to string values (one line each)"
    end
  end
  return true
end

-- The providers, in one list: each a module rlm.llm.<name> over
-- rlm.llm.client, with what a host (rlm.llm.settings: the command line,
-- the Neovim plugin, the OpenResty example) takes for it unless told
-- otherwise: the variable that holds its key and its public endpoint
-- (openai's module has none of its own: it serves any OpenAI-compatible
-- server). The first is the default. No model: every host asks for one.
M.PROVIDERS = {
  { name = "openai", key_env = "OPENAI_API_KEY", base_url = "https://api.openai.com/v1" },
  { name = "anthropic", key_env = "ANTHROPIC_API_KEY", base_url = "https://api.anthropic.com" },
  { name = "gemini", key_env = "GEMINI_API_KEY", base_url = "https://generativelanguage.googleapis.com/v1beta" },
}

-- The provider named name (its row of PROVIDERS), or nil.
function M.provider(name)
  for _, p in ipairs(M.PROVIDERS) do
    if p.name == name then
      return p
    end
  end
end

-- The providers' names for a message: "openai, anthropic or gemini", each
-- quoted when quote is given ('"').
function M.provider_names(quote)
  local names = {}
  for i, p in ipairs(M.PROVIDERS) do
    names[i] = (quote or "") .. p.name .. (quote or "")
  end
  return table.concat(names, ", ", 1, #names - 1) .. " or " .. names[#names]
end

-- Per million tokens: input and output always; cached input read and
-- written (prompt caching) when the provider bills them apart.
M.PRICE_FIELDS = { input_per_mtok = true, output_per_mtok = true, cache_read_per_mtok = false,
  cache_write_per_mtok = false }

local function price_table(v)
  local want = "a table of model names to { input_per_mtok = n, output_per_mtok = n[, cache_read_per_mtok = n, "
    .. "cache_write_per_mtok = n] }"
  if type(v) ~= "table" then
    return false, want
  end
  for model, p in pairs(v) do
    if type(model) ~= "string" or type(p) ~= "table" then
      return false, want
    end
    for field in pairs(p) do
      if M.PRICE_FIELDS[field] == nil then
        return false, ("%s (prices[%q] has unknown field '%s')"):format(want, model, tostring(field))
      end
    end
    for field, required in pairs(M.PRICE_FIELDS) do
      local n = p[field]
      if (required or n ~= nil) and (type(n) ~= "number" or n < 0 or n >= math.huge) then
        return false, ("%s (prices[%q].%s must be a number >= 0)"):format(want, model, field)
      end
    end
  end
  return true
end

-- A model: a name; a list of names, one per depth (the last for deeper
-- sessions); or a function(depth, hint) returning a name.
local function model_choice(v)
  local want = "a model name, a list of names (one per depth), or a function(depth, hint) returning one"
  if non_empty_string(v) or callable(v) then
    return true
  end
  if type(v) ~= "table" or #v == 0 then
    return false, want
  end
  for k, name in pairs(v) do
    if type(k) ~= "number" or k < 1 or k > #v or k ~= math.floor(k) or not non_empty_string(name) then
      return false, want
    end
  end
  return true
end

-- The common rows: name = { check, default, required = }; no default
-- means optional. A provider's own rows (and its base_url default, its
-- temperature range, its max_tokens default) come on top: see M.schema.
local COMMON = {
  base_url = { base_url, required = true },
  model = { model_choice, required = true },
  sub_model = { model_choice },
  api_key_env = { env_name, secret = true },
  temperature = { M.number_in(0, 2) },
  max_tokens = { integer(1) },
  timeout_ms = { positive_number, 300000 },
  retries = { integer(0), 2 },
  retry_base_ms = { non_negative_number, 500 },
  retry_max_ms = { non_negative_number, 60000 },
  jitter = { checks.boolean, true },
  random = { callable },
  prices = { price_table },
  headers = { string_map },
  transport = { callable },
  sleep = { callable },
  gather = { callable },
  stream = { checks.boolean, false },
}

-- The schema of a provider: the common rows with its changes. spec = {
-- base_url = "default URL" (else it is required), temperature = { lo, hi },
-- max_tokens = default, options = { name = rule } }.
function M.schema(spec)
  local schema = {}
  for k, rule in pairs(COMMON) do
    schema[k] = rule
  end
  if spec.base_url then
    schema.base_url = { base_url, spec.base_url }
  end
  if spec.temperature then
    schema.temperature = { M.number_in(spec.temperature[1], spec.temperature[2]) }
  end
  if spec.max_tokens then
    schema.max_tokens = { integer(1), spec.max_tokens }
  end
  for k, rule in pairs(spec.options or {}) do
    schema[k] = rule
  end
  return schema
end

-- cfg checked against schema, with the defaults filled in; a raise that
-- names the option otherwise, at the level of the provider's new()'s
-- caller (new -> rlm.llm.client.new -> here). A wrong api_key_env may be
-- the key itself: its rule is secret, never echoed.
function M.check(where, cfg, schema, names)
  return checks.options(where, cfg, schema, names, 4)
end

return M
