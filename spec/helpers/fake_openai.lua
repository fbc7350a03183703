-- The Lua side of spec/helpers/fake_openai.py: start it, script its
-- replies, read the requests it got, stop it. Control goes through
-- LuaSocket's plain socket.http, not through the transport under test.
local http = require("socket.http")
local ltn12 = require("ltn12")
local cjson = require("cjson")

local F = {}
F.__index = F

local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
F.script_path = here .. "/fake_openai.py"

-- start([tls_cert, tls_key]) -> server, with .port, .pid and .url (the
-- base_url, ".../v1").
function F.start(cert, key)
  local cmd = "exec python3 " .. F.script_path
  if cert then
    cmd = cmd .. " --tls " .. cert .. " " .. key
  end
  local pipe = assert(io.popen(cmd, "r"))
  local line = pipe:read("*l")
  local port, pid = (line or ""):match("^(%d+) (%d+)$")
  assert(port, "fake_openai.py did not start: " .. tostring(line))
  local scheme = cert and "https" or "http"
  return setmetatable({
    pipe = pipe,
    port = tonumber(port),
    pid = tonumber(pid),
    control = scheme .. "://127.0.0.1:" .. port .. "/_control/",
    url = scheme .. "://127.0.0.1:" .. port .. "/v1",
    tls = cert ~= nil,
  }, F)
end

-- What the server's threads are doing, for a control request that got no
-- answer: each thread's state and the kernel function it waits in.
function F:threads()
  local out = {}
  local p = io.popen(("cd /proc/%d/task 2>/dev/null && for t in *; do printf '%%s %%s %%s\\n' \"$t\" "
    .. "\"$(cut -d' ' -f3 $t/stat)\" \"$(cat $t/wchan)\"; done"):format(self.pid))
  if p then
    out[1] = p:read("*a")
    p:close()
  end
  return ((out[1] or ""):gsub("\n$", ""))
end

function F:_control(what, body)
  local chunks = {}
  -- LuaSec's own https.request does not verify the certificate: fine for
  -- scripting the fake, never for the transport under test.
  local client = self.tls and require("ssl.https") or http
  local ok, status = client.request({
    url = self.control .. what,
    method = body and "POST" or "GET",
    headers = body and { ["content-type"] = "application/json", ["content-length"] = tostring(#body) } or nil,
    source = body and ltn12.source.string(body) or nil,
    sink = ltn12.sink.table(chunks),
  })
  -- A control request once waited out LuaSocket's 60 s with no answer
  -- (CI, lua5.3, openai_spec's first): the message says what the server's
  -- threads were doing, for the next time.
  assert(ok and status == 200, "fake_openai control " .. what .. ": " .. tostring(status)
    .. (ok and "" or "; the server's threads (tid, state, wait):\n" .. self:threads()))
  return table.concat(chunks)
end

-- script(replies[, rules]): the queue of replies, and the rules that
-- answer a request by what its last message holds, every time it is asked
-- (fake_openai.py's docstring).
function F:script(replies, rules)
  self:_control("script", cjson.encode({ replies = replies, rules = rules }))
end

-- The requests got since the last script(): { method, path, headers, body,
-- json, t, answered, key }.
function F:requests()
  return cjson.decode(self:_control("requests"))
end

-- The same without their headers and bodies ({ path, t, answered, key,
-- peer_port }): cheap to poll.
function F:brief_requests()
  return cjson.decode(self:_control("requests?brief=1"))
end

function F:stop()
  if not self.pipe then
    return
  end
  pcall(self._control, self, "stop", "{}")
  self.pipe:close() -- waits for it to exit
  self.pipe = nil
end

-- A chat.completion reply whose text is a ```repl block.
function F.fence(code)
  return "```repl\n" .. code .. "\n```"
end

return F
