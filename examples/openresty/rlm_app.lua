-- An OpenResty handler over rlm.adapters.resty: POST /ask?q=QUESTION with a
-- document as the body; the answer comes back as JSON. The worker keeps
-- serving its other requests while the session runs.
--
-- The models: the settings every host reads (docs/llm.md, "Settings"):
-- $RLM_MODEL (required), $RLM_SUB_MODEL, $RLM_BASE_URL, $RLM_PROVIDER, the
-- key in $OPENAI_API_KEY (or $ANTHROPIC_API_KEY, $GEMINI_API_KEY, or the
-- variable $RLM_API_KEY_ENV names), read once when nginx loads this file
-- (init_by_lua: a missing one stops nginx with one line), the key at each
-- call; through rlm.llm.<provider> over rlm.llm.transport.resty: cosockets,
-- so every model call, and every wait before a retry, yields to nginx, in a
-- request handler as in a timer.
--
-- The model also gets a host tool, kv_get(key): a lookup in the shared dict
-- `rlm_kv` (lua_shared_dict in nginx.conf), which PUT /kv?key=K fills with
-- the body. The sandbox has no network; the cache reaches it only this way.
--
-- The durable mode, with $RLM_REDIS set ("unix:/run/redis/redis.sock" or
-- "HOST:PORT"): each run keeps a journal in that Redis (rlm.journal.redis
-- over lua-resty-redis; docs/durability.md). The reply's headers go out
-- as the run starts, X-Rlm-Session naming its id; when the worker running
-- it dies (a crash, a kill), the client asks again, the same request with
-- &session=ID, and whichever worker takes it goes on from where the run
-- was: no recorded model or tool call is made twice. The lease of a dead
-- worker of this machine is let go at once (rlm.journal.owner: its pid,
-- boot id and start time tell it is gone); while a live worker, or one of
-- another machine, holds the run, that answers 409 with Retry-After.
-- luacheck: globals ngx
local cjson = require("cjson.safe")
local journal = require("rlm.journal")
local owner = require("rlm.journal.owner")
local rlm = require("rlm")
local resty = require("rlm.adapters.resty")
local settings = require("rlm.llm.settings")
local transport = require("rlm.llm.transport.resty")

local model_settings, missing = settings.read()
if not model_settings then
  error("examples/openresty: " .. missing, 0)
end

local M = {
  models = model_settings,
  tmpdir = os.getenv("RLM_TMPDIR"), -- nil: $TMPDIR or /tmp
  redis = os.getenv("RLM_REDIS"), -- nil: no journal
  journal_ttl = 3600, -- seconds a run's journal waits for its resume
}

-- lua-resty-redis: OpenResty ships it as resty.redis, Debian's
-- lua-nginx-redis as nginx.redis.
local redis_module
if M.redis then
  local ok
  ok, redis_module = pcall(require, "resty.redis")
  if not ok then
    ok, redis_module = pcall(require, "nginx.redis")
  end
  if not ok then
    error("examples/openresty: RLM_REDIS is set but lua-resty-redis is not on lua_package_path", 0)
  end
end

-- A Redis client for rlm.journal.redis whose every call takes a connection
-- of nginx's pool and gives it back: the session may call the store from
-- several light threads at once, and a cosocket serves one at a time.
local function pooled_redis(where)
  local host, port = where:match("^(.+):(%d+)$")
  if where:find("^unix:") then
    host, port = where, nil
  end
  local client = {}
  for _, command in ipairs({ "get", "set", "del", "eval" }) do
    client[command] = function(_, ...)
      local red = redis_module:new()
      red:set_timeout(2000)
      local ok, err = red:connect(host, port)
      if not ok then
        return nil, "redis at " .. where .. ": " .. tostring(err)
      end
      local res
      res, err = red[command](red, ...)
      if res == nil then
        red:close()
        return nil, err
      end
      red:set_keepalive(10000, 32)
      return res
    end
  end
  return client
end

-- A client per request, so that each answer reports its own usage. The
-- transport's connections are pooled by nginx across requests.
local function client()
  return settings.client(M.models, { transport = transport.new(), sleep = transport.sleep })
end

