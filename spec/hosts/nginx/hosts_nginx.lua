-- The handlers of the nginx host test (spec/hosts/nginx/nginx.conf.in).
-- luacheck: globals ngx
local cjson = require("cjson")
local resty = require("rlm.adapters.resty")

local M = {}

local tmpdir = os.getenv("RLM_HOSTS_TMPDIR")

local function fence(code)
  return "```repl\n" .. code .. "\n```"
end

-- The issue's scenario: the root model answers after a second (ngx.sleep in
-- its light thread), the REPL spins for two seconds, four sub-calls each
-- take 200 ms (three of them at once, through llm_query_batched), and the
-- second root answer comes through done() from a timer. The JSON reply
-- says what happened.
function M.session()
  local t0 = ngx.now()
  local running, most = 0, 0
  local turn = 0
  local result, err = resty.run({
    context = "the answer is in the sub-calls",
    sandbox = { tmpdir = tmpdir },
    step_timeout_ms = 30000,
    root_llm = function(_, done)
      turn = turn + 1
      if turn == 1 then
        ngx.sleep(1)
        return fence("import time\nt0 = time.time()\nspins = 0\n"
          .. "while time.time() - t0 < 2.0:\n    spins += 1\n"
          .. "r = llm_query('ping')\nparts = llm_query_batched(['a', 'b', 'c'])\nprint(r, parts)")
      end
      assert(ngx.timer.at(1, function()
        done(fence("FINAL(r + '/' + ''.join(parts))"))
      end))
    end,
    llm_query = function(prompt)
      running = running + 1
      most = math.max(most, running)
      ngx.sleep(0.2)
      running = running - 1
      return prompt == "ping" and "pong" or prompt:upper()
    end,
  })
  ngx.say(cjson.encode({
    answer = result and result.answer or cjson.null,
    error = err and tostring(err) or cjson.null,
    iterations = result and result.iterations or cjson.null,
    sub_calls = result and result.sub_calls or cjson.null,
    most_concurrent_sub_calls = most,
    elapsed_ms = math.floor((ngx.now() - t0) * 1000),
  }))
end

-- Host tools under the adapter: one reads a key of ngx.shared (the
-- OpenResty way to give the model a cache without a network), one answers
-- after ngx.sleep (its light thread yields), one through done() from a
-- timer, one fails later; the code catches the failure.
function M.tools()
  local dict = ngx.shared.rlm_results
  dict:set("tools:owner", "team-db")
  local result, err = resty.run({
    context = "x",
    sandbox = { tmpdir = tmpdir },
    step_timeout_ms = 30000,
    tools = {
      shared_get = function(key)
        local v = dict:get(key)
        if v == nil then
          return require("rlm").null
        end
        return v
      end,
      slow_double = function(n)
        ngx.sleep(0.05)
        return n * 2
      end,
      later = { async = true, call = function(done, text)
        assert(ngx.timer.at(0.05, function()
          done(text .. "!")
        end))
      end },
      fails_later = { async = true, call = function(done)
        assert(ngx.timer.at(0.02, function()
          done(nil, "the cache is cold")
        end))
      end },
    },
    root_llm = function()
      return fence("try:\n    fails_later()\nexcept ToolError as e:\n    print(e)\n"
        .. "FINAL('%s %s %s %s' % (shared_get('tools:owner'), shared_get('nope'), slow_double(21), later('hi')))")
    end,
    llm_query = function(p)
      return p
    end,
  })
  ngx.say(cjson.encode({
    answer = result and result.answer or cjson.null,
    stdout = result and result.history[1].stdout or cjson.null,
    error = err and tostring(err) or cjson.null,
  }))
end

-- For comparison: Session:run() called in the worker without the adapter,
-- the REPL spinning for a second. The worker serves nothing meanwhile.
function M.blocking_run()
  local s = require("rlm").Session.new({
    context = "x",
    sandbox = { tmpdir = tmpdir },
    root_llm = function()
      return fence("import time\nt0 = time.time()\nwhile time.time() - t0 < 1.0:\n    pass\nFINAL('spun')")
    end,
    llm_query = function(p)
      return p
    end,
  })
  local result, err = s:run()
  s:close()
  ngx.say(result and result.answer or tostring(err))
