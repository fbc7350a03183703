-- rlm.llm.anthropic: a client for Anthropic's Messages API (POST
-- /v1/messages), native: the system prompt in its own field, replies as
-- content blocks, usage with the prompt cache's counts, and prompt caching
-- of the system prompt and the conversation so far on root calls. What the
-- API's requests and replies look like is here; the rest is
-- rlm.llm.client's. See docs/llm.md.
local cjson = require("cjson.safe")
local checks = require("rlm.base.checks")
local client = require("rlm.llm.client")
local config = require("rlm.llm.config")

local M = {}

M.name = "rlm.llm.anthropic"

-- USD per million tokens at the standard rate, from Anthropic's pricing
-- page (https://www.anthropic.com/pricing#api) as listed in 2025: input,
-- output, a cache read (0.1x input) and a cache write of 5 minutes (1.25x
-- input). Prices change: check them, and pass cfg.prices for yours.
M.PRICES_AS_OF = "2025"
local function row(input, output)
  return { input_per_mtok = input, output_per_mtok = output, cache_read_per_mtok = input * 0.1,
    cache_write_per_mtok = input * 1.25 }
end
M.prices = {
  ["claude-opus-4-1"] = row(15, 75),
  ["claude-opus-4-0"] = row(15, 75),
  ["claude-sonnet-4-5"] = row(3, 15),
  ["claude-sonnet-4-0"] = row(3, 15),
  ["claude-3-7-sonnet-latest"] = row(3, 15),
  ["claude-haiku-4-5"] = row(1, 5),
  ["claude-3-5-haiku-latest"] = row(0.80, 4),
}
-- A price row of cfg.prices without the cache's prices: Anthropic's ratios.
M.cache_read_factor, M.cache_write_factor = 0.1, 1.25

M.VERSION = "2023-06-01"

M.schema = config.schema({
  base_url = config.provider("anthropic").base_url,
  temperature = { 0, 1 },
  -- The API requires max_tokens; 8192 is within every current model's limit.
  max_tokens = 8192,
  options = {
    prompt_cache = { checks.boolean, true },
    anthropic_version = { checks.non_empty_string, M.VERSION },
  },
})
M.names = checks.names(M.schema)
M.options = M.names

function M.url(base)
  return base .. "/v1/messages"
end

function M.headers(key, o)
  return { ["x-api-key"] = key, ["anthropic-version"] = o.anthropic_version }
end

local EPHEMERAL = { type = "ephemeral" }

-- The conversation as the API takes it: system messages into `system`, the
-- others as user and assistant turns of text blocks (two in a row of one
-- role become one turn, as the API would make them). On a root call, the
-- last system block and the last block of the conversation carry
-- cache_control: the next turn's request starts with this one whole, so it
-- reads back what this one wrote (the API looks for an earlier breakpoint
-- up to 20 blocks back; a turn adds two).
function M.body(model, messages, o, call)
  local system, turns = {}, {}
  for _, m in ipairs(messages) do
    local text = tostring(m.content)
    if text == "" then
      text = "(empty)" -- the API refuses an empty text block
    end
    local block = { type = "text", text = text }
    if m.role == "system" then
      system[#system + 1] = block
    else
      local role = m.role == "assistant" and "assistant" or "user"
      local last = turns[#turns]
      if last and last.role == role then
        last.content[#last.content + 1] = block
      else
        turns[#turns + 1] = { role = role, content = { block } }
      end
    end
  end
  if call.root and o.prompt_cache then
    if system[1] then
      system[#system].cache_control = EPHEMERAL
    end
    local last = turns[#turns]
    if last then
      last.content[#last.content].cache_control = EPHEMERAL
    end
  end
  return {
    model = model,
    max_tokens = o.max_tokens,
    system = system[1] and system or nil,
    messages = turns,
    temperature = o.temperature,
    stream = call.stream,
  }
end

-- usage: input_tokens (what was neither read from nor written to the
-- cache), cache_creation_input_tokens, cache_read_input_tokens,
-- output_tokens. input_tokens here is all three inputs.
local function usage_of(u)
  if type(u) ~= "table" or type(u.input_tokens) ~= "number" or type(u.output_tokens) ~= "number" then
    return nil
  end
  local written = type(u.cache_creation_input_tokens) == "number" and u.cache_creation_input_tokens or 0
  local read = type(u.cache_read_input_tokens) == "number" and u.cache_read_input_tokens or 0
  local usage = { input_tokens = u.input_tokens + written + read, output_tokens = u.output_tokens }
  if written > 0 then
    usage.cache_creation_input_tokens = written
  end
  if read > 0 then
    usage.cache_read_input_tokens = read
  end
  return usage
end

local function no_text(stop_reason)
  if stop_reason == "refusal" then
    return "has no text: the model refused (stop_reason \"refusal\")"
  end
  return ("has no text: no text block in content (stop_reason %s)"):format(
    type(stop_reason) == "string" and ("%q"):format(stop_reason) or "none")
end

function M.reply(reply, body)
  if type(reply.content) ~= "table" then
    return nil, "has no content: " .. client.excerpt(body)
  end
  local parts = {}
  for _, b in ipairs(reply.content) do
    if type(b) == "table" and b.type == "text" and type(b.text) == "string" then
      parts[#parts + 1] = b.text
    end
  end
  if not parts[1] then
    return nil, no_text(reply.stop_reason)
  end
  return table.concat(parts), usage_of(reply.usage)
end

-- An error body: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}.
function M.error_detail(reply)
  local e = reply.error
  if type(e) == "table" and type(e.message) == "string" then
    return type(e.type) == "string" and (e.type .. ": " .. e.message) or e.message
  end
end

-- The stream: message_start (the usage of the input), content_block_delta
-- (text_delta pieces), message_delta (the output's usage so far),
-- message_stop; ping and the block starts and stops say nothing here; an
-- error event ends it.
function M.stream_event(state, _, data)
  local ev = cjson.decode(data)
  if type(ev) ~= "table" then
    return nil, "a stream event that is not JSON: " .. client.excerpt(data)
  end
  local t = ev.type
  if t == "content_block_delta" then
    local d = ev.delta
    if type(d) == "table" and d.type == "text_delta" and type(d.text) == "string" then
      state.texts = true
      return d.text
    end
  elseif t == "message_start" then
    state.start = type(ev.message) == "table" and ev.message.usage or nil
  elseif t == "message_delta" then
    if type(ev.usage) == "table" then
      state.last = ev.usage
    end
    if type(ev.delta) == "table" then
      state.stop_reason = ev.delta.stop_reason
    end
  elseif t == "message_stop" then
    if not state.texts and state.stop_reason == "refusal" then
      return nil, "the reply " .. no_text(state.stop_reason)
    end
    local u = {}
    for _, from in ipairs({ state.start or {}, state.last or {} }) do
      for k, v in pairs(from) do
        if type(v) == "number" then
          u[k] = math.max(u[k] or 0, v) -- message_delta's counts are the totals so far
        end
      end
    end
    state.usage = usage_of(u)
    state.done = true
  elseif t == "error" then
    return nil, "the stream ended with an error: " .. (M.error_detail(ev) or client.excerpt(data))
  end
  return nil
end

function M.new(cfg)
  local c = client.new(M, cfg)
  return c
end

return M
