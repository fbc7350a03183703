-- rlm.llm.transport.luasocket: the blocking HTTP(S) transport for scripts
-- and the CLI. new(opts) returns a transport(request) for rlm.llm.openai.
--
-- Why LuaSocket (with LuaSec for https) and not lua-curl: Debian 12's
-- lua-curl (0.3.0) is built for Lua 5.1 and 5.2 only (`dpkg -L lua-curl`
-- lists lua/5.1/curl.so and lua/5.2/curl.so), so Lua 5.3 and 5.4 would have
-- no transport. lua-socket and lua-sec are packaged for 5.1, 5.2, 5.3 and
-- 5.4 (LuaJIT loads the 5.1 builds), speak HTTP/1.1 in process and spawn
-- nothing, so the API key never reaches a command line. A libcurl binding in
-- the C core would add HTTP/2 and proxies; nothing here needs them.
--
-- Two things LuaSocket and LuaSec leave to the caller, done here: one
-- deadline for the whole request (their timeouts are per read and fixed per
-- module), and TLS host name checking (LuaSec 1.2 checks the certificate
-- chain, not that the certificate names the host).
local socket = require("socket")
local http = require("socket.http")
local ltn12 = require("ltn12")
local checks = require("rlm.base.checks")

local M = {}

-- Debian's CA bundle (ca-certificates).
M.DEFAULT_CAFILE = "/etc/ssl/certs/ca-certificates.crt"
-- The largest reply body kept; a longer one fails the request.
M.DEFAULT_MAX_BODY_BYTES = 32 * 2 ^ 20

local function is_ip_literal(host)
  return host:match("^%d+%.%d+%.%d+%.%d+$") ~= nil or host:find(":", 1, true) ~= nil
end

-- One certificate name against the host: case-insensitive, and a wildcard
-- only as the whole leftmost label, standing for exactly one label.
local function name_matches(pattern, host)
  pattern, host = pattern:lower(), host:lower()
  if pattern == host then
    return true
  end
  local rest = pattern:match("^%*(%..+%..+)$") -- "*.b.c", never "*.c"
  if not rest then
    return false
  end
  local label, tail = host:match("^([^.]+)(%..+)$")
  return label ~= nil and tail == rest
end

-- Whether the peer's certificate names host: its subjectAltName entries
-- (DNS names, or IP addresses for an IP literal); the subject's common name
-- only when the certificate has no DNS names at all.
function M.certificate_names_host(cert, host)
  local san = (cert:extensions() or {})["2.5.29.17"] or {}
  if is_ip_literal(host) then
    for _, ip in ipairs(san.iPAddress or {}) do
      if ip:lower() == host:lower() then
        return true
      end
    end
    return false
  end
  local dns = san.dNSName or {}
  for _, name in ipairs(dns) do
    if name_matches(name, host) then
      return true
    end
  end
  if #dns == 0 then
    for _, entry in ipairs(cert:subject() or {}) do
      if entry.name == "commonName" and name_matches(entry.value, host) then
        return true
      end
    end
  end
  return false
end

-- A connection for socket.http whose every operation gets the time left
-- until one deadline, and that does TLS itself when tls is set.
local Conn = {}
Conn.__index = Conn

local function new_conn(deadline, tls)
  local sock, err = socket.tcp()
  if not sock then
    return nil, err
  end
  return setmetatable({ sock = sock, deadline = deadline, tls = tls }, Conn)
end

function Conn:_arm()
  local left = self.deadline - socket.gettime()
  if left <= 0 then
    return false
  end
  self.sock:settimeout(left)
  return true
end

-- socket.http sets its module-wide timeout; the deadline rules instead.
function Conn.settimeout()
  return 1
end

