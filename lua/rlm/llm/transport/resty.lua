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

local M = {}

-- The largest reply body kept; a longer one fails the request.
M.DEFAULT_MAX_BODY_BYTES = 32 * 2 ^ 20
-- The status line and headers of a reply, together.
M.MAX_HEAD_BYTES = 64 * 1024
M.DEFAULT_CONNECT_TIMEOUT_MS = 10000
M.DEFAULT_KEEPALIVE_MS = 60000
M.DEFAULT_POOL_SIZE = 16

local NAME = "rlm.llm.transport.resty"
local CHUNK = 64 * 1024

-- scheme, host, port, target of an http(s) URL; nil, message otherwise.
local function parse_url(url)
  local scheme, authority, target = url:match("^(%a+)://([^/?#]+)([^#]*)")
  scheme = scheme and scheme:lower()
  if scheme ~= "http" and scheme ~= "https" then
    return nil, "unsupported URL (http:// or https:// only): " .. url
  end
  if authority:find("@", 1, true) then
    return nil, "a URL with user information is not supported: " .. url
  end
  local host, port = authority:match("^%[([%x:.]+)%]:?(%d*)$") -- [IPv6]:port
  if not host then
    host, port = authority:match("^([^:]+):?(%d*)$")
  end
  if not host then
    return nil, "a URL whose host cannot be read: " .. url
  end
  port = tonumber(port) or (scheme == "https" and 443 or 80)
  if port < 1 or port > 65535 then
    return nil, "a URL whose port is out of range: " .. url
  end
  if target == "" then
    target = "/"
  elseif target:sub(1, 1) == "?" then
    target = "/" .. target
  end
  return scheme, host:lower(), port, target
end

local function header_line(name, value)
  value = tostring(value)
  if name:find("[%c:]") or value:find("[\r\n%z]") then
    return nil, "a header name or value holds a line break or a control character: " .. name
  end
  return name .. ": " .. value .. "\r\n"
end

