-- rlm.llm.transport.luasocket: the HTTP(S) transport for scripts and the
-- CLI. new(opts) returns a transport(request) for the model clients
-- (rlm.llm.openai, .anthropic, .gemini). A request blocks its caller, except
-- inside gather() (rlm.llm.transport.luasocket_loop): there every wait
-- yields to one select() over all the batch's sockets, so a batch's calls
-- run side by side.
--
-- Why LuaSocket (with LuaSec for https) and not lua-curl: Debian 12's
-- lua-curl (0.3.0) is built for Lua 5.1 and 5.2 only (`dpkg -L lua-curl`
-- lists lua/5.1/curl.so and lua/5.2/curl.so), so Lua 5.3 and 5.4 would have
-- no transport. lua-socket and lua-sec are packaged for 5.1, 5.2, 5.3 and
-- 5.4 (LuaJIT loads the 5.1 builds), speak HTTP/1.1 in process and spawn
-- nothing, so the API key never reaches a command line. A libcurl binding in
-- the C core would add HTTP/2 and proxies; nothing here needs them.
--
-- What LuaSocket and LuaSec leave to the caller, done here: one deadline
-- for the whole request (their timeouts are per read), TLS host name
-- checking (LuaSec 1.2 checks the certificate chain, not that the
-- certificate names the host), and HTTP itself (socket.http neither streams
-- a reply to its reader with its status known nor works on non-blocking
-- sockets): the sockets are non-blocking, and every wait goes through
-- luasocket_loop.wait; the reply is read by rlm.llm.transport.http1.
local socket = require("socket")
local checks = require("rlm.base.checks")
local http1 = require("rlm.llm.transport.http1")
local loop = require("rlm.llm.transport.luasocket_loop")

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

-- A non-blocking connection whose every wait ends by one deadline.
local Conn = {}
Conn.__index = Conn

local function would_block(err)
  if err == "timeout" or err == "wantread" then
    return "r"
  elseif err == "wantwrite" then
    return "w"
  end
end

function Conn:_wait(mode)
  return loop.wait(self.sock, mode, self.deadline, self.idle)
end

function Conn:connect(host, port)
  local sock, err = socket.tcp()
  if not sock then
    return nil, err
  end
  self.sock = sock
  sock:settimeout(0)
  local ok
  ok, err = sock:connect(host, port)
  if not ok and err == "timeout" then -- in progress
    ok, err = self:_wait("w")
    if not ok then
      return nil, err
    end
    err = sock:getoption("error") -- SO_ERROR: how the connect ended
    ok = err == nil
  end
  if not ok then
    return nil, err
  end
  return true
end

function Conn:handshake(host, tls)
  local ssl = require("ssl")
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
  conn:settimeout(0)
  conn:sni(host)
  while true do
    local ok
    ok, err = conn:dohandshake()
    if ok then
      break
    end
    local mode = would_block(err)
    if not mode then
      return nil, "TLS handshake with " .. host .. ": " .. tostring(err)
    end
    ok, err = self:_wait(mode)
    if not ok then
      return nil, err
    end
  end
  local cert = conn:getpeercertificate()
  if not cert or not M.certificate_names_host(cert, host) then
    return nil, "TLS: the certificate of " .. host .. " does not name it"
  end
  return true
end

function Conn:send(data)
  local i = 1
  while i <= #data do
    local last, err, partial = self.sock:send(data, i)
    if last then
      i = last + 1
    else
      i = (partial or i - 1) + 1
      local mode = would_block(err)
      if not mode then
        return nil, err
      end
      local ok, werr = self:_wait(mode == "r" and "r" or "w")
      if not ok then
        return nil, werr
      end
    end
  end
  return true
end

-- Some bytes, at most n, waiting for them: the source of http1.reader.
function Conn:receive(n)
  while true do
    local data, err, partial = self.sock:receive(n)
    if data then
      return data
    elseif partial and partial ~= "" then
      return partial
    elseif err == "closed" then
      return nil, "closed"
    end
    local mode = would_block(err)
    if not mode then
      return nil, err
    end
    local ok, werr = self:_wait(mode)
    if not ok then
      return nil, werr
    end
  end
end

function Conn:close()
  if self.sock then
    self.sock:close()
  end
end

local SCHEMA = {
  cafile = { checks.non_empty_string },
  capath = { checks.non_empty_string },
  max_body_bytes = { checks.integer(1) },
  idle = { checks.callable },
}

-- The transports new() made: the client runs their batches with gather.
local made = setmetatable({}, { __mode = "k" })

-- Whether transport is one of this module's (rlm.llm.client asks).
function M.made(transport)
  return made[transport] == true
end

M.gather = loop.gather
M.sleep = loop.sleep

-- new([opts]) -> transport. opts: cafile (a PEM bundle of trusted CAs;
-- default Debian's), capath (a hashed CA directory), max_body_bytes, idle
-- (called every luasocket_loop.IDLE_S seconds while a request waits).
-- transport(request) -> status, body, headers (lower-case names), or nil,
-- message when no HTTP reply came (refused, reset, timeout, TLS).
-- request = { url =, method = "POST", headers = {}, body =, timeout_ms =,
-- on_chunk = }: with on_chunk, a 2xx reply's body goes to it as it comes.
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

  local function exchange(conn, request)
    local scheme, host, port, target = http1.parse_url(request.url or "")
    if not scheme then
      return nil, host
    end
    local lines, err = http1.request_lines(request, scheme, host, port, target, "rlm (LuaSocket)",
      { connection = "close" })
    if not lines then
      return nil, err
    end
    local ok
    ok, err = conn:connect(host, port)
    if ok and scheme == "https" then
      ok, err = conn:handshake(host, tls)
    end
    if ok then
      ok, err = conn:send(table.concat(lines))
    end
    if not ok then
      return nil, err
    end
    local reader = http1.reader(function(n)
      return conn:receive(n)
    end)
    local status, body, headers = http1.read_reply(reader, request, max_body)
    if not status then
      return nil, body
    end
    return status, body, headers
  end

  local function transport(request)
    local conn = setmetatable({ deadline = socket.gettime() + (request.timeout_ms or 60000) / 1000,
      idle = opts.idle }, Conn)
    local status, body, headers = exchange(conn, request)
    conn:close()
    return status, body, headers
  end
  made[transport] = true
  return transport
end

return M