end

-- The adapter alone, on a stand-in session that hands out three llm_query
-- requests at once: each must run in a light thread of its own, so the three
-- 200 ms calls take 200 ms, not 600.
function M.concurrent()
  local running, most, replies = 0, 0, {}
  local outbox = {}
  for i = 1, 3 do
    outbox[i] = { type = "llm_query", id = i, prompt = "p" .. i, depth = 0 }
  end
  local fake = {
    opts = {
      llm_query = function(prompt)
        running = running + 1
        most = math.max(most, running)
        ngx.sleep(0.2)
        running = running - 1
        return prompt:upper()
      end,
    },
    poll = function()
      if #outbox > 0 then
        return table.remove(outbox, 1)
      end
      if #replies == 3 then
        table.sort(replies)
        return { type = "done", result = { answer = table.concat(replies, ",") } }
      end
    end,
    reply = function(_, _, text)
      replies[#replies + 1] = text
    end,
    timeout = function()
      return -1
    end,
    close = function() end,
    -- What rlm.drive.dispatch asks of a session's scheduler as a driver
    -- takes it: no root call of an earlier poll() is out here.
    scheduler = { reclaim = function() end },
  }
  local t0 = ngx.now()
  local result, err = resty.drive(fake)
  ngx.say(cjson.encode({ answer = result and result.answer or tostring(err), most = most,
    elapsed_ms = math.floor((ngx.now() - t0) * 1000) }))
end

-- The worker's own children while a session runs: os.execute's status (a
-- raw wait status on LuaJIT: exit 3 is 768) and io.popen's output.
function M.exec()
  local status = os.execute("exit 3")
  local p = io.popen("echo from-popen; exit 4")
  local out = p:read("*a")
  p:close()
  ngx.say(cjson.encode({ execute = status, popen = out }))
end

-- Whether the worker catches SIGCHLD (nginx's handler), from /proc.
function M.sigchld()
  local f = assert(io.open("/proc/self/status"))
  local status = f:read("*a")
  f:close()
  local hex = status:match("SigCgt:%s*(%x+)")
  return tonumber(hex:sub(-5, -5), 16) % 2 == 1 and "caught" or "not caught"
end

local function small(phase)
  return {
    context = phase,
    sandbox = { tmpdir = tmpdir },
    root_llm = function()
      return fence("FINAL('ok-' + context)")
    end,
    llm_query = function(p)
      return p
    end,
  }
end

local function text(result, err)
  return result and result.answer or tostring(err)
end

-- The blocking form, in a phase that may wait.
function M.blocking(phase)
  ngx.ctx.answer = text(resty.run(small(phase)))
end

-- The callback form: the session runs in a timer, the answer lands in the
-- shared dict under the phase's name.
function M.callback(phase)
  resty.run(small(phase), function(err, result)
    ngx.shared.rlm_results:set(phase, text(result, err))
  end)
end

-- The blocking form inside a timer's own context.
function M.in_timer(phase)
  assert(ngx.timer.at(0, function()
    ngx.shared.rlm_results:set(phase, text(resty.run(small(phase))))
  end))
end

-- The blocking form where the phase may not wait: it must refuse, naming
-- the phase, before anything starts.
function M.refused(phase)
  local ok, err = pcall(resty.run, small(phase))
  return ok and "ran" or tostring(err):gsub("\n", " ")
end

-- GET /transport?url=U[&n=N][&timeout_ms=T][&max=B]: N requests to U
-- through one rlm.llm.transport.resty, as JSON: each one's status, body and
-- error.
function M.transport()
  local transport = require("rlm.llm.transport.resty").new({
    resolve = { localhost = "127.0.0.1", ["other.invalid"] = "127.0.0.1" },
    max_body_bytes = tonumber(ngx.var.arg_max),
  })
  local url = ngx.unescape_uri(ngx.var.arg_url or "")
  local out = {}
  for i = 1, tonumber(ngx.var.arg_n) or 1 do
    local t0 = ngx.now()
    local status, body, headers = transport({ url = url, method = "POST",
      headers = { ["content-type"] = "application/json", authorization = "Bearer sk-transport" },
      body = cjson.encode({ model = "m" .. i, messages = {} }),
      timeout_ms = tonumber(ngx.var.arg_timeout_ms) or 10000 })
    ngx.update_time()
    out[i] = { status = status or cjson.null, body = status and body or cjson.null,
      error = (not status) and body or cjson.null,
      content_type = headers and headers["content-type"] or cjson.null,
      ms = math.floor((ngx.now() - t0) * 1000) }
  end
  ngx.say(cjson.encode(out))
end

-- From the log phase: a session in the adapter's callback form, its models
-- rlm.llm.<?provider> (openai by default) over the cosocket transport at
-- ?url=BASE, streaming its root calls with ?stream=1; the answer lands in
-- the shared dict under ?key= (with " deltas=N" when streaming: the
-- root_delta events that came).
function M.transport_session()
  local transport = require("rlm.llm.transport.resty")
  local provider = ngx.var.arg_provider or "openai"
  local stream = ngx.var.arg_stream == "1"
  local models = require("rlm.llm." .. provider).new({
    base_url = ngx.unescape_uri(ngx.var.arg_url or ""),
    model = "root-model",
    sub_model = "sub-model",
    stream = stream,
    transport = transport.new({ resolve = { localhost = "127.0.0.1" } }),
    sleep = transport.sleep,
  })
  local key = ngx.var.arg_key
  local deltas = 0
  resty.run({ context = "ERROR a\nok\nERROR b\n", sandbox = { tmpdir = tmpdir },
    root_llm = models.root_llm, llm_query = models.llm_query, on_event = function(ev)
      if ev.type == "root_delta" then
        deltas = deltas + 1
      end
    end }, function(err, result)
    local answer = result and result.answer or ("error: " .. tostring(err))
    ngx.shared.rlm_results:set(key, answer .. (stream and (" deltas=" .. deltas) or ""))
  end)
end

-- GET /abort (lua_check_client_abort on): a run that never ends on its own
-- (each step sleeps, no FINAL). The shared dict counts root_llm's calls
-- ("abort_calls") and says how the run ended ("abort_end"), so that the
-- test can check that a client who leaves ends it and spends nothing more.
function M.abort()
  local dict = ngx.shared.rlm_results
  dict:set("abort_calls", 0)
  dict:set("abort_end", "")
  local h = resty.start({
    context = "x",
    sandbox = { tmpdir = tmpdir },
    max_iterations = 1000,
    step_timeout_ms = 30000,
    root_llm = function()
      dict:incr("abort_calls", 1)
      return fence("import time\ntime.sleep(0.2)\nprint('still here')")
    end,
    llm_query = function(p)
      return p
    end,
  })
  ngx.header["Content-Type"] = "text/plain"
  ngx.say("started")
  ngx.flush(true)
  local result, err = h:wait()
  dict:set("abort_end", result and "answered" or err.kind)
end

-- GET /cancel: resty.start's handle, cancelled from a light thread while
-- wait() drives the run; says the kind wait() returned and how long it took.
function M.cancel()
  local t0 = ngx.now()
  local h = resty.start({
    context = "x",
    sandbox = { tmpdir = tmpdir },
    max_iterations = 1000,
    root_llm = function()
      return fence("import time\ntime.sleep(0.2)")
    end,
    llm_query = function(p)
      return p
    end,
  })
  ngx.thread.spawn(function()
    ngx.sleep(0.5)
    h:cancel()
  end)
  local result, err = h:wait()
  ngx.update_time()
  ngx.say(result and "answered" or err.kind, " ", math.floor((ngx.now() - t0) * 1000))
end

return M