-- Reads up to and without the delimiter, at most max bytes; nil, message
-- past that (a peer cannot make the worker hold more).
local function read_until(sock, delimiter, max)
  local reader = sock:receiveuntil(delimiter)
  local parts, size = {}, 0
  while true do
    local data, err = reader(4096)
    if err then
      return nil, err
    end
    if not data then
      return table.concat(parts)
    end
    size = size + #data
    if size > max then
      return nil, ("a reply line or head longer than %d bytes"):format(max)
    end
    parts[#parts + 1] = data
  end
end

-- The status and headers (lower-case names; repeated ones joined with ", ")
-- of the next reply; 1xx interim replies are skipped.
local function read_head(sock)
  while true do
    local head, err = read_until(sock, "\r\n\r\n", M.MAX_HEAD_BYTES)
    if not head then
      return nil, err
    end
    local version, status = head:match("^HTTP/(%d%.%d) (%d%d%d)")
    if not status then
      return nil, "the reply is not HTTP: " .. head:sub(1, 80)
    end
    status = tonumber(status)
    if status >= 200 or status < 100 then
      local headers = {}
      for name, value in head:gmatch("\r\n([^:\r\n]+):[ \t]*([^\r\n]*)") do
        name = name:lower()
        value = value:gsub("[ \t]+$", "")
        headers[name] = headers[name] and (headers[name] .. ", " .. value) or value
      end
      return status, headers, version
    end
  end
end

-- The body of a chunked reply, at most max bytes; trailers are read and
-- dropped.
local function read_chunked(sock, max)
  local parts, size = {}, 0
  while true do
    local line, err = read_until(sock, "\r\n", 1024)
    if not line then
      return nil, err
    end
    local n = tonumber(line:match("^%s*(%x+)") or "", 16)
    if not n then
      return nil, "a malformed chunk size: " .. line:sub(1, 40)
    end
    if n == 0 then
      -- Trailer lines, dropped, up to the empty line that ends the reply.
      for _ = 1, 100 do
        local trailer
        trailer, err = read_until(sock, "\r\n", 8192)
        if not trailer then
          return nil, err
        elseif trailer == "" then
          return table.concat(parts)
        end
      end
      return nil, "too many trailer lines"
    end
    size = size + n
    if size > max then
      return nil, ("the reply is longer than %d bytes"):format(max)
    end
    local data
    data, err = sock:receive(n)
    if not data then
      return nil, err
    end
    parts[#parts + 1] = data
    local crlf
    crlf, err = sock:receive(2)
    if crlf ~= "\r\n" then
      return nil, err or "a chunk without its CRLF"
    end
  end
end

-- The body up to the peer's close, at most max bytes.
local function read_to_close(sock, max)
  local parts, size = {}, 0
  while true do
    local data, err, partial = sock:receive(CHUNK)
    data = data or partial
    if data and #data > 0 then
      size = size + #data
      if size > max then
        return nil, ("the reply is longer than %d bytes"):format(max)
      end
      parts[#parts + 1] = data
    end
    if err == "closed" then
      return table.concat(parts)
    elseif err then
      return nil, err
    end
  end
end

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

    local body = request.body or ""
    local lines = { ("%s %s HTTP/1.1\r\n"):format(request.method or "POST", request.target) }
    local default_port = (scheme == "https" and 443) or 80
    local host_header = host:find(":", 1, true) and ("[" .. host .. "]") or host
    local fixed = {
      host = port == default_port and host_header or (host_header .. ":" .. port),
      ["user-agent"] = "rlm (OpenResty cosocket)",
      ["content-length"] = tostring(#body),
    }
    for name, value in pairs(request.headers or {}) do
      if not fixed[name:lower()] then
        local line, herr = header_line(name, value)
        if not line then
          sock:close()
          return nil, herr
        end
        lines[#lines + 1] = line
      end
    end
    for name, value in pairs(fixed) do
      lines[#lines + 1] = name .. ": " .. value .. "\r\n"
    end
    lines[#lines + 1] = "\r\n"
    lines[#lines + 1] = body
    local sent
    sent, err = sock:send(lines)
    if not sent then
      sock:close()
      return nil, "sending the request: " .. tostring(err), reused
    end

    local status, headers, version = read_head(sock)
    if not status then
      sock:close()
      err = headers
      return nil, "reading the reply: " .. tostring(err), reused and err == "closed"
    end
    local reply
    local length = headers["content-length"]
    local chunked = (headers["transfer-encoding"] or ""):lower():find("chunked", 1, true)
    local delimited = true
    if status == 204 or status == 304 or request.method == "HEAD" then
      reply = ""
    elseif chunked then
      reply, err = read_chunked(sock, max_body)
    elseif length then
      local n = tonumber(length:match("^%s*(%d+)%s*$") or "")
      if not n then
        sock:close()
        return nil, "a malformed Content-Length: " .. length:sub(1, 40)
      elseif n > max_body then
        sock:close()
        return nil, ("the reply is %d bytes, more than %d"):format(n, max_body)
      end
      reply = ""
      if n > 0 then
        reply, err = sock:receive(n)
        if not reply then
          err = "reading the reply body: " .. tostring(err)
        end
      end
    else
      delimited = false
      reply, err = read_to_close(sock, max_body)
    end
    if not reply then
      sock:close()
      return nil, err
    end
    local close = (headers.connection or ""):lower():find("close", 1, true) or version == "1.0"
    if delimited and not close then
      sock:setkeepalive(keepalive_ms, pool_size)
    else
      sock:close()
    end
    return status, reply, headers
  end

  return function(request)
    local scheme, host, port, target = parse_url(request.url or "")
    if not scheme then
      return nil, host
    end
    local deadline = ngx.now() + (request.timeout_ms or 60000) / 1000
    local req = { method = request.method, headers = request.headers, body = request.body,
      target = target }
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
