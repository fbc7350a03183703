-- rlm.llm.transport.resty: rlm.llm.openai's transport inside nginx's Lua
-- module (OpenResty). Each request is an ngx.location.capture subrequest to
-- an internal location of yours that proxy_passes to the model endpoint, so
-- nginx's own HTTP client does the work (TLS, keep-alive, timeouts, DNS)
-- and the request's light thread yields meanwhile instead of blocking the
-- worker.
--
-- Why a subrequest and not a cosocket client: the Lua module's cosockets
-- need an HTTP library on top (lua-resty-http), which Debian does not
-- package, and a hand-written one is not what we want to ship; a proxy
-- location is a few lines of nginx.conf, keeps the API key in nginx's
-- configuration (its environment, with `env`), and works in every phase
-- that allows subrequests (rewrite, access, content). The URL, the key and
-- the timeouts are the location's: see examples/openresty/nginx.conf.
-- luacheck: globals ngx
local M = {}

M.DEFAULT_LOCATION = "/_rlm_llm"

-- new([opts]) -> transport(request): status, body, headers | nil, message.
-- opts.location: the internal location (default "/_rlm_llm").
-- The request's URL and headers are not used: the location sets them.
function M.new(opts)
  opts = opts or {}
  local location = opts.location or M.DEFAULT_LOCATION
  return function(request)
    local res = ngx.location.capture(location, { method = ngx.HTTP_POST, body = request.body })
    if not res or not res.status then
      return nil, "the subrequest to " .. location .. " gave no reply"
    end
    if res.truncated then
      return nil, ("the reply through %s was cut short (status %d)"):format(location, res.status)
    end
    local headers = {}
    for name, value in pairs(res.header or {}) do
      headers[name:lower()] = type(value) == "table" and value[1] or value
    end
    return res.status, res.body or "", headers
  end
end

-- A sleep for rlm.llm.openai's retries that yields to nginx.
function M.sleep(seconds)
  ngx.sleep(seconds)
end

return M
