-- A host of its own for spec/resume_attach_spec.lua: a Lua process that
-- runs helpers.resume_attach's journaled run over a local rlm-keeper that
-- lingers, says on stdout (JSON lines) its journal id, each call it asks,
-- and where it stops, and waits there to be killed:
--   lua resume_host.lua JOURNAL_DIR LINGER_DIR LINGER_MS STOP random|fixed TMPDIR
-- STOP: "root:N" (in the root model's Nth call), "llm:P" (in the sub-call
-- of prompt P), "wrote:SUFFIX" (once the journal's write of a key ending
-- in SUFFIX is in: ".call.2.2" is step 2's second answer recorded, not
-- yet handed to the driver).
local core = require("rlm.core")
local cjson = require("cjson")
local rlm = require("rlm")
local R = require("helpers.resume_attach")

local jdir, ldir, ms, stop, random, tmpdir = arg[1], arg[2], tonumber(arg[3]), arg[4], arg[5] == "random", arg[6]
local session

local function say(t)
  io.stdout:write(cjson.encode(t), "\n")
  io.stdout:flush()
end

local function stop_here()
  local drv = session and session.sandbox.driver
  say({ stop = stop, keeper = drv and drv.hello and drv.hello.pid })
  local w = assert(core.waitset())
  while true do
    w:wait(1000)
  end
end

local suffix = stop:match("^wrote:(.*)$")
local store = R.store(jdir, function(key)
  if suffix and key:sub(-#suffix) == suffix then
    stop_here()
  end
end)
local o = R.options(R.turns(random), store, ldir, ms, tmpdir, function(what)
  say({ asked = what })
  local kind, n = what:match("^(%a+) (.*)$")
  if stop == kind .. ":" .. n then
    stop_here()
  end
end)
session = rlm.Session.new(o)
local stat = assert(io.open("/proc/self/stat")):read("*l")
say({ id = session:journal_id(), pid = tonumber(stat:match("^%d+")) })
local r, err = session:run()
say({ ended = r and r.answer or tostring(err) })
