-- rlm.llm.openai: a client for OpenAI-compatible chat-completions endpoints
-- (OpenAI, vLLM, llama.cpp, Ollama, OpenRouter...). new(cfg) returns
-- callbacks that go straight into rlm.Session.new: root_llm, llm_query,
-- llm_query_batch and cost_usd, plus usage(). What the API's requests and
-- replies look like is here; the rest is rlm.llm.client's. See docs/llm.md.
local cjson = require("cjson.safe")
local checks = require("rlm.base.checks")
local client = require("rlm.llm.client")
local config = require("rlm.llm.config")

local M = {}

M.name = "rlm.llm.openai"

-- USD per million tokens, input and output, at the standard (not batch)
-- rate, and cached input where OpenAI lists it, from OpenAI's pricing page
-- (https://openai.com/api/pricing) as listed in 2025. Prices change: check
-- them, and override or extend them with cfg.prices. A model missing here
-- has no cost, and cost_usd() raises once tokens were counted for it.
M.PRICES_AS_OF = "2025"
M.prices = {
  ["gpt-5"] = { input_per_mtok = 1.25, output_per_mtok = 10.00, cache_read_per_mtok = 0.125 },
  ["gpt-5-mini"] = { input_per_mtok = 0.25, output_per_mtok = 2.00, cache_read_per_mtok = 0.025 },
  ["gpt-5-nano"] = { input_per_mtok = 0.05, output_per_mtok = 0.40, cache_read_per_mtok = 0.005 },
  ["gpt-4.1"] = { input_per_mtok = 2.00, output_per_mtok = 8.00, cache_read_per_mtok = 0.50 },
  ["gpt-4.1-mini"] = { input_per_mtok = 0.40, output_per_mtok = 1.60, cache_read_per_mtok = 0.10 },
  ["gpt-4.1-nano"] = { input_per_mtok = 0.10, output_per_mtok = 0.40, cache_read_per_mtok = 0.025 },
  ["gpt-4o"] = { input_per_mtok = 2.50, output_per_mtok = 10.00, cache_read_per_mtok = 1.25 },
  ["gpt-4o-mini"] = { input_per_mtok = 0.15, output_per_mtok = 0.60, cache_read_per_mtok = 0.075 },
}

M.schema = config.schema({})
M.names = checks.names(M.schema)
M.options = M.names

function M.url(base)
  return base .. "/chat/completions"
end

function M.headers(key)
  return key and { authorization = "Bearer " .. key } or {}
end

function M.body(model, messages, o, call)
  return {
    model = model,
    messages = messages,
    stream = call.stream,
    stream_options = call.stream and { include_usage = true } or nil,
    temperature = o.temperature,
    max_tokens = o.max_tokens,
  }
end

-- usage: prompt_tokens (cached ones among them, in
-- prompt_tokens_details.cached_tokens) and completion_tokens; some servers
-- say input_tokens and output_tokens.
local function usage_of(u)
  if type(u) ~= "table" then
    return nil
  end
  local input = u.prompt_tokens or u.input_tokens
  local output = u.completion_tokens or u.output_tokens
  if type(input) ~= "number" or type(output) ~= "number" then
    return nil
  end
  local usage = { input_tokens = input, output_tokens = output }
  local details = u.prompt_tokens_details
  local cached = type(details) == "table" and details.cached_tokens
  if type(cached) == "number" and cached > 0 and cached <= input then
    usage.cache_read_input_tokens = cached
  end
  return usage
end

local function null_or_type(v)
  return v == nil and "nil" or (v == cjson.null and "null" or type(v))
end

function M.reply(reply, body)
  local choice = type(reply.choices) == "table" and reply.choices[1]
  if type(choice) ~= "table" then
    return nil, "has no choices: " .. client.excerpt(body)
  end
  local message = type(choice.message) == "table" and choice.message or {}
  local text = message.content
  local reasoning = message.reasoning_content or message.reasoning
  if (text == nil or text == cjson.null) and type(reasoning) == "string" then
    -- A reasoning model that spent its tokens thinking: an empty reply,
    -- which the engine tells the model of (never its reasoning, read).
    text = ""
  end
  if type(text) ~= "string" then
    return nil, "has no text: " .. (type(message.refusal) == "string" and ("the model refused: " .. message.refusal)
      or ("choices[1].message.content is " .. null_or_type(text)))
  end
  return text, usage_of(reply.usage)
end

function M.error_detail(reply)
  local e = reply.error
  if type(e) == "table" and type(e.message) == "string" then
    return e.message
  elseif type(e) == "string" then
    return e
  end
end

-- The stream: `data:` chunks of choices[1].delta.content, a last chunk
-- with the usage (stream_options.include_usage) and no choices, then
-- "data: [DONE]". An error comes as a chunk with "error".
function M.stream_event(state, _, data)
  if data == "[DONE]" then
    state.done = true
    return nil
  end
  local chunk = cjson.decode(data)
  if type(chunk) ~= "table" then
    return nil, "a stream event that is not JSON: " .. client.excerpt(data)
  end
  if chunk.error ~= nil then
    return nil, "the stream ended with an error: " .. (M.error_detail(chunk) or client.excerpt(data))
  end
  state.usage = usage_of(chunk.usage) or state.usage
  local choice = type(chunk.choices) == "table" and chunk.choices[1]
  local delta = type(choice) == "table" and choice.delta
  if type(delta) == "table" then
    if type(delta.refusal) == "string" and delta.refusal ~= "" then
      return nil, "the model refused: " .. delta.refusal
    end
    if type(delta.content) == "string" then
      return delta.content
    end
  end
  return nil
end

function M.new(cfg)
  local c = client.new(M, cfg)
  return c
end

return M
