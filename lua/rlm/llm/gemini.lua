-- rlm.llm.gemini: a client for Google's Gemini API, native: POST
-- /v1beta/models/{model}:generateContent (and :streamGenerateContent?alt=sse),
-- the key in x-goog-api-key, the system prompt as systemInstruction, turns as
-- contents of roles user and model. What the API's requests and replies
-- look like is here; the rest is rlm.llm.client's. See docs/llm.md.
local cjson = require("cjson.safe")
local checks = require("rlm.base.checks")
local client = require("rlm.llm.client")
local config = require("rlm.llm.config")

local M = {}

M.name = "rlm.llm.gemini"

-- USD per million tokens on the paid tier, from Google's pricing page
-- (https://ai.google.dev/gemini-api/docs/pricing) as listed in 2025: text
-- input and output (thinking tokens are billed as output). gemini-2.5-pro
-- is priced at its rate for prompts of up to 200k tokens (longer ones cost
-- twice the input and 1.5 times the output). Cached input is priced as
-- input unless a row says cache_read_per_mtok. Prices change: check them,
-- and pass cfg.prices for yours.
M.PRICES_AS_OF = "2025"
M.prices = {
  ["gemini-2.5-pro"] = { input_per_mtok = 1.25, output_per_mtok = 10.00 },
  ["gemini-2.5-flash"] = { input_per_mtok = 0.30, output_per_mtok = 2.50 },
  ["gemini-2.5-flash-lite"] = { input_per_mtok = 0.10, output_per_mtok = 0.40 },
  ["gemini-2.0-flash"] = { input_per_mtok = 0.10, output_per_mtok = 0.40 },
  ["gemini-2.0-flash-lite"] = { input_per_mtok = 0.075, output_per_mtok = 0.30 },
}

M.schema = config.schema({
  base_url = config.provider("gemini").base_url,
  temperature = { 0, 2 },
})
M.names = checks.names(M.schema)
M.options = M.names

-- The model's part of the path: "models/" dropped (both forms are
-- names the API gives), anything outside the unreserved characters
-- percent-encoded.
local function model_path(model)
  model = model:gsub("^models/", "")
  return (model:gsub("[^%w%-%._~]", function(c)
    return ("%%%02X"):format(c:byte())
  end))
end

function M.url(base, model, stream)
  if stream then
    return base .. "/models/" .. model_path(model) .. ":streamGenerateContent?alt=sse"
  end
  return base .. "/models/" .. model_path(model) .. ":generateContent"
end

function M.headers(key)
  return { ["x-goog-api-key"] = key }
end

function M.body(_, messages, o)
  local system, contents = {}, {}
  for _, m in ipairs(messages) do
    local part = { text = tostring(m.content) }
    if m.role == "system" then
      system[#system + 1] = part
    else
      local role = m.role == "assistant" and "model" or "user"
      local last = contents[#contents]
      if last and last.role == role then
        last.parts[#last.parts + 1] = part
      else
        contents[#contents + 1] = { role = role, parts = { part } }
      end
    end
  end
  local generation
  if o.temperature or o.max_tokens then
    generation = { temperature = o.temperature, maxOutputTokens = o.max_tokens }
  end
  return {
    contents = contents,
    systemInstruction = system[1] and { parts = system } or nil,
    generationConfig = generation,
  }
end

-- usageMetadata: promptTokenCount (the cached ones among them in
-- cachedContentTokenCount), candidatesTokenCount and thoughtsTokenCount
-- (both billed as output; absent when zero).
local function usage_of(u)
  if type(u) ~= "table" or type(u.promptTokenCount) ~= "number" then
    return nil
  end
  local function n(v)
    return type(v) == "number" and v or 0
  end
  local usage = { input_tokens = u.promptTokenCount,
    output_tokens = n(u.candidatesTokenCount) + n(u.thoughtsTokenCount) }
  local cached = n(u.cachedContentTokenCount)
  if cached > 0 and cached <= usage.input_tokens then
    usage.cache_read_input_tokens = cached
  end
  return usage
end

-- The text of a response's first candidate (thought summaries left out),
-- its finish reason, and why it has none when the prompt was blocked.
local function text_of(reply)
  local candidate = type(reply.candidates) == "table" and reply.candidates[1]
  if type(candidate) ~= "table" then
    local feedback = type(reply.promptFeedback) == "table" and reply.promptFeedback
    if feedback and type(feedback.blockReason) == "string" then
      return nil, nil, ("the prompt was blocked (blockReason %q)"):format(feedback.blockReason)
    end
    return nil
  end
  local content = type(candidate.content) == "table" and candidate.content or {}
  local parts = {}
  for _, p in ipairs(type(content.parts) == "table" and content.parts or {}) do
    if type(p) == "table" and type(p.text) == "string" and not p.thought then
      parts[#parts + 1] = p.text
    end
  end
  local finish = type(candidate.finishReason) == "string" and candidate.finishReason or nil
  return parts[1] and table.concat(parts) or nil, finish
end

function M.reply(reply, body)
  local text, finish, blocked = text_of(reply)
  if blocked then
    return nil, "has no text: " .. blocked
  elseif not text and type(reply.candidates) ~= "table" then
    return nil, "has no candidates: " .. client.excerpt(body)
  elseif not text then
    return nil, ("has no text (finishReason %s)"):format(finish and ("%q"):format(finish) or "none")
  end
  return text, usage_of(reply.usageMetadata)
end

-- An error body: {"error":{"code":429,"message":"...","status":"RESOURCE_EXHAUSTED"}}.
function M.error_detail(reply)
  local e = reply.error
  if type(e) == "table" and type(e.message) == "string" then
    return type(e.status) == "string" and (e.status .. ": " .. e.message) or e.message
  end
end

-- The stream: each event a whole GenerateContentResponse with the next
-- piece of text; the last has the candidate's finishReason and the usage.
function M.stream_event(state, _, data)
  local ev = cjson.decode(data)
  if type(ev) ~= "table" then
    return nil, "a stream event that is not JSON: " .. client.excerpt(data)
  end
  if ev.error ~= nil then
    return nil, "the stream ended with an error: " .. (M.error_detail(ev) or client.excerpt(data))
  end
  local text, finish, blocked = text_of(ev)
  if blocked then
    return nil, "the reply has no text: " .. blocked
  end
  state.usage = usage_of(ev.usageMetadata) or state.usage
  if text then
    state.texts = true
  end
  if finish then
    if not state.texts and finish ~= "STOP" then
      return nil, ("the reply has no text (finishReason %q)"):format(finish)
    end
    state.done = true
  end
  return text
end

function M.new(cfg)
  local c = client.new(M, cfg)
  return c
end

return M