local function request_body()
  ngx.req.read_body()
  local body = ngx.req.get_body_data()
  if body then
    return body
  end
  local path = ngx.req.get_body_file() -- a large body was buffered to a file
  local f = path and io.open(path, "rb")
  if not f then
    return ""
  end
  body = f:read("*a")
  f:close()
  return body
end

local function send(status, t)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  ngx.say(cjson.encode(t))
end

-- The host tools of a session: Lua functions the REPL's code calls by name.
M.tools = {
  kv_get = {
    doc = "kv_get(key): the value stored under key in the server's cache (a str), or None",
    call = function(key, kw)
      key = key or kw and kw.key
      if type(key) ~= "string" then
        error("kv_get(key) takes a str key", 0)
      end
      local value = ngx.shared.rlm_kv:get(key)
      if value == nil then
        return rlm.null
      end
      return value
    end,
  },
}

-- PUT /kv?key=K with the value as the body: what kv_get(K) then returns.
function M.kv_put()
  local key = ngx.var.arg_key and ngx.unescape_uri(ngx.var.arg_key)
  if ngx.req.get_method() ~= "PUT" or not key or key == "" then
    return send(400, { error = "PUT the value, with ?key=the key" })
  end
  local ok, err = ngx.shared.rlm_kv:set(key, request_body())
  if not ok then
    return send(507, { error = err })
  end
  send(200, { stored = key })
end

-- The reply of a run: the answer and its counts, or the error.
local function outcome(result, err)
  if not result then
    return { error = err.kind, message = err.message }
  end
  return { answer = result.answer, iterations = result.iterations, sub_calls = result.sub_calls,
    tokens = result.tokens }
end

-- POST /ask in the durable mode: a new run, or with ?session=ID the run of
-- that journal resumed. The headers go out once the run holds its lease
-- (X-Rlm-Session, X-Rlm-Worker), so the status is then 200 and a failure
-- is said in the body; before that, a run another worker still holds is
-- 409 (Retry-After: when its lease ends), another failure to resume 502.
local function ask_durable(opts)
  local worker = ngx.worker.pid()
  -- The lease's owner: this worker, and the request (a worker runs many),
  -- named so that another worker of this machine can tell it is gone.
  local store = journal.redis(pooled_redis(M.redis), { ttl = M.journal_ttl })
  opts.journal = { store = store, owner = owner.name("nginx", ngx.var.request_id)
    or ("nginx-%s-%d-%s"):format(ngx.var.hostname, worker, ngx.var.request_id) }
  local id = ngx.var.arg_session and ngx.unescape_uri(ngx.var.arg_session)
  local h, err
  if id then
    -- a worker of this machine that died (killed, crashed) renews its
    -- lease no more, yet it would live its ttl out: let go of it at once
    pcall(owner.release_if_gone, store, id)
    h, err = resty.resume(id, opts)
  else
    h = resty.start(opts)
  end
  if not h then
    if err.kind == "lease_held" then
      -- when the holder's lease ends (another machine's dead worker's lasts
      -- its ttl, 30 s)
      ngx.header["Retry-After"] = err.expires and math.max(1, err.expires - ngx.time()) or 2
      return send(409, { error = err.kind, message = tostring(err.message or err), owner = err.owner, session = id })
    end
    return send(502, { error = err.kind, message = err.message, session = id })
  end
  id = h.session:journal_id()
  ngx.status = 200
  ngx.header["Content-Type"] = "application/json"
  ngx.header["X-Rlm-Session"] = id
  ngx.header["X-Rlm-Worker"] = worker
  ngx.send_headers()
  ngx.flush(true)
  local reply = outcome(h:wait())
  reply.session = id
  ngx.say(cjson.encode(reply))
end

function M.ask()
  if ngx.req.get_method() ~= "POST" then
    return send(405, { error = "POST the document, with ?q=the question" })
  end
  local models = client()
  local opts = {
    context = request_body(),
    query = ngx.var.arg_q and ngx.unescape_uri(ngx.var.arg_q) or nil,
    sandbox = { tmpdir = M.tmpdir },
    root_llm = models.root_llm,
    llm_query = models.llm_query,
    tools = M.tools,
    max_iterations = 20,
    step_timeout_ms = 120000,
  }
  if M.redis then
    return ask_durable(opts)
  end
  local result, err = resty.run(opts)
  send(result and 200 or 502, outcome(result, err))
end

return M