function Conn:_handshake(host)
  local ssl = require("ssl")
  local tls = self.tls
  if not tls.context then
    local context, err = ssl.newcontext(tls.params) -- loads the CA bundle once
    if not context then
      return nil, "TLS: " .. tostring(err)
    end
    tls.context = context
  end
  local conn, err = ssl.wrap(self.sock, tls.context)
  if not conn then
    return nil, "TLS: " .. tostring(err)
  end
  self.sock = conn
  conn:sni(host)
  if not self:_arm() then
    return nil, "timeout"
  end
  local ok
  ok, err = conn:dohandshake()
  if not ok then
    return nil, "TLS handshake with " .. host .. ": " .. tostring(err)
  end
  local cert = conn:getpeercertificate()
  if not cert or not M.certificate_names_host(cert, host) then
    return nil, "TLS: the certificate of " .. host .. " does not name it"
  end
  return 1
end

function Conn:connect(host, port)
  if not self:_arm() then
    return nil, "timeout"
  end
  local ok, err = self.sock:connect(host, port)
  if not ok then
    return nil, err
  end
  if self.tls then
    return self:_handshake(host)
  end
  return 1
end

function Conn:send(...)
  if not self:_arm() then
    return nil, "timeout", 0
  end
  return self.sock:send(...)
end

function Conn:receive(...)
  if not self:_arm() then
    return nil, "timeout", ""
  end
  return self.sock:receive(...)
end

function Conn:close()
  return self.sock:close()
end

function Conn:getfd()
  return self.sock:getfd()
end

function Conn:dirty()
  return self.sock:dirty()
end

-- A sink that keeps at most max bytes.
local function bounded_sink(chunks, max)
  local size = 0
  return function(chunk)
    if chunk then
      size = size + #chunk
      if size > max then
        return nil, ("the reply is longer than %d bytes"):format(max)
      end
      chunks[#chunks + 1] = chunk
    end
    return 1
  end
end

local SCHEMA = {
  cafile = { checks.non_empty_string },
  capath = { checks.non_empty_string },
  max_body_bytes = { checks.integer(1) },
}

-- new([opts]) -> transport. opts: cafile (a PEM bundle of trusted CAs;
-- default Debian's), capath (a hashed CA directory), max_body_bytes.
-- transport(request) -> status, body, headers (lower-case names), or nil,
-- message when no HTTP reply came (refused, reset, timeout, TLS).
-- request = { url =, method = "POST", headers = {}, body =, timeout_ms = }.
function M.new(opts)
  opts = checks.options("rlm.llm.transport.luasocket.new", opts, SCHEMA)
  local max_body = opts.max_body_bytes or M.DEFAULT_MAX_BODY_BYTES
  local tls = { params = {
    mode = "client",
    protocol = "any",
    options = { "all", "no_sslv2", "no_sslv3", "no_tlsv1", "no_tlsv1_1" },
    verify = { "peer", "fail_if_no_peer_cert" },
    cafile = opts.cafile or (not opts.capath and M.DEFAULT_CAFILE or nil),
    capath = opts.capath,
  } }

  return function(request)
    local scheme = request.url:match("^(%a+)://")
    scheme = scheme and scheme:lower()
    if scheme ~= "http" and scheme ~= "https" then
      return nil, "unsupported URL (http:// or https:// only): " .. request.url
    end
    local deadline = socket.gettime() + (request.timeout_ms or 60000) / 1000
    local headers = { ["user-agent"] = "rlm (LuaSocket)" }
    for k, v in pairs(request.headers or {}) do
      headers[k:lower()] = v
    end
    local body = request.body
    if body then
      headers["content-length"] = tostring(#body)
    end
    local chunks = {}
    local ok, status, reply_headers = http.request({
      url = request.url,
      method = request.method or (body and "POST" or "GET"),
      headers = headers,
      source = body and ltn12.source.string(body) or nil,
      sink = bounded_sink(chunks, max_body),
      redirect = false,
      create = function()
        return new_conn(deadline, scheme == "https" and tls or nil)
      end,
    })
    if not ok then
      return nil, tostring(status)
    end
    return status, table.concat(chunks), reply_headers or {}
  end
end

return M
