-- A host of its own for spec/linger_spec.lua: a Lua process that starts a
-- sandbox over the exec backend with a local rlm-keeper that lingers, sets
-- x = 42 in its REPL, says on stdout (one JSON line: never a command
-- line) what a resumer needs, and waits to be killed.
--   lua linger_host.lua LINGER_DIR ID LINGER_MS [inflight]
-- With "inflight", it starts a block that prints x after a second first,
-- and says so before its result comes: the keeper holds the result while
-- no stream is there. With "unread", it runs print(x) and reads nothing
-- for a second: the keeper has written the result into a pipe that dies
-- with this process unread.
local core = require("rlm.core")
local cjson = require("cjson")
local exec = require("rlm.sandbox.exec")
local linger = require("rlm.sandbox.linger")
local D = require("helpers.linger")

local dir, id, ms, mode = arg[1], arg[2], tonumber(arg[3]), arg[4]
local o = D.options(dir, ms)
local spec = assert(exec.prepare(o, "the context"))
local token = assert(linger.token())
spec = linger.start_spec(spec, { id = id, token = token, fence = 1 })
local h = assert(exec.start(spec))
assert(h:send(D.LOAD))
D.expect(h, "ready")
assert(h:send(cjson.encode({ type = "exec", id = 1, code = "x = 42\nprint('set')" })))
local r = D.expect(h, "exec_result")
assert(r.stdout == "set\n", r.stdout)
if mode == "inflight" then
  assert(h:send(cjson.encode({ type = "exec", id = 2, code = "import time\ntime.sleep(1)\nprint(x)" })))
elseif mode == "unread" then
  assert(h:send(cjson.encode({ type = "exec", id = 2, code = "print(x)" })))
  local t0 = core.now_ms()
  while core.now_ms() - t0 < 1000 do
    core.waitset():wait(100) -- this host's own, not the stream's: nothing is read
  end
end
local stat = assert(io.open("/proc/self/stat")):read("*l")
io.stdout:write(cjson.encode({ pid = tonumber(stat:match("^%d+")), keeper = h.hello.pid, token = token,
  fence = 1, seen = h:received(), sent = h:sent_lines(), at = core.now_ms() }), "\n")
io.stdout:flush()
while true do
  core.waitset():wait(1000)
end
