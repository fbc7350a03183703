-- rlm.llm.openai: a client for OpenAI-compatible chat-completions endpoints
-- (OpenAI, vLLM, llama.cpp, Ollama, OpenRouter...). new(cfg) returns
-- callbacks that go straight into rlm.Session.new: root_llm, llm_query and
-- cost_usd, plus usage(). See docs/llm.md.
local cjson = require("cjson.safe") -- decode returns nil, message: no pcall needed

local M = {}

-- USD per million tokens, input and output, at the standard (not cached,
-- not batch) rate, from OpenAI's pricing page (https://openai.com/api/pricing)
-- as listed in 2025. Prices change: check them, and override or extend them
-- with cfg.prices. A model missing here has no cost, and cost_usd() raises
-- once tokens were counted for it.
M.PRICES_AS_OF = "2025"
M.prices = {
  ["gpt-5"] = { input_per_mtok = 1.25, output_per_mtok = 10.00 },
  ["gpt-5-mini"] = { input_per_mtok = 0.25, output_per_mtok = 2.00 },
  ["gpt-5-nano"] = { input_per_mtok = 0.05, output_per_mtok = 0.40 },
  ["gpt-4.1"] = { input_per_mtok = 2.00, output_per_mtok = 8.00 },
  ["gpt-4.1-mini"] = { input_per_mtok = 0.40, output_per_mtok = 1.60 },
  ["gpt-4.1-nano"] = { input_per_mtok = 0.10, output_per_mtok = 0.40 },
  ["gpt-4o"] = { input_per_mtok = 2.50, output_per_mtok = 10.00 },
  ["gpt-4o-mini"] = { input_per_mtok = 0.15, output_per_mtok = 0.60 },
}

-- At most this much of a reply body goes into an error message.
local EXCERPT_CHARS = 300

local NAME = "rlm.llm.openai"

local config = require("rlm.llm.openai_config")
local callable = require("rlm.base.checks").callable

M.options = config.names

local function excerpt(s)
  s = tostring(s)
  if #s > EXCERPT_CHARS then
    return s:sub(1, EXCERPT_CHARS) .. "..."
  end
  return s
end

-- The waiting time a 429 or 503 asks for, in ms, or nil: OpenAI's
-- retry-after-ms, else Retry-After in seconds (an HTTP date is ignored).
local function retry_after_ms(headers)
  local ms = tonumber(headers["retry-after-ms"] or "")
  if ms and ms >= 0 then
    return ms
  end
  local s = tonumber(headers["retry-after"] or "")
  if s and s >= 0 then
    return s * 1000
  end
  return nil
end

local function lower_keys(t)
  local out = {}
  if type(t) == "table" then
    for k, v in pairs(t) do
      if type(k) == "string" then
        out[k:lower()] = v
      end
    end
  end
  return out
end

-- Calls the transport and returns status, body, headers, or nil, message.
-- A blocking transport (or one that yields inside, e.g. a cosocket) returns
-- them; an asynchronous one returns nothing and calls done later, and we
-- yield until it has: the host resumes the coroutine running the session.
-- Never under pcall, so that a yield crosses no C boundary on Lua 5.1.
local function call_transport(transport, request)
  local got
  local function done(...)
    got = { n = select("#", ...), ... }
  end
  local status, body, headers = transport(request, done)
  if not got and (status ~= nil or body ~= nil) then
    return status, body, headers
  end
  if not got then
    local co, main = coroutine.running()
    if not co or main then
      error(NAME .. ": the transport returned nothing and has not called done; "
        .. "an asynchronous transport needs the session to run inside a coroutine", 0)
    end
    repeat
      coroutine.yield()
    until got
  end
  return got[1], got[2], got[3]
end

