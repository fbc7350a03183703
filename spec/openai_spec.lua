-- rlm.llm.openai against a fake OpenAI-compatible server on 127.0.0.1
-- (spec/helpers/fake_openai.py), through the real LuaSocket transport.
local H = require("helpers")
local F = require("helpers.fake_openai")
local openai = require("rlm.llm.openai")
local luasocket = require("rlm.llm.transport.luasocket")
local socket = require("socket")

local SECRET_ENV = "RLM_SPEC_SECRET"
local secret = assert(os.getenv(SECRET_ENV), "spec/run sets RLM_SPEC_SECRET")

local srv

-- A client on the fake server; opts override the defaults (false removes
-- one). Retries sleep through a recorder: .sleeps lists the seconds asked for.
local function client(opts)
  local sleeps = {}
  local cfg = {
    base_url = srv.url,
    model = "fake-root",
    api_key_env = SECRET_ENV,
    retry_base_ms = 250,
    jitter = false, -- the waits exactly; "jitter" below draws them
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
  local c = openai.new(cfg)
  c.sleeps = sleeps
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

-- A port nothing listens on.
local function closed_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return port
end

-- Nothing but the fake server may outlive a test; no workdir either.
local function assert_only_server()
  collectgarbage()
  collectgarbage()
  assert.are.same({ srv.pid }, H.settled_children(1))
  assert.are.same({}, H.workdirs())
end

describe("rlm.llm.openai", function()
  setup(function()
    srv = F.start()
  end)

  teardown(function()
    srv:stop()
  end)

  after_each(assert_only_server)

  describe("new", function()
    local good = { base_url = "http://127.0.0.1:1/v1", model = "m" }
    local function with(k, v)
      local cfg = {}
      for key, value in pairs(good) do
        cfg[key] = value
      end
      cfg[k] = v
      return cfg
    end

    -- one row a case: cfg, the error it raises
    local cases = {
      { with("modle", "m"), "unknown option 'modle'" },
      { { model = "m" }, "option 'base_url' is required" },
      { { base_url = "http://x/v1" }, "option 'model' is required" },
      { with("base_url", "ftp://x/v1"), "option 'base_url' must be an http:// or https:// URL" },
      { with("model", ""), "option 'model' must be a model name, a list of names %(one per depth%), or a function" },
      { with("sub_model", 7), "option 'sub_model' must be a model name.*, got 7" },
      { with("sub_modle", "m"), "unknown option 'sub_modle' %(did you mean 'sub_model'%?" },
      { with("temperature", "hot"), "option 'temperature' must be a number from 0 to 2" },
      { with("temperature", 3), "option 'temperature'" },
      { with("max_tokens", 1.5), "option 'max_tokens' must be an integer >= 1" },
      { with("timeout_ms", 0), "option 'timeout_ms' must be a number > 0" },
      { with("retries", -1), "option 'retries' must be an integer >= 0" },
      { with("retry_base_ms", "1"), "option 'retry_base_ms'" },
      { with("prices", { m = { input_per_mtok = 1 } }), "prices%[\"m\"%]%.output_per_mtok must be a number" },
      { with("prices", { m = { input_per_mtok = 1, output_per_mtok = 2, cached = 0 } }),
        "prices%[\"m\"%] has unknown field 'cached'" },
      { with("headers", { ["x-a"] = "1\r\nInjected: 1" }), "option 'headers'" },
      { with("transport", "curl"), "option 'transport' must be a function" },
      { with("sleep", 1), "option 'sleep' must be a function" },
    }
    for _, case in ipairs(cases) do
      it("raises naming the option: " .. case[2], function()
        raises(case[2], openai.new, case[1])
      end)
    end

    it("raises for a cfg that is not a table", function()
      raises("expected a table of options, got string", openai.new, "http://x")
    end)

    it("never echoes a key passed as api_key_env", function()
      local err = raises("option 'api_key_env' must be the NAME of an environment variable",
        openai.new, with("api_key_env", "sk-live-abc123"))
      assert.is_nil(err:find("sk-live-abc123", 1, true))
    end)

    it("keeps the key out of the table it returns", function()
      local c = client()
      for k, v in pairs(c) do
        assert.are_not.equal(secret, v, k)
      end
    end)
  end)

  describe("a reply", function()
    it("gives the text and the usage from the reply's usage field", function()
      srv:script({ { content = "the answer", usage = { 12, 5 } } })
      local c = client({ temperature = 0.5, max_tokens = 64 })
      local n = select("#", c.root_llm(user("question?")))
      srv:script({ { content = "the answer", usage = { 12, 5 } } })
      local text, usage = c.root_llm(user("question?"))
      assert.are.equal(2, n)
      assert.are.equal("the answer", text)
      assert.are.same({ input_tokens = 12, output_tokens = 5 }, usage)
      local req = srv:requests()[1]
      assert.are.equal("POST", req.method)
      assert.are.equal("/v1/chat/completions", req.path)
      assert.are.same({ model = "fake-root", messages = user("question?"), stream = false,
        temperature = 0.5, max_tokens = 64 }, req.json)
      assert.are.equal("application/json", req.headers["content-type"])
    end)

    it("sends llm_query to the sub-model as one user message", function()
      srv:script({ { content = "sub says hi", usage = { 3, 4 } } })
      local c = client({ sub_model = "fake-sub" })
      local text, usage = c.llm_query("summarise this")
      assert.are.equal("sub says hi", text)
      assert.are.same({ input_tokens = 3, output_tokens = 4 }, usage)
      local body = srv:requests()[1].json
      assert.are.equal("fake-sub", body.model)
      assert.are.same(user("summarise this"), body.messages)
    end)

    it("sends llm_query to the root model when there is no sub_model", function()
      srv:script({ { content = "x" } })
      client().llm_query("p")
      assert.are.equal("fake-root", srv:requests()[1].json.model)
    end)

    it("reads a chunked reply whole", function()
      local long = ("chunk "):rep(200)
      srv:script({ { content = long, usage = { 1, 2 }, chunked = true } })
      assert.are.equal(long, (client().root_llm(user("q"))))
    end)

    it("sends extra headers", function()
      srv:script({ { content = "x" } })
      client({ headers = { ["X-Title"] = "rlm spec" } }).root_llm(user("q"))
      assert.are.equal("rlm spec", srv:requests()[1].headers["x-title"])
    end)
  end)

  describe("the API key", function()
    it("goes in the Authorization header, read from the variable api_key_env names", function()
      srv:script({ { content = "x" } })
      client().root_llm(user("q"))
      local req = srv:requests()[1]
      assert.are.equal("Bearer " .. secret, req.headers.authorization)
      assert.is_nil(req.body:find(secret, 1, true))
    end)

    it("is in the argv of no process while the request is in flight", function()
      srv:script({ { content = "x" } })
      client().root_llm(user("q"))
      assert.are.same({}, srv:requests()[1].argv_hits)
    end)

    it("would be seen in a process's argv (the check above is not vacuous)", function()
      math.randomseed(os.time() + H.pid())
      local decoy = ("decoy-token-%d-%d"):format(H.pid(), math.random(1e9))
      local sleeper = assert(io.popen("echo $$; exec python3 -c 'import time; time.sleep(30)' " .. decoy, "r"))
      local pid = tonumber(sleeper:read("*l"))
      -- wait for the exec, so that the scan does not race it: until then
      -- the command line is the shell's, which names time.sleep too
      local cmdline = ""
      for _ = 1, 200 do
        local f = io.open("/proc/" .. pid .. "/cmdline", "rb")
        cmdline = f and f:read("*a") or ""
        if f then
          f:close()
        end
        if cmdline:find("^python3%z") then
          break
        end
        socket.sleep(0.01)
      end
      srv:script({ { content = "x" } })
      client({ api_key_env = false, headers = { Authorization = "Bearer " .. decoy } }).root_llm(user("q"))
      os.execute("kill " .. pid)
      sleeper:close()
      local hits = srv:requests()[1].argv_hits
      assert.is_truthy(cmdline:find(decoy, 1, true))
      assert.is_true(#hits >= 1)
      local found = false
      for _, hit in ipairs(hits) do
        found = found or hit == pid
      end
      assert.is_true(found, "the scan missed pid " .. pid)
    end)

    it("is not sent when api_key_env is not given", function()
      srv:script({ { content = "x" } })
      client({ api_key_env = false }).root_llm(user("q"))
      assert.is_nil(srv:requests()[1].headers.authorization)
    end)

    it("is not sent when the variable is unset, and a 401 says so", function()
      srv:script({ { status = 401, json = { error = { message = "Missing bearer token" } } } })
      local c = client({ api_key_env = "RLM_SPEC_NO_SUCH_VARIABLE" })
      raises("HTTP 401 %(no key was sent: %$RLM_SPEC_NO_SUCH_VARIABLE is not set%): Missing bearer token",
        c.root_llm, user("q"))
      assert.is_nil(srv:requests()[1].headers.authorization)
    end)

    it("is scrubbed from an error whose reply echoes it", function()
      srv:script({ { status = 401, json = { error = { message = "Incorrect API key provided: " .. secret } } } })
      local err = raises("HTTP 401 %(the key from %$RLM_SPEC_SECRET was refused%)", client().root_llm, user("q"))
      assert.is_nil(err:find(secret, 1, true))
      assert.matches("Incorrect API key provided: %[the API key%]", err)
    end)
  end)

  describe("a malformed reply raises", function()
    -- one row a case: the scripted reply, the error
    local cases = {
      { { body = "<html>Bad Gateway</html>" }, "is not a JSON object.*<html>Bad Gateway</html>" },
      { { json = { id = "x" } }, "has no choices" },
      { { json = { choices = {} } }, "has no choices" },
      { { json = { choices = { { message = { content = 42 } } } } }, "content is number" },
      { { json = { choices = { { message = { role = "assistant" } } } } }, "content is nil" },
      { { body = '{"choices":[{"message":{"content":null}}]}' }, "content is null" },
      { { body = '{"choices":[{"message":{"content":null,"refusal":"I cannot help"}}]}' },
        "the model refused: I cannot help" },
      { { status = 400, json = { error = { message = "max_tokens is too large" } } },
        "HTTP 400: max_tokens is too large" },
      { { status = 404, body = "no such route" }, "HTTP 404: no such route" },
      { { status = 422, body = ("x"):rep(5000) }, "HTTP 422: x+%.%.%.$" },
    }
    for _, case in ipairs(cases) do
      it(case[2], function()
        srv:script({ case[1] })
        local c = client()
        raises(case[2], c.root_llm, user("q"))
        assert.are.equal(1, #srv:requests()) -- never retried
        assert.are.same({}, c.sleeps)
      end)
    end
  end)

  describe("retries", function()
    it("honour retry-after-ms before Retry-After", function()
      srv:script({ { status = 429, headers = { ["retry-after-ms"] = "1500", ["Retry-After"] = "9" } },
        { content = "ok" } })
      local c = client()
      c.root_llm(user("q"))
      assert.are.same({ 1.5 }, c.sleeps)
    end)

    it("cap Retry-After at retry_max_ms", function()
      srv:script({ { status = 429, headers = { ["Retry-After"] = "3600" } }, { content = "ok" } })
      local c = client({ retry_max_ms = 3000 })
      c.root_llm(user("q"))
      assert.are.same({ 3 }, c.sleeps)
    end)

    it("back off exponentially from retry_base_ms on 5xx", function()
      srv:script({ { status = 500 }, { status = 503 }, { content = "third time" } })
      local c = client()
      assert.are.equal("third time", (c.root_llm(user("q"))))
      assert.are.same({ 0.25, 0.5 }, c.sleeps)
      assert.are.equal(3, #srv:requests())
    end)

    it("are off with retries = 0", function()
      srv:script({ { status = 429 }, { content = "never asked for" } })
      local c = client({ retries = 0 })
      raises("HTTP 429", c.root_llm, user("q"))
      assert.are.equal(1, #srv:requests())
    end)

    it("retry a refused connection", function()
      local c = client({ base_url = "http://127.0.0.1:" .. closed_port() .. "/v1", retries = 1 })
      raises("failed: connection refused %(after 1 retries%)", c.root_llm, user("q"))
      assert.are.same({ 0.25 }, c.sleeps)
    end)

    -- one row a case: the status (and headers) of the reply retried
    local retried = {
      { 408 }, { 409 }, { 429 }, { 500 }, { 529 }, { 400, { ["x-should-retry"] = "true" } },
    }
    for _, case in ipairs(retried) do
      it(("retry a %d%s"):format(case[1], case[2] and " that says x-should-retry: true" or ""), function()
        srv:script({ { status = case[1], headers = case[2] }, { content = "second" } })
        local c = client()
        assert.are.equal("second", (c.root_llm(user("q"))))
        assert.are.equal(2, #srv:requests())
      end)
    end

    it("do not retry a 503 that says x-should-retry: false", function()
      srv:script({ { status = 503, headers = { ["x-should-retry"] = "false" } }, { content = "never asked for" } })
      raises("HTTP 503", client().root_llm, user("q"))
      assert.are.equal(1, #srv:requests())
    end)

    it("honour a Retry-After that is an HTTP date", function()
      local at = os.date("!%a, %d %b %Y %H:%M:%S GMT", os.time() + 30)
      srv:script({ { status = 429, headers = { ["Retry-After"] = at } }, { content = "ok" } })
      local c = client()
      c.root_llm(user("q"))
      assert.is_true(c.sleeps[1] > 28 and c.sleeps[1] <= 30, tostring(c.sleeps[1]))
    end)

    it("take a Retry-After date in the past as no wait", function()
      srv:script({ { status = 429, headers = { ["Retry-After"] = "Sun, 06 Nov 1994 08:49:37 GMT" } },
        { content = "ok" } })
      local c = client()
      c.root_llm(user("q"))
      assert.are.same({ 0 }, c.sleeps)
    end)

    it("wait a uniform draw from 0 to the doubling bound (full jitter)", function()
      local draws = { 0.5, 0.25, 0.999 }
      srv:script({ { status = 500 }, { status = 500 }, { status = 500 }, { content = "ok" } })
      local c = client({ jitter = true, retries = 3, random = function()
        return table.remove(draws, 1)
      end })
      c.root_llm(user("q"))
      assert.are.same({ 0.125, 0.125, 0.999 }, c.sleeps)
    end)

    it("draw different waits for calls that failed together", function()
      local waits = {}
      for i = 1, 8 do
        srv:script({ { status = 429 }, { content = "ok" } })
        local c = client({ jitter = true, retry_base_ms = 1000 })
        c.root_llm(user("q"))
        waits[i] = c.sleeps[1]
      end
      table.sort(waits)
      assert.is_true(waits[1] >= 0 and waits[8] < 1)
      assert.is_true(waits[8] - waits[1] > 0.1, "the draws hardly differ: " .. table.concat(waits, " "))
    end)

    it("sleep for real without a sleep option", function()
      srv:script({ { status = 500 }, { content = "ok" } })
      local c = client({ sleep = false, retry_base_ms = 200 })
      local t0 = socket.gettime()
      assert.are.equal("ok", (c.root_llm(user("q"))))
      assert.is_true(socket.gettime() - t0 >= 0.19)
    end)
  end)

  describe("llm_query_batch", function()
    it("gives a failed call its error in its slot, the key scrubbed", function()
      srv:script({ { content = "fine" }, { status = 400, json = { error = { message = "bad key " .. secret } } } })
      local answers = client({ retries = 0 }).llm_query_batch({ "a", "b" })
      local ok_slot, bad_slot = answers[1], answers[2]
      if ok_slot.error then
        ok_slot, bad_slot = bad_slot, ok_slot
      end
      assert.are.equal("fine", ok_slot.text)
      assert.matches("HTTP 400: bad key %[the API key%]", bad_slot.error)
      assert.is_nil(bad_slot.error:find(secret, 1, true))
    end)

    it("waits out the 429s of its calls side by side too", function()
      srv:script({ { status = 429, headers = { ["Retry-After"] = "1" } },
        { status = 429, headers = { ["Retry-After"] = "1" } }, { content = "a" }, { content = "b" } })
      local c = client({ sleep = false })
      local t0 = socket.gettime()
      local answers = c.llm_query_batch({ "a", "b" })
      local secs = socket.gettime() - t0
      assert.is_nil(answers[1].error or answers[2].error)
      assert.are.equal(4, #srv:requests())
      -- One after the other they take 2 s and more; side by side 1 s, and 1.79 s
      -- was seen on a loaded machine.
      assert.is_true(secs >= 0.95 and secs < 1.95, ("took %.2f s (one sleep after the other takes 2)"):format(secs))
    end)

    it("is there only where calls can go side by side (a transport of LuaSocket, or gather)", function()
      assert.is_nil(client({ transport = function() end }).llm_query_batch)
      assert.is_function(client({ transport = luasocket.new() }).llm_query_batch)
      assert.is_function(client({ transport = function() end, gather = function() end }).llm_query_batch)
    end)
  end)

  describe("timeout_ms", function()
    it("bounds a slow reply, which is not retried", function()
      srv:script({ { content = "too late", delay_ms = 4000 }, { content = "never asked for" } })
      local c = client({ timeout_ms = 300 })
      local t0 = socket.gettime()
      raises("failed: timeout %(timeout_ms is 300%)", c.root_llm, user("q"))
      local elapsed = socket.gettime() - t0
      assert.is_true(elapsed >= 0.29, "returned after " .. elapsed .. " s")
      assert.is_true(elapsed < 3, "returned after " .. elapsed .. " s")
      assert.are.same({}, c.sleeps)
    end)
  end)

  describe("cost_usd", function()
    it("adds up root and sub-model calls at their own prices from cfg.prices", function()
      srv:script({ { content = "a", usage = { 1000, 100 } }, { content = "b", usage = { 500, 50 } },
        { content = "c", usage = { 1000, 100 } } })
      local c = client({ sub_model = "fake-sub", prices = {
        ["fake-root"] = { input_per_mtok = 10, output_per_mtok = 30 },
        ["fake-sub"] = { input_per_mtok = 1, output_per_mtok = 2 },
      } })
      c.root_llm(user("q"))
      c.llm_query("p")
      c.root_llm(user("q"))
      local want = (2000 * 10 + 200 * 30 + 500 * 1 + 50 * 2) / 1e6
      assert.is_true(math.abs(c.cost_usd() - want) < 1e-12)
      local u = c.usage()
      assert.are.same({ input_tokens = 2500, output_tokens = 250, calls = 3, by_model = {
        ["fake-root"] = { input_tokens = 2000, output_tokens = 200, calls = 2 },
        ["fake-sub"] = { input_tokens = 500, output_tokens = 50, calls = 1 },
      } }, u)
    end)

    it("lets cfg.prices override a default without changing the shared table", function()
      local before = openai.prices["gpt-4o"].input_per_mtok
      srv:script({ { content = "x", usage = { 1000000, 0 } } })
      local c = client({ model = "gpt-4o", prices = { ["gpt-4o"] = { input_per_mtok = 1, output_per_mtok = 1 } } })
      c.root_llm(user("q"))
      assert.are.equal(1, c.cost_usd())
      assert.are.equal(before, openai.prices["gpt-4o"].input_per_mtok)
    end)

    it("raises, naming the model, once tokens were counted for a model with no price", function()
      local c = client({ model = "unpriced-model" })
      assert.are.equal(0, c.cost_usd())
      srv:script({ { content = "x", usage = { 10, 10 } } })
      c.root_llm(user("q"))
      raises("no price for model 'unpriced%-model'", c.cost_usd)
    end)
  end)

  describe("the transport", function()
    it("is any function(request) returning status, body, headers", function()
      local seen
      local c = client({ transport = function(request)
        seen = request
        return 200, '{"choices":[{"message":{"content":"from a stub"}}],"usage":{"prompt_tokens":1,'
          .. '"completion_tokens":2}}', { ["content-type"] = "application/json" }
      end })
      local text, usage = c.root_llm(user("q"))
      assert.are.equal("from a stub", text)
      assert.are.same({ input_tokens = 1, output_tokens = 2 }, usage)
      assert.are.equal(srv.url .. "/chat/completions", seen.url)
      assert.are.equal("POST", seen.method)
      assert.are.equal(10000, seen.timeout_ms)
      assert.are.equal("Bearer " .. secret, seen.headers.authorization)
      assert.are.equal("q", require("cjson").decode(seen.body).messages[1].content)
    end)

    it("may report a network failure as nil, message, which is retried", function()
      local calls = 0
      local c = client({ transport = function()
        calls = calls + 1
        if calls == 1 then
          return nil, "connection reset by peer"
        end
        return 200, '{"choices":[{"message":{"content":"second"}}]}', {}
      end })
      assert.are.equal("second", (c.root_llm(user("q"))))
      assert.are.same({ 0.25 }, c.sleeps)
    end)

    it("may call done instead of returning", function()
      local c = client({ transport = function(_, done)
        done(200, '{"choices":[{"message":{"content":"via done"}}]}', {})
      end })
      assert.are.equal("via done", (c.root_llm(user("q"))))
    end)

    it("that completes later needs a coroutine, and says so", function()
      local c = client({ transport = function() end })
      raises("needs the session to run inside a coroutine", c.root_llm, user("q"))
    end)

    it("caps the reply body it keeps (luasocket.max_body_bytes)", function()
      srv:script({ { content = ("x"):rep(5000) } })
      local t = luasocket.new({ max_body_bytes = 1000 })
      local status, err = t({ url = srv.url .. "/chat/completions", method = "POST", headers = {}, body = "{}",
        timeout_ms = 5000 })
      assert.is_nil(status)
      assert.matches("longer than 1000 bytes", err)
    end)

    it("raises misuse of luasocket.new naming the option", function()
      raises("unknown option 'verify'", luasocket.new, { verify = false })
      raises("option 'cafile' must be a non%-empty string, got 1", luasocket.new, { cafile = 1 })
    end)
  end)

  describe("over TLS", function()
    local dir, tls_srv
    local function cert(name, san)
      local c, k = dir .. "/" .. name .. ".pem", dir .. "/" .. name .. ".key"
      H.sh(("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -keyout %s -out %s -subj /CN=%s "
        .. "-addext subjectAltName=%s 2>/dev/null"):format(k, c, name, san))
      return c, k
    end

    setup(function()
      dir = H.sh("mktemp -d /tmp/rlm-tls.XXXXXX")
    end)

    teardown(function()
      H.sh("rm -rf " .. dir)
    end)

    after_each(function()
      if tls_srv then
        tls_srv:stop()
        tls_srv = nil
      end
    end)

    local function post(transport)
      return transport({ url = tls_srv.url .. "/chat/completions", method = "POST", headers = {},
        body = "{}", timeout_ms = 5000 })
    end

    it("trusts a certificate that a trusted CA signed for the host", function()
      local c, k = cert("good", "IP:127.0.0.1")
      assert.is_truthy(io.open(c), "openssl made no certificate")
      tls_srv = F.start(c, k)
      tls_srv:script({ { content = "over tls" } })
      local status, body = post(luasocket.new({ cafile = c }))
      assert.are.equal(200, status)
      assert.matches("over tls", body)
    end)

    it("runs a batch side by side over TLS too (LuaSec's handshake and reads, non-blocking)", function()
      local c, k = cert("good", "IP:127.0.0.1")
      tls_srv = F.start(c, k)
      local replies = {}
      for i = 1, 4 do
        replies[i] = { content = "t" .. i, delay_ms = 1000 }
      end
      tls_srv:script(replies)
      local cl = openai.new({ base_url = tls_srv.url, model = "m", retries = 0, transport = luasocket.new({ cafile = c }) })
      local t0 = socket.gettime()
      local answers = cl.llm_query_batch({ "a", "b", "c", "d" })
      local secs = socket.gettime() - t0
      for i = 1, 4 do
        assert.is_string(answers[i].text, answers[i].error)
      end
      assert.is_true(secs < 2.5, ("took %.2f s"):format(secs))
    end)

    it("refuses a certificate no trusted CA signed, before sending anything", function()
      local c, k = cert("selfsigned", "IP:127.0.0.1")
      tls_srv = F.start(c, k)
      tls_srv:script({ { content = "x" } })
      local status, err = post(luasocket.new())
      assert.is_nil(status)
      assert.matches("certificate verify failed", err)
      assert.are.same({}, tls_srv:requests())
    end)

    it("refuses a trusted certificate that names another host, before sending anything", function()
      local c, k = cert("other", "DNS:other.invalid")
      tls_srv = F.start(c, k)
      tls_srv:script({ { content = "x" } })
      local status, err = post(luasocket.new({ cafile = c }))
      assert.is_nil(status)
      assert.matches("does not name it", err)
      assert.are.same({}, tls_srv:requests())
    end)

    -- one row a case: certificate name, host, matches
    local names = {
      { "api.example.com", "api.example.com", true },
      { "API.Example.com", "api.example.COM", true },
      { "*.example.com", "api.example.com", true },
      { "*.example.com", "a.b.example.com", false },
      { "*.example.com", "example.com", false },
      { "*.com", "example.com", false },
      { "api.example.com", "api.example.com.evil", false },
      { "a*.example.com", "ab.example.com", false },
    }
    for _, case in ipairs(names) do
      it(("matches %s against %s: %s"):format(case[1], case[2], tostring(case[3])), function()
        local fake_cert = {
          extensions = function()
            return { ["2.5.29.17"] = { dNSName = { case[1] } } }
          end,
          subject = function()
            return {}
          end,
        }
        assert.are.equal(case[3], luasocket.certificate_names_host(fake_cert, case[2]))
      end)
    end
  end)

  describe("in a session", function()
    local prices = {
      ["fake-root"] = { input_per_mtok = 3, output_per_mtok = 15 },
      ["fake-sub"] = { input_per_mtok = 0.5, output_per_mtok = 1.5 },
    }

    local function script_run()
      srv:script({
        { content = "Let me ask.\n" .. F.fence("r = llm_query('What is 6 * 7?')\nprint('sub said', r)"),
          usage = { 100, 20 } },
        { content = "42", usage = { 10, 2 } },
        { content = F.fence("FINAL(r)"), usage = { 150, 10 } },
      })
    end

    it("answers end to end, with the token and cost totals", function()
      script_run()
      local c = client({ sub_model = "fake-sub", prices = prices })
      local result, err = H.run({ context = "some context", query = "what is 6 * 7?",
        root_llm = c.root_llm, llm_query = c.llm_query, cost = { usd = c.cost_usd, max_usd = 1 } })
      assert.is_nil(err)
      assert.are.equal("42", result.answer)
      assert.are.equal(2, result.iterations)
      assert.are.equal(1, result.sub_calls)
      assert.are.same({ input = 260, output = 32, total = 292 }, result.tokens)
      local want = (250 * 3 + 30 * 15 + 10 * 0.5 + 2 * 1.5) / 1e6
      assert.is_true(math.abs(c.cost_usd() - want) < 1e-12, tostring(c.cost_usd()))
      local reqs = srv:requests()
      assert.are.equal(3, #reqs)
      assert.are.same({ "fake-root", "fake-sub", "fake-root" }, { reqs[1].json.model, reqs[2].json.model,
        reqs[3].json.model })
      assert.are.equal("system", reqs[1].json.messages[1].role)
      assert.matches("what is 6 %* 7%?", reqs[1].json.messages[2].content)
      assert.are.same(user("What is 6 * 7?"), reqs[2].json.messages)
      -- the root model saw the output of its code
      assert.matches("sub said 42", reqs[3].json.messages[#reqs[3].json.messages].content)
    end)

    it("ends with cost_budget when the replies' cost reaches cost.max_usd", function()
      script_run()
      local c = client({ sub_model = "fake-sub", prices = prices })
      local result, err = H.run({ root_llm = c.root_llm, llm_query = c.llm_query, cost = { usd = c.cost_usd,
        max_usd = 0.0001 }, fallback = false })
      assert.is_nil(result)
      assert.are.equal("cost_budget", err.kind)
      assert.are.equal(1, #srv:requests()) -- 0.0006 USD after the first call
    end)

    it("turns a malformed reply into callback_error", function()
      srv:script({ { body = "not json at all" } })
      local c = client()
      local result, err = H.run({ root_llm = c.root_llm, llm_query = c.llm_query })
      assert.is_nil(result)
      assert.are.equal("callback_error", err.kind)
      assert.matches("is not a JSON object", err.message)
    end)

    -- The session runs in a coroutine; run() passes yields through to us.
    local function run_in_coroutine(opts, on_yield)
      local s = H.session(opts)
      local co = coroutine.create(function()
        return s:run()
      end)
      local ok, result, err = coroutine.resume(co)
      local yields = 0
      while coroutine.status(co) ~= "dead" do
        assert.is_true(ok, tostring(result))
        yields = yields + 1
        on_yield(result)
        ok, result, err = coroutine.resume(co)
      end
      s:close()
      assert.is_true(ok, tostring(result))
      return result, err, yields
    end

    it("works with a transport that yields inside (a cosocket-style client)", function()
      script_run()
      local real = luasocket.new()
      local c = client({ sub_model = "fake-sub", transport = function(request)
        coroutine.yield("waiting on the network")
        return real(request)
      end })
      local result, err, yields = run_in_coroutine({ root_llm = c.root_llm, llm_query = c.llm_query },
        function(v)
          assert.are.equal("waiting on the network", v)
        end)
      assert.is_nil(err)
      assert.are.equal("42", result.answer)
      assert.are.equal(3, yields)
    end)

    it("works with a transport that calls done from the host's loop", function()
      script_run()
      local real = luasocket.new()
      local queued = {}
      local c = client({ sub_model = "fake-sub", transport = function(request, done)
        queued[#queued + 1] = function()
          done(real(request))
        end
      end })
      local result, err, yields = run_in_coroutine({ root_llm = c.root_llm, llm_query = c.llm_query },
        function()
          -- the host's event loop: the request completes, then it resumes us
          assert.are.equal(1, #queued)
          table.remove(queued, 1)()
        end)
      assert.is_nil(err)
      assert.are.equal("42", result.answer)
      assert.are.equal(3, yields)
      assert.are.same({ input = 260, output = 32, total = 292 }, result.tokens)
    end)
  end)
end)
