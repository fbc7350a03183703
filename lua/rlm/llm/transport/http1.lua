-- rlm.llm.transport.http1: the HTTP/1.1 the transports share: URLs, the
-- request's head, and a reply read from any source of bytes (its head, then
-- a body with Content-Length, chunked, or up to the close), either whole
-- (bounded) or handed out in pieces as it comes (request.on_chunk, for a
-- 2xx reply: a streamed answer). Plain Lua: the sockets are the
-- transport's.
local M = {}

-- The status line and headers of a reply, together.
M.MAX_HEAD_BYTES = 64 * 1024
-- What one read asks for.
M.CHUNK = 64 * 1024

-- scheme, host, port, target of an http(s) URL; nil, message otherwise.
function M.parse_url(url)
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

-- The request's head and body as one list for send: method, target,
-- Host, User-Agent, Content-Length and `fixed` (name -> value, lower-case:
-- they win over the caller's), then request.headers. nil, message for a
-- header that would break the head.
function M.request_lines(request, scheme, host, port, target, agent, fixed)
  local body = request.body or ""
  local lines = { ("%s %s HTTP/1.1\r\n"):format(request.method or "POST", target) }
  local default_port = (scheme == "https" and 443) or 80
  local host_header = host:find(":", 1, true) and ("[" .. host .. "]") or host
  local own = {
    host = port == default_port and host_header or (host_header .. ":" .. port),
    ["user-agent"] = agent,
    ["content-length"] = tostring(#body),
  }
  for name, value in pairs(fixed or {}) do
    own[name] = value
  end
  for name, value in pairs(request.headers or {}) do
    if not own[name:lower()] then
      local line, err = header_line(name, value)
      if not line then
        return nil, err
      end
      lines[#lines + 1] = line
    end
  end
  for name, value in pairs(own) do
    lines[#lines + 1] = name .. ": " .. value .. "\r\n"
  end
  lines[#lines + 1] = "\r\n"
  lines[#lines + 1] = body
  return lines
end

-- status, headers (lower-case names; repeated ones joined with ", "),
-- version of a head (without its blank line), or nil, message.
function M.parse_head(head)
  local version, status = head:match("^HTTP/(%d[%.%d]*) (%d%d%d)") -- "HTTP/2 200" from curl -i too
  if not status then
    return nil, "the reply is not HTTP: " .. head:sub(1, 80)
  end
  local headers = {}
  for name, value in head:gmatch("\r\n([^:\r\n]+):[ \t]*([^\r\n]*)") do
    name = name:lower()
    value = value:gsub("[ \t]+$", "")
    headers[name] = headers[name] and (headers[name] .. ", " .. value) or value
  end
  return tonumber(status), headers, version
end

-- A reader over source(n): some bytes (at most n; waiting for them), nil,
-- "closed" at the end, or nil, message.
local Reader = {}
Reader.__index = Reader

function M.reader(source)
  return setmetatable({ source = source, data = "", from = 1, got = 0 }, Reader)
end

-- More bytes into the buffer: true, or nil, message; "closed" alone only
-- when the peer closed before sending a byte (a pooled connection it had
-- dropped: the request may go again on a new one).
function Reader:_fill()
  local s, err = self.source(M.CHUNK)
  if not s then
    if err == "closed" and self.got > 0 then
      return nil, "the connection closed mid-reply"
    end
    return nil, err
  end
  self.got = self.got + #s
  self.data = self.data:sub(self.from) .. s
  self.from = 1
  return true
end

-- Up to and without the delimiter, at most max bytes before it.
function Reader:until_(delimiter, max)
  while true do
    local i = self.data:find(delimiter, self.from, true)
    if i and i - self.from > max then
      return nil, ("a reply line or head longer than %d bytes"):format(max)
    elseif i then
      local s = self.data:sub(self.from, i - 1)
      self.from = i + #delimiter
      return s
    end
    if #self.data - self.from + 1 > max + #delimiter then
      return nil, ("a reply line or head longer than %d bytes"):format(max)
    end
    local ok, err = self:_fill()
    if not ok then
      return nil, err
    end
  end
end

-- n bytes, handed to emit(piece) as they come.
function Reader:take(n, emit)
  while n > 0 do
    if self.from > #self.data then
      local ok, err = self:_fill()
      if not ok then
        return nil, err
      end
    end
    local piece = self.data:sub(self.from, self.from + n - 1)
    self.from = self.from + #piece
    n = n - #piece
    local ok, err = emit(piece)
    if not ok then
      return nil, err
    end
  end
  return true
end

-- Everything up to the peer's close, handed to emit.
function Reader:to_close(emit)
  while true do
    if self.from <= #self.data then
      local piece = self.data:sub(self.from)
      self.data, self.from = "", 1
      local ok, err = emit(piece)
      if not ok then
        return nil, err
      end
    end
    local ok, err = self:_fill()
    if not ok then
      if err == "closed" or err == "the connection closed mid-reply" then
        return true
      end
      return nil, err
    end
  end
end

-- A chunked body, each chunk's data to emit; trailers read and dropped.
function Reader:chunked(emit)
  while true do
    local line, err = self:until_("\r\n", 1024)
    if not line then
      return nil, err
    end
    local n = tonumber(line:match("^%s*(%x+)") or "", 16)
    if not n then
      return nil, "a malformed chunk size: " .. line:sub(1, 40)
    end
    if n == 0 then
      for _ = 1, 100 do
        local trailer
        trailer, err = self:until_("\r\n", 8192)
        if not trailer then
          return nil, err
        elseif trailer == "" then
          return true
        end
      end
      return nil, "too many trailer lines"
    end
    local ok
    ok, err = self:take(n, emit)
    if not ok then
      return nil, err
    end
    local crlf
    crlf, err = self:until_("\r\n", 0)
    if crlf ~= "" then
      return nil, err or "a chunk without its CRLF"
    end
  end
end

-- A sink that keeps at most max bytes.
local function collector(max)
  local parts, size = {}, 0
  return function(piece)
    size = size + #piece
    if size > max then
      return nil, ("the reply is longer than %d bytes"):format(max)
    end
    parts[#parts + 1] = piece
    return true
  end, parts
end

-- Reads one reply from reader: status, body, headers, keep (whether the
-- connection may carry another request), or nil, message. A 2xx reply
-- to a request with on_chunk goes to on_chunk(piece) as it comes (its
-- body is then ""), and a false or nil return of it ends the read with its
-- message; any other body is kept whole, up to max_body bytes.
function M.read_reply(reader, request, max_body)
  local status, headers, version
  repeat -- 1xx interim replies are skipped
    local head, err = reader:until_("\r\n\r\n", M.MAX_HEAD_BYTES)
    if not head then
      return nil, err
    end
    status, headers, version = M.parse_head(head)
    if not status then
      return nil, headers
    end
  until status >= 200 or status < 100
  local emit, parts
  local streamed = request.on_chunk and status >= 200 and status < 300
  if streamed then
    local on_chunk = request.on_chunk
    emit = function(piece)
      local ok, err = on_chunk(piece)
      if not ok then
        return nil, err or "the reply's reader stopped it"
      end
      return true
    end
  else
    emit, parts = collector(max_body)
  end
  local length = headers["content-length"]
  local chunked = (headers["transfer-encoding"] or ""):lower():find("chunked", 1, true)
  local delimited, ok, err = true, true, nil
  if status == 204 or status == 304 or request.method == "HEAD" then
    delimited = true -- no body
  elseif chunked then
    ok, err = reader:chunked(emit)
  elseif length then
    local n = tonumber(length:match("^%s*(%d+)%s*$") or "")
    if not n then
      return nil, "a malformed Content-Length: " .. length:sub(1, 40)
    elseif n > max_body and not streamed then
      return nil, ("the reply is longer than %d bytes (Content-Length: %d)"):format(max_body, n)
    end
    ok, err = reader:take(n, emit)
  else
    delimited = false
    ok, err = reader:to_close(emit)
  end
  if not ok then
    return nil, err
  end
  local close = (headers.connection or ""):lower():find("close", 1, true) or version == "1.0"
  return status, parts and table.concat(parts) or "", headers, delimited and not close
end

return M
