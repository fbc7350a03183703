-- rlm.llm.usage: the tokens a client's replies reported, by model, and
-- what they cost from a price table; for rlm.llm.client.
local M = {}

-- The counts a usage may hold; the cache's are part of input_tokens.
M.COUNTS = { "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens" }

-- A usage as providers give it, checked: finite counts >= 0 and both of
-- input and output, or nil (the reply is then taken as saying none).
function M.checked(usage)
  if type(usage) ~= "table" then
    return nil
  end
  for _, k in ipairs(M.COUNTS) do
    local n = usage[k]
    if n ~= nil and not (type(n) == "number" and n >= 0 and n < math.huge) then
      return nil
    end
  end
  if usage.input_tokens and usage.output_tokens then
    return usage
  end
end

local Totals = {}
Totals.__index = Totals

-- totals(name, provider, prices) -> the totals of one client: name for
-- its errors, provider for its cache price factors, prices its table.
function M.totals(name, provider, prices)
  return setmetatable({ name = name, provider = provider, prices = prices,
    all = { input_tokens = 0, output_tokens = 0, calls = 0 }, by_model = {} }, Totals)
end

-- One call to model, with its usage or nil.
function Totals:count(model, usage)
  local t = self.by_model[model]
  if not t then
    t = { input_tokens = 0, output_tokens = 0, calls = 0 }
    self.by_model[model] = t
  end
  t.calls = t.calls + 1
  self.all.calls = self.all.calls + 1
  if usage then
    for _, k in ipairs(M.COUNTS) do
      local n = usage[k]
      if n and n > 0 then
        t[k] = (t[k] or 0) + n
        self.all[k] = (self.all[k] or 0) + n
      end
    end
  end
end

-- The USD so far; raises, naming the model, once tokens were counted for
-- one with no price (a budget must not go unenforced unseen). Cached input
-- is priced by the row's cache_read_per_mtok and cache_write_per_mtok, or
-- as input times the provider's factor.
function Totals:cost_usd()
  local usd = 0
  for model, t in pairs(self.by_model) do
    if t.input_tokens + t.output_tokens > 0 then
      local p = self.prices[model]
      if not p then
        error(("%s: no price for model '%s': add it to option prices "
          .. "({ input_per_mtok = n, output_per_mtok = n })"):format(self.name, model), 0)
      end
      local read, written = t.cache_read_input_tokens or 0, t.cache_creation_input_tokens or 0
      local read_price = p.cache_read_per_mtok or p.input_per_mtok * (self.provider.cache_read_factor or 1)
      local write_price = p.cache_write_per_mtok or p.input_per_mtok * (self.provider.cache_write_factor or 1)
      usd = usd + ((t.input_tokens - read - written) * p.input_per_mtok + read * read_price
        + written * write_price + t.output_tokens * p.output_per_mtok) / 1e6
    end
  end
  return usd
end

local function copy(t)
  local c = { input_tokens = t.input_tokens, output_tokens = t.output_tokens, calls = t.calls }
  for _, k in ipairs(M.COUNTS) do
    c[k] = t[k]
  end
  return c
end

-- { input_tokens, output_tokens, calls, by_model = { [model] = {...} } }
-- (the cache counts where there were any), a copy.
function Totals:copy()
  local out = copy(self.all)
  out.by_model = {}
  for model, t in pairs(self.by_model) do
    out.by_model[model] = copy(t)
  end
  return out
end

return M
