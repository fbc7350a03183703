-- rlm.llm.client: the one core under every model provider. A provider
-- (rlm.llm.openai, rlm.llm.anthropic, rlm.llm.gemini) says how its API's
-- requests and replies look; this does the rest, the same for all: the
-- transport call, retries (full jitter, Retry-After), the key (from an
-- environment variable, scrubbed from every error), usage and cost, the
-- model for each depth, streaming, and batches side by side. See
-- docs/llm.md ("The client core").
local cjson = require("cjson.safe") -- decode returns nil, message: no pcall needed
local checks = require("rlm.base.checks")
local config = require("rlm.llm.config")
local retry = require("rlm.llm.retry")
local stream = require("rlm.llm.stream")
local usages = require("rlm.llm.usage")

local callable = checks.callable

local M = {}

-- At most this much of a reply body goes into an error message.
M.EXCERPT_CHARS = 300

-- s cut to EXCERPT_CHARS, on one line.
function M.excerpt(s)
  s = tostring(s):gsub("[ \t\r]*\n%s*", " ")
  if #s > M.EXCERPT_CHARS then
    return s:sub(1, M.EXCERPT_CHARS) .. "..."
  end
  return s
end
local excerpt = M.excerpt

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

-- A uniform draw in [0, 1) for the jitter, from a generator of our own
-- (Park and Miller's), seeded from the clocks and an address: math.random
-- is the host's (and unseeded on Lua 5.1 and LuaJIT, so that two processes
-- would wait alike).
local function new_random()
  local seed = (os.time() * 1000 + math.floor(os.clock() * 1e6)) % 2147483646
  seed = (seed + (tonumber(tostring({}):match("0x(%x+)") or "0", 16) or 0)) % 2147483646 + 1
  return function()
    seed = seed * 16807 % 2147483647
    return (seed - 1) / 2147483646
  end
end

-- Calls the transport and returns status, body, headers, or nil, message.
-- A blocking transport (or one that yields inside, e.g. a cosocket) returns
-- them; an asynchronous one returns nothing and calls done later, and we
-- yield until it has: the host resumes the coroutine running the session.
-- Never under pcall, so that a yield crosses no C boundary on Lua 5.1.
local function call_transport(name, transport, request)
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
      error(name .. ": the transport returned nothing and has not called done; "
        .. "an asynchronous transport needs the session to run inside a coroutine", 0)
    end
    repeat
      coroutine.yield()
    until got
  end
  return got[1], got[2], got[3]
end

