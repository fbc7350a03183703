-- The model providers, rlm.llm.openai, rlm.llm.anthropic and rlm.llm.gemini,
-- each against the fake server on 127.0.0.1 (spec/helpers/fake_openai.py
-- answers each path in its API's shape), through the real LuaSocket
-- transport: the same behaviours, one table of rows per provider.
local H = require("helpers")
local F = require("helpers.fake_openai")
local luasocket = require("rlm.llm.transport.luasocket")
local socket = require("socket")

local SECRET_ENV = "RLM_SPEC_SECRET"
local secret = assert(os.getenv(SECRET_ENV), "spec/run sets RLM_SPEC_SECRET")

local srv

-- What differs between the providers: where the fake is, what a request
-- must look like, and what an error body of the API is.
local PROVIDERS = {
  {
    name = "openai",
    mod = require("rlm.llm.openai"),
    base = function()
      return srv.url
    end,
    path = "/v1/chat/completions",
    key_sent = function(req)
      return req.headers.authorization == "Bearer " .. secret
    end,
    error_body = function(message)
      return { error = { message = message, type = "invalid_request_error" } }
    end,
    detail = "",
    -- the request of root_llm(CONVERSATION)
    root_request = function(req)
      assert.are.equal("fake-root", req.json.model)
      assert.are.same(H.CONVERSATION_COPY, req.json.messages)
      assert.are.equal(false, req.json.stream)
    end,
    malformed = {
      { { json = { id = "x" } }, "has no choices" },
      { { json = { choices = { { message = { content = 42 } } } } }, "content is number" },
      { { body = '{"choices":[{"message":{"content":null,"refusal":"I cannot help"}}]}' },
        "the model refused: I cannot help" },
    },
  },
  {
    name = "anthropic",
    mod = require("rlm.llm.anthropic"),
    base = function()
      return (srv.url:gsub("/v1$", ""))
    end,
    path = "/v1/messages",
    key_sent = function(req)
      return req.headers["x-api-key"] == secret and req.headers.authorization == nil
    end,
    error_body = function(message)
      return { type = "error", error = { type = "invalid_request_error", message = message } }
    end,
    detail = "invalid_request_error: ",
    root_request = function(req)
      local ephemeral = { type = "ephemeral" }
      assert.are.equal("2023-06-01", req.headers["anthropic-version"])
      assert.are.same({
        model = "fake-root",
        max_tokens = 8192,
        stream = false,
        system = { { type = "text", text = "be brief", cache_control = ephemeral } },
        messages = {
          { role = "user", content = { { type = "text", text = "question?" } } },
          { role = "assistant", content = { { type = "text", text = "```repl\nprint(1)\n```" } } },
          { role = "user", content = { { type = "text", text = "1", cache_control = ephemeral } } },
        },
      }, req.json)
    end,
    malformed = {
      { { json = { id = "x" } }, "has no content" },
      { { json = { content = { { type = "thinking", thinking = "hm" } }, stop_reason = "end_turn" } },
        "has no text: no text block in content %(stop_reason \"end_turn\"%)" },
      { { json = { content = {}, stop_reason = "refusal" } }, "has no text: the model refused" },
    },
  },
  {
    name = "gemini",
    mod = require("rlm.llm.gemini"),
    base = function()
      return srv.url .. "beta"
    end,
    path = "/v1beta/models/fake-root:generateContent",
    key_sent = function(req)
      return req.headers["x-goog-api-key"] == secret and req.headers.authorization == nil
    end,
    error_body = function(message)
      return { error = { code = 400, message = message, status = "INVALID_ARGUMENT" } }
    end,
    detail = "INVALID_ARGUMENT: ",
    root_request = function(req)
      assert.are.same({
        systemInstruction = { parts = { { text = "be brief" } } },
        contents = {
          { role = "user", parts = { { text = "question?" } } },
          { role = "model", parts = { { text = "```repl\nprint(1)\n```" } } },
          { role = "user", parts = { { text = "1" } } },
        },
      }, req.json)
    end,
    malformed = {
      { { json = { usageMetadata = {} } }, "has no candidates" },
      { { json = { promptFeedback = { blockReason = "SAFETY" } } },
        "has no text: the prompt was blocked %(blockReason \"SAFETY\"%)" },
      { { json = { candidates = { { content = { parts = {} }, finishReason = "MAX_TOKENS" } } } },
        "has no text %(finishReason \"MAX_TOKENS\"%)" },
    },
  },
}

H.CONVERSATION_COPY = {
  { role = "system", content = "be brief" },
  { role = "user", content = "question?" },
  { role = "assistant", content = "```repl\nprint(1)\n```" },
  { role = "user", content = "1" },
}

local function conversation()
  local c = {}
  for i, m in ipairs(H.CONVERSATION_COPY) do
    c[i] = { role = m.role, content = m.content }
  end
  return c
end

local function user(text)
  return { { role = "user", content = text } }
end

local function raises(pattern, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.matches(pattern, tostring(err))
  return tostring(err)
end

for _, P in ipairs(PROVIDERS) do
  -- A client of P on the fake; opts override the defaults (false removes
  -- one). Retries sleep through a recorder: .sleeps lists the seconds.
  local function client(opts)
    local sleeps = {}
    local cfg = {
      base_url = P.base(),
      model = "fake-root",
      api_key_env = SECRET_ENV,
      retry_base_ms = 250,
      jitter = false,
      timeout_ms = 10000,
      sleep = function(s)
        sleeps[#sleeps + 1] = s
      end,
    }
    for k, v in pairs(opts or {}) do
      if v == false then
        cfg[k] = nil
      else
        cfg[k] = v
      end
    end
    local c = P.mod.new(cfg)
    c.sleeps = sleeps
    return c
  end

  describe("rlm.llm." .. P.name, function()
    setup(function()
      srv = F.start()
    end)

    teardown(function()
      srv:stop()
    end)

    after_each(function()
      collectgarbage()
      assert.are.same({ srv.pid }, H.settled_children(1))
    end)

    describe("a reply", function()
      it("asks in the API's shape, the key in its header", function()
        srv:script({ { content = "the answer", usage = { 12, 5 } } })
        local text, usage = client().root_llm(conversation())
        assert.are.equal("the answer", text)
        assert.are.same({ input_tokens = 12, output_tokens = 5 }, usage)
        local req = srv:requests()[1]
        assert.are.equal(P.path, req.path)
        assert.is_true(P.key_sent(req), "the key is not in its header")
        assert.is_nil(req.body:find(secret, 1, true))
        assert.are.same({}, req.argv_hits)
        P.root_request(req)
      end)

      it("gives the text only when the reply has no usage, and counts no tokens", function()
        srv:script({ { content = "no usage here" } })
        local c = client()
        assert.are.equal(1, select("#", c.root_llm(user("q"))))
        local u = c.usage()
        assert.are.equal(0, u.input_tokens + u.output_tokens)
        assert.are.equal(1, u.calls)
        assert.are.equal(0, c.cost_usd())
      end)

      it("sends llm_query to the sub-model as one user message", function()
        srv:script({ { content = "sub says hi", usage = { 3, 4 } } })
        local c = client({ sub_model = "fake-sub" })
        assert.are.equal("sub says hi", (c.llm_query("summarise this")))
        local req = srv:requests()[1]
        assert.is_truthy(req.body:find("summarise this", 1, true))
        assert.is_truthy((req.json.model or req.path):find("fake-sub", 1, true))
        assert.is_nil(req.body:find("cache_control", 1, true)) -- a sub-call writes no cache
      end)

      it("reads an error body into one line, the key scrubbed", function()
        srv:script({ { status = 400, json = P.error_body("max_tokens is too large:\n  see " .. secret) } })
        local err = raises("HTTP 400: " .. P.detail .. "max_tokens is too large: see %[the API key%]$",
          client().root_llm, user("q"))
        assert.is_nil(err:find(secret, 1, true))
        assert.are.equal(1, #srv:requests())
      end)

      it("says a 401 refused the key from the variable", function()
        srv:script({ { status = 401, json = P.error_body("invalid x-api-key") } })
        raises("HTTP 401 %(the key from %$RLM_SPEC_SECRET was refused%): " .. P.detail, client().root_llm, user("q"))
      end)

      local malformed = { { { body = "<html>Bad Gateway</html>" }, "is not a JSON object.*<html>Bad Gateway</html>" } }
      for _, row in ipairs(P.malformed) do
        malformed[#malformed + 1] = row
      end
      for _, case in ipairs(malformed) do
        it("raises for a malformed reply, never retried: " .. case[2], function()
          srv:script({ case[1] })
          local c = client()
          raises(case[2], c.root_llm, user("q"))
          assert.are.equal(1, #srv:requests())
          assert.are.same({}, c.sleeps)
        end)
      end
    end)

    describe("retries", function()
      -- one row a case: the first reply (or a function that makes it as the
      -- case starts: a date 20 s ahead, taken when the file was loaded,
      -- was 18 s ahead by its case under load), the wait it asks for (s)
      local function in_20_s()
        return { status = 503, headers = { ["Retry-After"] = os.date("!%a, %d %b %Y %H:%M:%S GMT", os.time() + 20) } }
      end
      local cases = {
        { { status = 429, headers = { ["Retry-After"] = "2" } }, 2, "Retry-After in seconds" },
        { { status = 429, headers = { ["retry-after-ms"] = "1500" } }, 1.5, "retry-after-ms" },
        { in_20_s, 20, "Retry-After as an HTTP date" },
        { { status = 500 }, 0.25, "no Retry-After: retry_base_ms" },
        { { status = 529, json = P.error_body("Overloaded") }, 0.25, "Anthropic's 529 overloaded" },
        { { hangup = true }, 0.25, "a connection closed without a reply" },
      }
      for _, case in ipairs(cases) do
        it("retry after " .. case[3], function()
          srv:script({ type(case[1]) == "function" and case[1]() or case[1], { content = "later" } })
          local c = client()
          assert.are.equal("later", (c.root_llm(user("q"))))
          assert.are.equal(2, #srv:requests())
          assert.are.equal(1, #c.sleeps)
          assert.is_true(math.abs(c.sleeps[1] - case[2]) <= 1.01, tostring(c.sleeps[1]))
        end)
      end

      it("do not retry a 400", function()
        srv:script({ { status = 400, json = P.error_body("bad") }, { content = "never asked for" } })
        raises("HTTP 400", client().root_llm, user("q"))
        assert.are.equal(1, #srv:requests())
      end)

      it("give up after retries, with the last status", function()
        srv:script({ { status = 500 }, { status = 502 }, { status = 503, json = P.error_body("down") } })
        raises("HTTP 503: " .. P.detail .. "down %(after 2 retries%)", client({ retries = 2 }).root_llm, user("q"))
        assert.are.equal(3, #srv:requests())
      end)
    end)

    describe("streaming (stream = true)", function()
      local function streamed(opts)
        return client(opts or { stream = true })
      end

      it("passes the root call's text to info.delta as it comes, and returns it whole", function()
        srv:script({ { content = "Hello, streaming world", pieces = { "Hel", "lo, stre", "aming world" },
          usage = { 20, 7 } } })
        local seen = {}
        local text, usage = streamed().root_llm(user("q"), { depth = 0, delta = function(piece)
          seen[#seen + 1] = piece
        end })
        assert.are.equal("Hello, streaming world", text)
        assert.are.same({ "Hel", "lo, stre", "aming world" }, seen)
        assert.are.same({ input_tokens = 20, output_tokens = 7 }, usage)
        local req = srv:requests()[1]
        if P.name == "gemini" then
          assert.are.equal("/v1beta/models/fake-root:streamGenerateContent?alt=sse", req.path)
        else
          assert.are.equal(true, req.json.stream)
        end
        if P.name == "openai" then
          assert.are.same({ include_usage = true }, req.json.stream_options)
        end
      end)

      it("hands each piece of a slow stream out as it comes", function()
        srv:script({ { content = "abc", pieces = { "a", "b", "c" }, event_delay_ms = 300 } })
        local t0, at = socket.gettime(), {}
        local text = streamed().root_llm(user("q"), { delta = function()
          at[#at + 1] = socket.gettime() - t0
        end })
        local total = socket.gettime() - t0
        assert.are.equal("abc", text)
        assert.are.equal(3, #at)
        assert.is_true(at[1] < total - 0.25, ("the first piece came at %.2f s of %.2f"):format(at[1], total))
        assert.is_true(at[3] - at[1] > 0.2, ("pieces at %.2f and %.2f s"):format(at[1], at[3]))
      end)

      -- one row a case: the reply, the error, how it ends. Two pieces of
      -- text come before the cut (Anthropic's stream opens with three
      -- events of no text).
      local two = P.name == "anthropic" and 5 or 2
      local cut = {
        { { content = "abcdef", pieces = { "ab", "cd", "ef" }, cut_after = two }, "closed mid%-reply", "chunked" },
        { { content = "abcdef", pieces = { "ab", "cd", "ef" }, cut_after = two, chunked = false },
          "the stream was cut before its end", "close-delimited" },
        { { content = "abcdef", pieces = { "ab", "cd", "ef" }, error_event = "Overloaded" },
          "the stream ended with an error: .*Overloaded", "an error event" },
      }
      for _, case in ipairs(cut) do
        it("raises for a stream cut mid-way (" .. case[3] .. "), and takes no partial text", function()
          srv:script({ case[1], { content = "never asked for" } })
          local seen = {}
          local c = streamed({ stream = true, retries = 2 })
          raises(case[2] .. ".*after %d+ bytes of text had come", c.root_llm, user("q"), { delta = function(p)
            seen[#seen + 1] = p
          end })
          assert.is_true(#seen >= 2)
          assert.are.equal(1, #srv:requests()) -- its text went out: not asked again
        end)
      end

      it("asks again when the stream was cut before any text", function()
        local first = P.name == "anthropic" and 1 or 0 -- Anthropic's first event says no text
        srv:script({ { content = "ab", cut_after = first }, { content = "whole", pieces = { "who", "le" } } })
        local c = streamed({ stream = true })
        assert.are.equal("whole", (c.root_llm(user("q"), { delta = function() end })))
        assert.are.equal(2, #srv:requests())
      end)

      it("stops reading when the delta says the reply is no longer wanted", function()
        srv:script({ { content = "abcdef", pieces = { "a", "b", "c", "d", "e", "f" }, event_delay_ms = 300 } })
        local events = ({ openai = 8, anthropic = 12, gemini = 6 })[P.name] -- of six pieces of text
        local t0 = socket.gettime()
        raises("no longer wants this reply", streamed().root_llm, user("q"), { delta = function()
          return false
        end })
        local secs = socket.gettime() - t0
        -- it stops at the first piece: 0.3 s in (Anthropic's: 1.2 s), of a stream of 1.8 to 3.6 s
        assert.is_true(secs < events * 0.3 - 0.9, ("%.2f s of %.2f"):format(secs, events * 0.3))
        assert.are.equal(1, #srv:requests())
      end)

      it("reads a reply that is not an event stream as a whole reply", function()
        srv:script({ { body = (P.name == "openai" and '{"choices":[{"message":{"content":"plain"}}]}')
          or (P.name == "anthropic" and '{"content":[{"type":"text","text":"plain"}]}')
          or '{"candidates":[{"content":{"parts":[{"text":"plain"}]},"finishReason":"STOP"}]}' } })
        assert.are.equal("plain", (streamed().root_llm(user("q"), { delta = function() end })))
      end)

      it("streams root calls only: llm_query asks for the whole reply", function()
        srv:script({ { content = "sub" } })
        streamed().llm_query("p")
        local req = srv:requests()[1]
        assert.is_falsy(req.json.stream)
        assert.is_nil(req.path:find("stream", 1, true))
      end)

      it("bounds an event that never ends", function()
        local sse = require("rlm.llm.sse")
        local p = sse.new(function()
          return true
        end, 1000)
        assert.is_true(p:feed("data: " .. ("x"):rep(500)))
        local ok, err = p:feed(("x"):rep(600))
        assert.is_nil(ok)
        assert.matches("longer than 1000 bytes", err)
      end)
    end)

    describe("cost_usd", function()
      it("prices the cache's tokens apart where the API reports them", function()
        srv:script({ { content = "x", usage = { 1000, 100 }, cache = { 200, 300 } } })
        local c = client({ prices = { ["fake-root"] = { input_per_mtok = 10, output_per_mtok = 20,
          cache_read_per_mtok = 1, cache_write_per_mtok = 12.5 } } })
        local _, usage = c.root_llm(user("q"))
        local want
        if P.name == "anthropic" then
          -- input_tokens counts only what was neither read nor written
          assert.are.same({ input_tokens = 1500, output_tokens = 100, cache_creation_input_tokens = 200,
            cache_read_input_tokens = 300 }, usage)
          want = (1000 * 10 + 200 * 12.5 + 300 * 1 + 100 * 20) / 1e6
        else
          assert.are.same({ input_tokens = 1000, output_tokens = 100, cache_read_input_tokens = 300 }, usage)
          want = (700 * 10 + 300 * 1 + 100 * 20) / 1e6
        end
        assert.is_true(math.abs(c.cost_usd() - want) < 1e-12, tostring(c.cost_usd()))
        assert.are.equal(300, c.usage().cache_read_input_tokens)
      end)

      it("prices a model of its built-in table", function()
        local mod = P.mod
        local model = next(mod.prices)
        srv:script({ { content = "x", usage = { 2000, 1000 } } })
        local c = client({ model = model })
        c.root_llm(user("q"))
        local p = mod.prices[model]
        local want = (2000 * p.input_per_mtok + 1000 * p.output_per_mtok) / 1e6
        assert.is_true(c.cost_usd() > 0)
        assert.is_true(math.abs(c.cost_usd() - want) < 1e-12, tostring(c.cost_usd()))
      end)
    end)

    describe("in a session with stream = true", function()
      it("emits the root model's text as root_delta events as it comes", function()
        local reply = F.fence("FINAL('42')")
        srv:script({ { content = reply, pieces = { reply:sub(1, 5), reply:sub(6, 12), reply:sub(13) },
          usage = { 10, 5 } } })
        local c = client({ stream = true })
        local deltas, responses = {}, {}
        local result, err = H.run({ root_llm = c.root_llm, llm_query = c.llm_query, on_event = function(ev)
          if ev.type == "root_delta" then
            deltas[#deltas + 1] = ev
          elseif ev.type == "root_response" then
            responses[#responses + 1] = ev
          end
        end })
        assert.is_nil(err)
        assert.are.equal("42", result.answer)
        assert.are.equal(3, #deltas)
        local text = {}
        for i, d in ipairs(deltas) do
          text[i] = d.text
          assert.are.equal(1, d.step)
          assert.are.equal(0, d.depth)
          assert.are.equal("1", d.session)
        end
        assert.are.equal(responses[1].response, table.concat(text))
        assert.are.equal(15, result.tokens.total)
      end)

      it("emits a nested session's deltas from that session", function()
        local root1 = F.fence("r = rlm_query('the sub-question', 'some context')")
        local child = F.fence("FINAL('from the child')")
        local root2 = F.fence("FINAL(r)")
        srv:script({ { content = root1 }, { content = child }, { content = root2 } })
        local c = client({ stream = true })
        local by_session = {}
        local result, err = H.run({ max_depth = 2, root_llm = c.root_llm, llm_query = c.llm_query,
          on_event = function(ev)
            if ev.type == "root_delta" then
              local t = by_session[ev.session .. "@" .. ev.depth] or {}
              t[#t + 1] = ev.text
              by_session[ev.session .. "@" .. ev.depth] = t
            end
          end })
        assert.is_nil(err)
        assert.are.equal("from the child", result.answer)
        assert.are.equal(root1 .. root2, table.concat(by_session["1@0"]))
        assert.are.equal(child, table.concat(by_session["1.1@1"]))
      end)

      it("stops the stream and fails the run when on_event raises on a delta", function()
        srv:script({ { content = "abcdef", pieces = { "ab", "cd", "ef" }, event_delay_ms = 100 } })
        local c = client({ stream = true })
        local result, err = H.run({ root_llm = c.root_llm, llm_query = c.llm_query, on_event = function(ev)
          if ev.type == "root_delta" then
            error("the display broke")
          end
        end })
        assert.is_nil(result)
        assert.are.equal("callback_error", err.kind)
        assert.matches("on_event raised: .*the display broke", err.message)
        assert.are.equal(1, #srv:requests())
      end)
    end)

    describe("llm_query_batch", function()
      it("runs 8 calls of 1 s side by side in about 1 s", function()
        local replies, prompts, want = {}, {}, {}
        for i = 1, 8 do
          replies[i] = { content = "a" .. i, delay_ms = 1000, usage = { 1, 1 } }
          prompts[i] = "p" .. i
          want[i] = "a" .. i
        end
        srv:script(replies)
        local c = client()
        local t0 = socket.gettime()
        local answers = c.llm_query_batch(prompts)
        local secs = socket.gettime() - t0
        assert.are.equal(8, #answers)
        local texts = {}
        for i, a in ipairs(answers) do
          texts[i] = a.text
          assert.are.same({ input_tokens = 1, output_tokens = 1 }, a.usage)
        end
        table.sort(texts)
        assert.are.same(want, texts)
        assert.are.equal(8, c.usage().calls)
        -- one after the other: 8 s
        assert.is_true(secs >= 0.95 and secs < 4, ("took %.2f s"):format(secs))
      end)
    end)
  end)
end

describe("a hostile server", function()
  local stream = require("rlm.llm.stream")
  local openai = require("rlm.llm.openai")

  setup(function()
    srv = F.start()
  end)

  teardown(function()
    srv:stop()
  end)

  local function post(transport, on_chunk)
    return transport({ url = srv.url .. "/chat/completions", method = "POST", headers = {},
      body = '{"stream":true}', timeout_ms = 5000, on_chunk = on_chunk })
  end

  local OK = "HTTP/1.1 200 OK\r\n"
  -- one row a case: the raw reply, a tail written 1,000 times after it,
  -- the error
  local cases = {
    { OK .. "X-Endless: ", ("a"):rep(1000), "a reply line or head longer than 65536 bytes",
      "a head that never ends" },
    { OK .. "Transfer-Encoding: chunked\r\n\r\n" .. ("f"):rep(2000) .. "\r\n", "",
      "a reply line or head longer than 1024 bytes", "a chunk size line of 2000 bytes" },
    { OK .. "Transfer-Encoding: chunked\r\n\r\nzz\r\n", "", "a malformed chunk size", "a chunk size not in hex" },
    { OK .. "Content-Length: 10\r\n\r\nabc", "", "closed mid%-reply", "a body shorter than its Content-Length" },
    { "SSH-2.0-OpenSSH\r\n\r\n", "", "the reply is not HTTP", "a reply that is not HTTP" },
  }
  for _, case in ipairs(cases) do
    it("fails the request, bounded, for " .. case[4], function()
      srv:script({ { raw = case[1], raw_tail = case[2], raw_repeat = 1000 } })
      local status, err = post(luasocket.new())
      assert.is_nil(status)
      assert.matches(case[3], err)
    end)
  end

  it("fails a body past max_body_bytes while it comes, never holding it", function()
    srv:script({ { raw = OK .. "\r\n" .. ("x"):rep(10000) } }) -- to the close
    local status, err = luasocket.new({ max_body_bytes = 4096 })({ url = srv.url .. "/chat/completions",
      method = "POST", headers = {}, body = "{}", timeout_ms = 5000 })
    assert.is_nil(status)
    assert.matches("longer than 4096 bytes", err)
  end)

  it("stops a stream past the client's bound, and never retries it", function()
    local saved = stream.MAX_STREAM_BYTES
    stream.MAX_STREAM_BYTES = 5000
    local event = 'data: {"choices":[{"delta":{"content":"xxxxxxxxxx"}}]}\n\n'
    srv:script({ { raw = OK .. "Content-Type: text/event-stream\r\n\r\n" .. event:rep(200) } })
    local c = openai.new({ base_url = srv.url, model = "m", stream = true, sleep = function() end })
    local ok, err = pcall(c.root_llm, user("q"), { delta = function() end })
    stream.MAX_STREAM_BYTES = saved
    assert.is_false(ok)
    assert.matches("the streamed reply is longer than 5000 bytes", tostring(err))
    assert.are.equal(1, #srv:requests())
  end)

  it("bounds an event of the stream that never ends", function()
    srv:script({ { raw = OK .. "Content-Type: text/event-stream\r\n\r\ndata: ", raw_tail = ("y"):rep(100000),
      raw_repeat = 50 } })
    local c = openai.new({ base_url = srv.url, model = "m", stream = true, retries = 0 })
    local ok, err = pcall(c.root_llm, user("q"), { delta = function() end })
    assert.is_false(ok)
    assert.matches("an event of the stream is longer than 4194304 bytes", tostring(err))
  end)
end)

describe("the LuaSocket transport's on_chunk", function()
  setup(function()
    srv = F.start()
  end)

  teardown(function()
    srv:stop()
  end)

  it("gets a 2xx body in pieces, and an error status's body comes whole", function()
    srv:script({ { content = "abc", pieces = { "a", "b", "c" }, event_delay_ms = 50 },
      { status = 500, body = "broken" } })
    local t = luasocket.new()
    local pieces = {}
    local request = { url = srv.url .. "/chat/completions", method = "POST", headers = {},
      body = '{"stream":true}', timeout_ms = 5000, on_chunk = function(p)
        pieces[#pieces + 1] = p
        return true
      end }
    local status, body = t(request)
    assert.are.equal(200, status)
    assert.are.equal("", body)
    assert.is_true(#pieces >= 3, "pieces: " .. #pieces)
    assert.matches("data: %[DONE%]", table.concat(pieces))
    pieces = {}
    status, body = t(request)
    assert.are.equal(500, status)
    assert.are.equal("broken", body)
    assert.are.same({}, pieces)
  end)

  it("stops when on_chunk says so, with its message", function()
    srv:script({ { content = "abc", pieces = { "a", "b", "c" }, event_delay_ms = 100 } })
    local status, err = luasocket.new()({ url = srv.url .. "/chat/completions", method = "POST", headers = {},
      body = '{"stream":true}', timeout_ms = 5000, on_chunk = function()
        return nil, "enough"
      end })
    assert.is_nil(status)
    assert.are.equal("enough", err)
  end)
end)

-- One list of the providers (rlm.llm.config.PROVIDERS), which the command
-- line and the Neovim plugin read: each entry a module that makes a
-- client, every such module in it, and the rows above one for each.
describe("the list of providers", function()
  local config = require("rlm.llm.config")

  it("names each provider module once, and every module that makes a client over rlm.llm.client", function()
    local listed, names = {}, {}
    for _, p in ipairs(config.PROVIDERS) do
      assert.is_nil(listed[p.name], p.name)
      listed[p.name] = true
      names[#names + 1] = p.name
      assert.is_function(require("rlm.llm." .. p.name).new, p.name)
      assert.is_string(p.key_env, p.name)
      assert.matches("^https://", p.base_url, 1, false)
    end
    -- A provider's file hands its API's description to client.new.
    local found = {}
    local p = assert(io.popen("cd lua/rlm/llm && grep -l 'client\\.new(' *.lua | sort"))
    for file in p:lines() do
      found[#found + 1] = file:gsub("%.lua$", "")
    end
    p:close()
    table.sort(names)
    assert.are.same(names, found)
    local rows = {}
    for _, P in ipairs(PROVIDERS) do
      rows[#rows + 1] = P.name
    end
    table.sort(rows)
    assert.are.same(names, rows)
  end)

  it("is read by the command line, whose --provider takes each name and refuses another", function()
    assert.are.equal(config.PROVIDERS[1], config.provider(config.PROVIDERS[1].name))
    assert.is_nil(config.provider("claude"))
    assert.are.equal("openai, anthropic or gemini", config.provider_names())
    local p = assert(io.popen(("env -u RLM_PROVIDER %s bin/rlm --provider claude --model m --context /dev/null q 2>&1")
      :format(os.getenv("RLM_SPEC_LUA") or "lua5.4")))
    local out = p:read("*a")
    p:close()
    assert.matches("--provider wants " .. config.provider_names() .. ", got \"claude\"", out, 1, true)
  end)
end)
