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
-- luacheck: globals ngx
local cjson = require("cjson.safe")
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
}

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

function M.ask()
  if ngx.req.get_method() ~= "POST" then
    return send(405, { error = "POST the document, with ?q=the question" })
  end
  local models = client()
  local result, err = resty.run({
    context = request_body(),
    query = ngx.var.arg_q and ngx.unescape_uri(ngx.var.arg_q) or nil,
    sandbox = { tmpdir = M.tmpdir },
    root_llm = models.root_llm,
    llm_query = models.llm_query,
    tools = M.tools,
    max_iterations = 20,
    step_timeout_ms = 120000,
  })
  if not result then
    return send(502, { error = err.kind, message = err.message })
  end
  send(200, { answer = result.answer, iterations = result.iterations, sub_calls = result.sub_calls,
    tokens = result.tokens })
end

return M
