-- An OpenResty handler over rlm.adapters.resty: POST /ask?q=QUESTION with a
-- document as the body; the answer comes back as JSON. The worker keeps
-- serving its other requests while the session runs.
--
-- The models are an OpenAI-compatible endpoint ($RLM_BASE_URL, default
-- OpenAI's; the key from $RLM_API_KEY), through rlm.llm.openai over
-- rlm.llm.transport.resty: cosockets, so every model call, and every wait
-- before a retry, yields to nginx, in a request handler as in a timer.
--
-- The model also gets a host tool, kv_get(key): a lookup in the shared dict
-- `rlm_kv` (lua_shared_dict in nginx.conf), which PUT /kv?key=K fills with
-- the body. The sandbox has no network; the cache reaches it only this way.
-- luacheck: globals ngx
local cjson = require("cjson.safe")
local rlm = require("rlm")
local resty = require("rlm.adapters.resty")
local openai = require("rlm.llm.openai")
local transport = require("rlm.llm.transport.resty")

local M = {
  base_url = os.getenv("RLM_BASE_URL") or "https://api.openai.com/v1",
  root_model = os.getenv("RLM_ROOT_MODEL") or "gpt-4o",
  sub_model = os.getenv("RLM_SUB_MODEL") or "gpt-4o-mini",
  tmpdir = os.getenv("RLM_TMPDIR"), -- nil: $TMPDIR or /tmp
}

-- A client per request, so that each answer reports its own usage. The
-- transport's connections are pooled by nginx across requests.
local function client()
  return openai.new({
    base_url = M.base_url,
    model = M.root_model,
    sub_model = M.sub_model,
    api_key_env = "RLM_API_KEY",
    transport = transport.new(),
    sleep = transport.sleep,
  })
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
    tmpdir = M.tmpdir,
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
