-- rlm.llm.transport.resty: rlm.llm.openai's transport inside nginx's Lua
-- module (OpenResty), over cosockets (ngx.socket.tcp), as lua-resty-http
-- does: HTTP/1.1, TLS through sslhandshake with the certificate chain and
-- the host name verified, a keep-alive pool per host, and timeouts. Each
-- socket operation yields the light thread it runs in to nginx, so the
-- worker keeps serving; it works wherever cosockets do: rewrite, access and
-- content handlers, and ngx.timer callbacks (the callback form of
-- rlm.adapters.resty runs the session in one).
--
-- nginx configuration it relies on (see examples/openresty/nginx.conf):
--   lua_ssl_trusted_certificate  the CA bundle TLS peers are checked against
--                                (without it every https request fails)
--   lua_ssl_verify_depth         the longest chain accepted
--   resolver                     for host names: nginx does not read
--                                /etc/hosts or /etc/resolv.conf (or pin a
--                                name with the `resolve` option)
-- luacheck: globals ngx
local checks = require("rlm.base.checks")
local http1 = require("rlm.llm.transport.http1")

local M = {}

-- The largest reply body kept; a longer one fails the request.
M.DEFAULT_MAX_BODY_BYTES = 32 * 2 ^ 20
-- The status line and headers of a reply, together.
M.MAX_HEAD_BYTES = http1.MAX_HEAD_BYTES
M.DEFAULT_CONNECT_TIMEOUT_MS = 10000
M.DEFAULT_KEEPALIVE_MS = 60000
M.DEFAULT_POOL_SIZE = 16

local NAME = "rlm.llm.transport.resty"

local function host_map(v)
  if type(v) ~= "table" then
    return false, "a table of host names to addresses"
  end
  for host, address in pairs(v) do
    if type(host) ~= "string" or type(address) ~= "string" then
      return false, "a table of host names to addresses (strings)"
    end
  end
  return true
end

local SCHEMA = {
  max_body_bytes = { checks.integer(1) },
  connect_timeout_ms = { checks.milliseconds },
  keepalive_ms = { checks.milliseconds },
  pool_size = { checks.integer(1) },
  resolve = { host_map },
}

local function check(opts)
  return checks.options(NAME .. ".new", opts, SCHEMA, nil, 3)
end

-- new([opts]) -> transport(request): status, body, headers | nil, message.
-- request = { url =, method = "POST", headers = {}, body =, timeout_ms = }.
-- opts:
--   max_body_bytes      the largest reply body kept (default 32 MiB)
--   connect_timeout_ms  for the TCP connect and the TLS handshake (10000)
--   keepalive_ms        how long an idle connection stays pooled (60000)
--   pool_size           idle connections kept per host and port (16)
--   resolve             { ["host"] = "address" }: connect to that address
--                       for that host (as curl's --resolve); TLS still
--                       checks the certificate against the host name
function M.new(opts)
  opts = check(opts)
  local max_body = opts.max_body_bytes or M.DEFAULT_MAX_BODY_BYTES
  local connect_ms = opts.connect_timeout_ms or M.DEFAULT_CONNECT_TIMEOUT_MS
  local keepalive_ms = opts.keepalive_ms or M.DEFAULT_KEEPALIVE_MS
  local pool_size = opts.pool_size or M.DEFAULT_POOL_SIZE
  local resolve = {}
  for host, address in pairs(opts.resolve or {}) do
    resolve[host:lower()] = address
  end

  -- One attempt on one connection: status, body, headers, or nil, message,
  -- retry (true when a pooled connection turned out closed before any
  -- reply byte: the server never saw the request).
  local function exchange(scheme, host, port, request, deadline)
    local function left_ms()
      ngx.update_time()
      return math.floor((deadline - ngx.now()) * 1000)
    end
    local sock = ngx.socket.tcp()
    local ms = left_ms()
    if ms <= 0 then
      return nil, "timeout"
    end
    sock:settimeouts(math.min(connect_ms, ms), ms, ms)
    -- One pool per scheme, host and port: a pooled TLS connection was
    -- verified for this host name.
    local pool = ("rlm:%s:%s:%d"):format(scheme, host, port)
    local address = resolve[host] or host
    local ok, err = sock:connect(address, port, { pool = pool, pool_size = pool_size })
    if not ok then
      return nil, ("connecting to %s:%d: %s"):format(host, port, tostring(err))
    end
    local reused = (sock:getreusedtimes() or 0) > 0
    if scheme == "https" and not reused then
      -- verify = true: the chain against lua_ssl_trusted_certificate and,
      -- since a server name is given, the certificate against the host name.
      -- Under pcall: lua-resty-core 0.1.25 (Debian 12) asserts instead of
      -- returning an error when a handshake that completed at once then
      -- fails the host name check. Either way the connection is refused.
      local done
      done, ok, err = pcall(sock.sslhandshake, sock, nil, host, true)
      if not (done and ok) then
        sock:close()
        return nil, ("TLS handshake with %s: %s"):format(host, done and tostring(err)
          or ("failed (%s; nginx's error log names the cause)"):format(tostring(ok):match("[^\n]*")))
      end
    end
    ms = left_ms()
    if ms <= 0 then
      sock:close()
      return nil, "timeout"
    end
    sock:settimeouts(math.min(connect_ms, ms), ms, ms)

    local lines, herr = http1.request_lines(request, scheme, host, port, request.target,
      "rlm (OpenResty cosocket)")
    if not lines then
      sock:close()
      return nil, herr
    end
    local sent
    sent, err = sock:send(lines)
    if not sent then
      sock:close()
      return nil, "sending the request: " .. tostring(err), reused
    end

    -- The reply, read by rlm.llm.transport.http1 from what each
    -- receiveany brings (a streamed body goes on as it comes).
    local reader = http1.reader(function(n)
      return sock:receiveany(n)
    end)
    local status, reply, headers, keep = http1.read_reply(reader, request, max_body)
    if not status then
      sock:close()
      err = reply
      return nil, "reading the reply: " .. tostring(err), reused and err == "closed"
    end
    if keep then
      sock:setkeepalive(keepalive_ms, pool_size)
    else
      sock:close()
    end
    return status, reply, headers
  end

  return function(request)
    local scheme, host, port, target = http1.parse_url(request.url or "")
    if not scheme then
      return nil, host
    end
    local deadline = ngx.now() + (request.timeout_ms or 60000) / 1000
    local req = { method = request.method, headers = request.headers, body = request.body,
      target = target, on_chunk = request.on_chunk }
    local status, body, headers = exchange(scheme, host, port, req, deadline)
    if not status and headers == true then
      -- The pooled connection was stale: once more on a new one.
      status, body, headers = exchange(scheme, host, port, req, deadline)
    end
    if not status then
      return nil, body
    end
    return status, body, headers
  end
end

-- A sleep for rlm.llm.openai's retries that yields to nginx.
function M.sleep(seconds)
  ngx.sleep(seconds)
end

return M