-- provider: the module of an API, with
--   name            "rlm.llm.openai": the prefix of its errors
--   schema, names   its options (rlm.llm.config.schema) and their names
--   prices          { [model] = { input_per_mtok =, output_per_mtok =, ... } }
--   cache_read_factor, cache_write_factor
--                   what cached input costs against input, when a price
--                   row does not say (default 1)
--   url(base, model, stream) -> the URL of a call
--   headers(key, o) -> its own headers (the key's among them)
--   body(model, messages, o, call) -> the request, a table for JSON;
--                   call = { stream = bool, root = bool }
--   reply(decoded, body) -> text, usage | nil, why ("has no ...": the rest of
--                   "the reply from URL ...")
--   error_detail(decoded) -> the message in an error body, or nil
--   stream_event(state, name, data) -> text | nil, nil | nil, error: one
--                   event of a stream; sets state.done at its end and
--                   state.usage once known
-- usage, as providers give it: { input_tokens = all input, output_tokens =,
-- cache_read_input_tokens =, cache_creation_input_tokens = } (the two
-- cache counts part of input_tokens, and present only when non-zero).
function M.new(provider, cfg)
  local name = provider.name
  local o = config.check(name .. ".new", cfg, provider.schema, provider.names)
  o.sub_model = o.sub_model or o.model
  local base = o.base_url:gsub("/+$", "")

  local prices = {}
  for model, p in pairs(provider.prices or {}) do
    prices[model] = p
  end
  for model, p in pairs(o.prices or {}) do
    prices[model] = p
  end

  -- The key lives in upvalues only: never in the returned table, a message
  -- or an error.
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
    error(name .. ": " .. scrub(message), 0)
  end

  -- The transport, and what runs a batch side by side and sleeps between
  -- retries without stopping the others: LuaSocket's scheduler, for its
  -- own transports, unless given.
  local transport, gather, sleep = o.transport, o.gather, o.sleep
  local luasocket = package.loaded["rlm.llm.transport.luasocket"]
  if not transport then
    local ok, mod = pcall(require, "rlm.llm.transport.luasocket")
    if not ok then
      error(name .. ".new: no transport: install LuaSocket (the rock rlm-tools, or apt-get install lua-socket lua-sec) "
        .. "or pass option 'transport' (" .. tostring(mod):match("^[^\n]*") .. ")", 3)
    end
    luasocket, transport = mod, mod.new()
  end
  if luasocket and luasocket.made(transport) then
    gather = gather or luasocket.gather
    sleep = sleep or luasocket.sleep
  end
  if not sleep and o.retries > 0 then
    local ok, socket = pcall(require, "socket")
    if not (ok and type(socket) == "table" and socket.sleep) then
      error(name .. ".new: retries need a sleep: install LuaSocket (apt-get install lua-socket), "
        .. "pass option 'sleep' (function(seconds)), or set 'retries' to 0", 3)
    end
    sleep = socket.sleep
  end
  local random = o.random or new_random()

  local headers = { ["content-type"] = "application/json", accept = "application/json" }
  for k, v in pairs(provider.headers(key, o)) do
    headers[k] = v
  end
  for k, v in pairs(o.headers or {}) do
    headers[k:lower()] = v
  end

  local totals = usages.totals(name, provider, prices)

  local function http_error(url, status, body)
    local reply = cjson.decode(body)
    local detail = type(reply) == "table" and provider.error_detail(reply)
    detail = type(detail) == "string" and excerpt(detail) or excerpt(body)
    local hint = ""
    if status == 401 or status == 403 then
      hint = o.api_key_env and (key and " (the key from $" .. o.api_key_env .. " was refused)"
        or " (no key was sent: $" .. o.api_key_env .. " is not set)")
        or " (no key was sent: set option api_key_env)"
    end
    return ("POST %s: HTTP %d%s: %s"):format(url, status, hint, detail)
  end

  local function result(model, text, counts)
    counts = usages.checked(counts)
    totals:count(model, counts)
    if counts then
      return text, counts
    end
    return text
  end

  -- The reply's text and usage, or a raise that says what is wrong with it.
  local function parse(url, model, body)
    local reply, err = cjson.decode(body)
    if type(reply) ~= "table" then
      fail(("the reply from %s is not a JSON object (%s): %s"):format(url, tostring(err or type(reply)),
        excerpt(body)))
    end
    local text, usage = provider.reply(reply, body)
    if type(text) ~= "string" then
      fail(("the reply from %s %s"):format(url, tostring(usage)))
    end
    return result(model, text, usage)
  end

  -- One call: the request, its retries, its reply. delta (a root call's
  -- info.delta), when streaming, gets the text as it comes.
  local function call(model, messages, root, delta)
    local streaming = o.stream and root
    local url = provider.url(base, model, streaming)
    local body, err = cjson.encode(provider.body(model, messages, o, { stream = streaming, root = root }))
    if not body then
      fail("the request cannot be sent as JSON: " .. tostring(err))
    end
    local attempt = 0
    while true do
      local request = { url = url, method = "POST", headers = {}, body = body, timeout_ms = o.timeout_ms }
      for k, v in pairs(headers) do
        request.headers[k] = v
      end
      local reader
      if streaming then
        reader = stream.reader(provider, delta)
        request.on_chunk = reader.feed
      end
      local status, reply, reply_headers = call_transport(name, transport, request)
      local problem, asked
      if reader and reader.abort then
        fail(("POST %s: %s"):format(url, reader.abort))
      end
      if status == nil then
        problem = ("POST %s failed: %s"):format(url, tostring(reader and reader.stream_error or reply))
        -- A timeout has spent its time already; refused or reset may pass.
        if tostring(reply):find("timeout", 1, true) then
          fail(problem .. (" (timeout_ms is %.0f)"):format(o.timeout_ms))
        end
      elseif type(status) ~= "number" then
        fail("the transport returned a " .. type(status) .. " status, not a number")
      elseif status >= 200 and status < 300 then
        if not reader then
          return parse(url, model, type(reply) == "string" and reply or "")
        end
        local text, usage, whole = reader.finish(reply)
        if text then
          return result(model, text, usage)
        elseif whole then
          return parse(url, model, whole)
        end
        problem = ("POST %s: %s"):format(url, tostring(usage))
      else
        local lower = lower_keys(reply_headers)
        problem = http_error(url, status, tostring(reply or ""))
        if not retry.should_retry(status, lower) then
          fail(problem)
        end
        asked = retry.asked_ms(lower)
      end
      if reader and reader.sent > 0 then
        -- Its text went out as it came: asking again would show it twice.
        fail(problem .. (" (after %d bytes of text had come)"):format(reader.sent))
      end
      if attempt >= o.retries then
        fail(problem .. (attempt > 0 and (" (after %d retries)"):format(attempt) or ""))
      end
      sleep(retry.wait_ms(attempt, asked, o, random) / 1000)
      attempt = attempt + 1
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
    local chosen = choice(depth, type(info) == "table" and info.model or nil)
    if type(chosen) ~= "string" or chosen == "" then
      fail(("option '%s' (a function) returned %s for depth %d, not a model name"):format(what,
        type(chosen) == "string" and "an empty string" or type(chosen), depth))
    end
    return chosen
  end

  local client = {}

  -- root_llm(messages[, info]) and llm_query(prompt[, info]): info is what
  -- rlm passes, { depth =, model =, delta = }.
  function client.root_llm(messages, info)
    local delta = type(info) == "table" and info.delta or nil
    return call(pick(o.model, info, "model"), messages, true, delta)
  end

  function client.llm_query(prompt, info)
    return call(pick(o.sub_model, info, "sub_model"), { { role = "user", content = prompt } }, false)
  end

  -- llm_query_batch(prompts[, info]): the prompts side by side, where the
  -- transport can (gather); each slot { text =, usage = } or { error = }.
  if gather then
    function client.llm_query_batch(prompts, info)
      local answers, tasks = {}, {}
      for i, prompt in ipairs(prompts) do
        tasks[i] = function()
          local text, usage = client.llm_query(prompt, info)
          answers[i] = { text = text, usage = usage }
        end
      end
      local failed = gather(tasks) or {}
      for i = 1, #prompts do
        if not answers[i] then
          answers[i] = { error = scrub(failed[i] or "the call did not finish") }
        end
      end
      return answers
    end
  end

  -- The USD spent so far, from the usage the replies reported.
  function client.cost_usd()
    return totals:cost_usd()
  end

  -- Totals so far: { input_tokens, output_tokens, calls, by_model = {
  -- [model] = { input_tokens, output_tokens, calls } } } (and the cache
  -- counts where there were any), a copy.
  function client.usage()
    return totals:copy()
  end

  -- Whether cost_usd() can price model: a price is known for it.
  function client.has_price(model)
    return prices[model] ~= nil
  end

  client.model, client.sub_model = o.model, o.sub_model
  return client
end

return M