function M.new(cfg)
  local o = config.check(cfg)
  o.sub_model = o.sub_model or o.model
  local url = o.base_url:gsub("/+$", "") .. "/chat/completions"

  local prices = {}
  for model, p in pairs(M.prices) do
    prices[model] = p
  end
  for model, p in pairs(o.prices or {}) do
    prices[model] = { input_per_mtok = p.input_per_mtok, output_per_mtok = p.output_per_mtok }
  end

  -- The key lives in this upvalue only: never in the returned table, a
  -- message or an error.
  local key = o.api_key_env and os.getenv(o.api_key_env) or nil
  if key == "" then
    key = nil
  end
  local function scrub(s)
    s = tostring(s)
    if key then
      local from = 1
      while true do
        local i, j = s:find(key, from, true)
        if not i then
          break
        end
        s = s:sub(1, i - 1) .. "[the API key]" .. s:sub(j + 1)
        from = i + #"[the API key]"
      end
    end
    return s
  end
  local function fail(message)
    error(NAME .. ": " .. scrub(message), 0)
  end

  local transport = o.transport
  if not transport then
    local ok, luasocket = pcall(require, "rlm.llm.transport.luasocket")
    if not ok then
      error(NAME .. ".new: no transport: install LuaSocket (the rock rlm-tools, or apt-get install lua-socket lua-sec) "
        .. "or pass option 'transport' (" .. tostring(luasocket):match("^[^\n]*") .. ")", 2)
    end
    transport = luasocket.new()
  end
  local sleep = o.sleep
  if not sleep and o.retries > 0 then
    local ok, socket = pcall(require, "socket")
    if not (ok and type(socket) == "table" and socket.sleep) then
      error(NAME .. ".new: retries need a sleep: install LuaSocket (apt-get install lua-socket), "
        .. "pass option 'sleep' (function(seconds)), or set 'retries' to 0", 2)
    end
    sleep = socket.sleep
  end

  local headers = { ["content-type"] = "application/json", accept = "application/json" }
  for k, v in pairs(o.headers or {}) do
    headers[k:lower()] = v
  end
  if key then
    headers.authorization = "Bearer " .. key
  end

  local totals = { input_tokens = 0, output_tokens = 0, calls = 0, by_model = {} }

  local function count(model, usage)
    local t = totals.by_model[model]
    if not t then
      t = { input_tokens = 0, output_tokens = 0, calls = 0 }
      totals.by_model[model] = t
    end
    t.calls = t.calls + 1
    totals.calls = totals.calls + 1
    if usage then
      t.input_tokens = t.input_tokens + usage.input_tokens
      t.output_tokens = t.output_tokens + usage.output_tokens
      totals.input_tokens = totals.input_tokens + usage.input_tokens
      totals.output_tokens = totals.output_tokens + usage.output_tokens
    end
  end

  local function http_error(status, body)
    local reply = cjson.decode(body)
    local detail = type(reply) == "table" and type(reply.error) == "table"
      and type(reply.error.message) == "string" and reply.error.message or excerpt(body)
    local hint = ""
    if status == 401 or status == 403 then
      hint = o.api_key_env and (key and " (the key from $" .. o.api_key_env .. " was refused)"
        or " (no key was sent: $" .. o.api_key_env .. " is not set)")
        or " (no key was sent: set option api_key_env)"
    end
    return ("POST %s: HTTP %d%s: %s"):format(url, status, hint, detail)
  end

  -- The reply's text and usage, or a raise that says what is wrong with it.
  local function parse(model, body)
    local reply, err = cjson.decode(body)
    if type(reply) ~= "table" then
      fail(("the reply from %s is not a JSON object (%s): %s"):format(url, tostring(err or type(reply)),
        excerpt(body)))
    end
    local choice = type(reply.choices) == "table" and reply.choices[1]
    if type(choice) ~= "table" then
      fail(("the reply from %s has no choices: %s"):format(url, excerpt(body)))
    end
    local message = type(choice.message) == "table" and choice.message or {}
    local text = message.content
    if type(text) ~= "string" then
      local why = type(message.refusal) == "string" and ("the model refused: " .. message.refusal)
        or ("choices[1].message.content is " .. (text == cjson.null and "null" or type(text)))
      fail(("the reply from %s has no text: %s"):format(url, why))
    end
    local u, usage = reply.usage, nil
    if type(u) == "table" then
      local input = u.prompt_tokens or u.input_tokens
      local output = u.completion_tokens or u.output_tokens
      if type(input) == "number" and type(output) == "number" and input >= 0 and output >= 0 then
        usage = { input_tokens = input, output_tokens = output }
      end
    end
    count(model, usage)
    if usage then
      return text, usage
    end
    return text
  end

  local function chat(model, messages)
    local request_body = {
      model = model,
      messages = messages,
      stream = false,
      temperature = o.temperature,
      max_tokens = o.max_tokens,
    }
    local body, err = cjson.encode(request_body)
    if not body then
      fail("the request cannot be sent as JSON: " .. tostring(err))
    end
    local attempt = 0
    while true do
      local request = { url = url, method = "POST", headers = {}, body = body, timeout_ms = o.timeout_ms }
      for k, v in pairs(headers) do
        request.headers[k] = v
      end
      local status, reply, reply_headers = call_transport(transport, request)
      local problem, wait_ms
      if status == nil then
        problem = ("POST %s failed: %s"):format(url, tostring(reply))
        -- A timeout has spent its time already; refused or reset may pass.
        if tostring(reply):find("timeout", 1, true) then
          fail(problem .. (" (timeout_ms is %.0f)"):format(o.timeout_ms))
        end
      elseif type(status) ~= "number" then
        fail("the transport returned a " .. type(status) .. " status, not a number")
      elseif status >= 200 and status < 300 then
        return parse(model, type(reply) == "string" and reply or "")
      elseif status == 429 or status >= 500 then
        problem = http_error(status, tostring(reply or ""))
        wait_ms = retry_after_ms(lower_keys(reply_headers))
      else
        fail(http_error(status, tostring(reply or "")))
      end
      if attempt >= o.retries then
        fail(problem .. (attempt > 0 and (" (after %d retries)"):format(attempt) or ""))
      end
      wait_ms = math.min(wait_ms or o.retry_base_ms * 2 ^ attempt, o.retry_max_ms)
      attempt = attempt + 1
      sleep(wait_ms / 1000)
    end
  end

  -- The model for a call at `depth` (info.depth from rlm; 0 without it).
  -- Only a function sees llm_query's model= hint: the code in the sandbox
  -- does not choose what is paid for unless the host says so.
  local function pick(choice, info, what)
    local depth = type(info) == "table" and type(info.depth) == "number" and info.depth or 0
    if type(choice) == "string" then
      return choice
    elseif type(choice) == "table" and not callable(choice) then
      return choice[math.min(depth + 1, #choice)]
    end
    local name = choice(depth, type(info) == "table" and info.model or nil)
    if type(name) ~= "string" or name == "" then
      fail(("option '%s' (a function) returned %s for depth %d, not a model name"):format(what,
        type(name) == "string" and "an empty string" or type(name), depth))
    end
    return name
  end

  local client = {}

  -- root_llm(messages[, info]) and llm_query(prompt[, info]): info is what
  -- rlm passes, { depth =, model = }.
  function client.root_llm(messages, info)
    return chat(pick(o.model, info, "model"), messages)
  end

  function client.llm_query(prompt, info)
    return chat(pick(o.sub_model, info, "sub_model"), { { role = "user", content = prompt } })
  end

  -- The USD spent so far, from the usage the replies reported.
  function client.cost_usd()
    local usd = 0
    for model, t in pairs(totals.by_model) do
      if t.input_tokens + t.output_tokens > 0 then
        local p = prices[model]
        if not p then
          error(("%s: no price for model '%s': add it to option prices "
            .. "({ input_per_mtok = n, output_per_mtok = n })"):format(NAME, model), 0)
        end
        usd = usd + (t.input_tokens * p.input_per_mtok + t.output_tokens * p.output_per_mtok) / 1e6
      end
    end
    return usd
  end

  -- Totals so far: { input_tokens, output_tokens, calls, by_model = {
  -- [model] = { input_tokens, output_tokens, calls } } }, a copy.
  function client.usage()
    local copy = { input_tokens = totals.input_tokens, output_tokens = totals.output_tokens,
      calls = totals.calls, by_model = {} }
    for model, t in pairs(totals.by_model) do
      copy.by_model[model] = { input_tokens = t.input_tokens, output_tokens = t.output_tokens, calls = t.calls }
    end
    return copy
  end

  -- Whether cost_usd() can price model: a price is known for it.
  function client.has_price(model)
    return prices[model] ~= nil
  end

  client.model, client.sub_model = o.model, o.sub_model
  return client
end

return M
