-- An OpenResty handler over rlm.adapters.resty: POST /ask?q=QUESTION with a
-- document as the body; the answer comes back as JSON. The worker keeps
-- serving its other requests while the session runs.
--
-- The models are an OpenAI-compatible endpoint reached through an internal
-- proxy_pass location (nginx.conf's /_rlm_llm) with ngx.location.capture,
-- so no HTTP library is needed and every model call yields to nginx.
-- luacheck: globals ngx
local cjson = require("cjson.safe")
local resty = require("rlm.adapters.resty")

local M = {
  root_model = os.getenv("RLM_ROOT_MODEL") or "gpt-4o",
  sub_model = os.getenv("RLM_SUB_MODEL") or "gpt-4o-mini",
  llm_location = "/_rlm_llm",
  tmpdir = os.getenv("RLM_TMPDIR"), -- nil: $TMPDIR or /tmp
}

-- One chat completion: text, usage | nil, message.
local function chat(model, messages)
  local res = ngx.location.capture(M.llm_location, {
    method = ngx.HTTP_POST,
    body = cjson.encode({ model = model, messages = messages }),
  })
  local reply = res.status == 200 and cjson.decode(res.body)
  local message = type(reply) == "table" and type(reply.choices) == "table" and reply.choices[1]
    and reply.choices[1].message
  if type(message) ~= "table" or type(message.content) ~= "string" then
    return nil, ("the model endpoint answered %d: %s"):format(res.status, tostring(res.body):sub(1, 300))
  end
  local usage = type(reply.usage) == "table" and {
    input_tokens = tonumber(reply.usage.prompt_tokens) or 0,
    output_tokens = tonumber(reply.usage.completion_tokens) or 0,
  } or nil
  return message.content, usage
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
  local result, err = resty.run({
    context = request_body(),
    query = ngx.var.arg_q and ngx.unescape_uri(ngx.var.arg_q) or nil,
    tmpdir = M.tmpdir,
    root_llm = function(messages)
      return chat(M.root_model, messages)
    end,
    llm_query = function(prompt)
      return chat(M.sub_model, { { role = "user", content = prompt } })
    end,
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
