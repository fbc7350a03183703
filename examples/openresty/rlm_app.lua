-- An OpenResty handler over rlm.adapters.resty: POST /ask?q=QUESTION with a
-- document as the body; the answer comes back as JSON. The worker keeps
-- serving its other requests while the session runs.
--
-- The models are an OpenAI-compatible endpoint ($RLM_BASE_URL, default
-- OpenAI's; the key from $RLM_API_KEY), through rlm.llm.openai over
-- rlm.llm.transport.resty: cosockets, so every model call, and every wait
-- before a retry, yields to nginx, in a request handler as in a timer.
-- luacheck: globals ngx
local cjson = require("cjson.safe")
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
