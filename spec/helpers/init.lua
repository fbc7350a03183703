-- Shared helpers for the specs: scripted stand-in models, and the checks
-- that nothing (child process, descriptor, workdir) outlives a test.
local rlm = require("rlm")
local assert = require("luassert")

local H = {}

local function run(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  return out
end

-- A directory of a spec's own, /tmp/<name>.XXXXXX (mktemp -d), and its
-- removal with all in it (its modes given back first: a test may take
-- them away), which refuses a directory H.scratch did not make.
local scratches = {}
function H.scratch(name)
  assert(type(name) == "string" and name:find("^[%w-]+$"), "a scratch directory's name is letters, digits and -")
  local dir = run("mktemp -d /tmp/" .. name .. ".XXXXXX"):gsub("%s+$", "")
  assert(dir:match("^/tmp/" .. name:gsub("%-", "%%-") .. "%.%w+$"), "mktemp -d made " .. dir)
  scratches[dir] = true
  return dir
end

function H.remove_scratch(dir)
  assert(scratches[dir], "not a directory H.scratch made: " .. tostring(dir))
  scratches[dir] = nil
  os.execute("chmod -R u+rwx '" .. dir .. "' 2>/dev/null; rm -rf '" .. dir .. "'")
end

-- One scratch directory for the workdirs of this run: spec/run's
-- (RLM_SPEC_TMPDIR), which spec/run removes; else, busted run by hand, one
-- made here and removed when busted ends (its "exit" event) or, outside
-- busted, when this Lua closes (a finaliser).
local function own_scratch()
  local dir = H.scratch("rlm-spec")
  local function remove()
    if scratches[dir] then
      H.remove_scratch(dir)
    end
  end
  local ok, busted = pcall(require, "busted")
  if ok and type(busted) == "table" and busted.subscribe then
    busted.subscribe({ "exit" }, function()
      remove()
      return nil, true -- the other subscribers too
    end)
  end
  if newproxy then -- Lua 5.1, LuaJIT: only a userdata has a __gc
    H.scratch_finaliser = newproxy(true)
    getmetatable(H.scratch_finaliser).__gc = remove
  else
    H.scratch_finaliser = setmetatable({}, { __gc = remove })
  end
  return dir
end
H.tmpdir = os.getenv("RLM_SPEC_TMPDIR") or own_scratch()

-- A root model that answers from a script: each item is a string, or a
-- function(messages, turn) returning one. Past the end it repeats the last.
-- The messages it was called with are kept in .calls, each as it was then
-- (root_llm gets the one conversation, appended to as it goes on).
function H.script(items)
  local calls = {}
  local model = setmetatable({ calls = calls }, {
    __call = function(_, messages)
      local seen = {}
      for i, m in ipairs(messages) do
        seen[i] = { role = m.role, content = m.content }
      end
      calls[#calls + 1] = seen
      local item = items[math.min(#calls, #items)]
      if type(item) == "function" then
        return item(messages, #calls)
      end
      return item
    end,
  })
  return model
end

function H.fence(code)
  return "```repl\n" .. code .. "\n```"
end

-- Session options with test defaults; opts override them.
function H.opts(opts)
  local o = {
    context = "hello world",
    root_llm = H.script({ H.fence("FINAL('done')") }),
    llm_query = function(p)
      return "echo: " .. p
    end,
    step_timeout_ms = 30000,
  }
  for k, v in pairs(opts or {}) do
    o[k] = v
  end
  -- The specs' sandboxes keep their files under H.tmpdir, whatever else
  -- their sandbox option says.
  if o.sandbox == nil or type(o.sandbox) == "table" then
    o.sandbox = H.sandbox(o.sandbox)
  end
  return o
end

-- A session with test defaults; opts override them.
function H.session(opts)
  return rlm.Session.new(H.opts(opts))
end

-- A copy of a sandbox option with the specs' tmpdir (for rlm.Pool.new).
function H.sandbox(sb)
  local out = { tmpdir = H.tmpdir }
  for k, v in pairs(sb or {}) do
    out[k] = v
  end
  return out
end

-- Runs a session to its end and closes it.
function H.run(opts)
  local s = H.session(opts)
  local result, err = s:run()
  s:close()
  return result, err, s
end

-- The open descriptors of this process and what they point at, one sorted
-- string each, leaving out the pipe to the shell that asks (both its ends:
-- popen may not have closed the write end yet).
function H.fds()
  local out = run("me=$(readlink /proc/$$/fd/1); cd /proc/" .. H.pid() .. "/fd && " ..
    "for f in *; do t=$(readlink $f) && [ \"$t\" != \"$me\" ] && echo \"$f $t\"; done; true")
  local fds = {}
  for line in out:gmatch("[^\n]+") do
    fds[#fds + 1] = line
  end
  table.sort(fds)
  return fds
end

-- read() again every 10 ms until done(its value) holds, for up to ms
-- (default 5 s: what close() hands to the keepers is over moments later).
-- Returns the last value read.
function H.settled(read, done, ms)
  local core = require("rlm.core")
  local t0, v = core.now_ms(), read()
  while not done(v) and core.now_ms() - t0 < (ms or 5000) do
    local w = assert(core.waitset())
    w:wait(10)
    w:close()
    v = read()
  end
  return v
end

-- Runs f and asserts that it leaves no descriptor, child or workdir behind.
function H.assert_no_leaks(f)
  collectgarbage()
  collectgarbage()
  -- An earlier test's close() may still be at its teardown (a stream's
  -- waits for its far side to end): what it still holds is not this one's.
  local core = require("rlm.core")
  H.settled(core.teardowns, function(n)
    return n == 0
  end)
  local before = H.fds()
  f()
  collectgarbage()
  collectgarbage()
  -- close() hands each sandbox to its keeper thread, which lets go of the
  -- session's descriptors once the sandbox is gone: on a loaded machine the
  -- last ones may still be at it (up to 5 s here).
  local deepcompare = require("luassert.util").deepcompare
  assert.are.same(before, H.settled(H.fds, function(now)
    return deepcompare(before, now)
  end))
  assert.are.same({}, H.settled_children())
  assert.are.same({}, H.workdirs())
end

-- Shell output, for specs.
H.sh = function(cmd)
  return (run(cmd):gsub("%s+$", ""))
end

local pid
function H.pid()
  if not pid then
    -- The shell's parent is this Lua process.
    pid = tonumber(run("echo $PPID"))
  end
  return pid
end

-- Child processes of this Lua process (zombies included), other than the
-- shell that asks.
function H.children()
  local out = run("cat /proc/" .. H.pid() .. "/task/*/children 2>/dev/null; echo; echo $$")
  local pids = {}
  for p in out:gmatch("%d+") do
    pids[#pids + 1] = tonumber(p)
  end
  local self = table.remove(pids)
  local others = {}
  for _, p in ipairs(pids) do
    if p ~= self then
      others[#others + 1] = p
    end
  end
  return others
end

function H.workdirs()
  local out = run("ls -A " .. H.tmpdir)
  local names = {}
  for n in out:gmatch("%S+") do
    names[#names + 1] = n
  end
  return names
end

-- The child processes left once the teardowns that close() hands to
-- rlm.core's thread are over: waits up to 5 s for at most `max` (default 0).
-- That thread kills the sandbox at once and reaps it as soon as it exits.
function H.settled_children(max)
  return H.settled(H.children, function(kids)
    return #kids <= (max or 0)
  end)
end

-- after_each: no child process and no workdir may outlive a test.
function H.assert_clean()
  collectgarbage()
  collectgarbage()
  assert.are.same({}, H.settled_children())
  assert.are.same({}, H.workdirs())
end

-- describe(name, fn) for specs that need luv; without luv, one pending
-- test says why.
function H.describe_luv(name, fn)
  local busted = require("busted")
  if type(require("helpers.luv")) == "table" then -- without luv, require gives true
    return busted.describe(name, fn)
  end
  busted.describe(name, function()
    busted.pending("luv is not installed (apt-get install lua-luv)")
  end)
end

-- The whole of a file.
function H.read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- The events of one type in log (a list of events), in order.
function H.events_of(log, kind)
  local out = {}
  for _, ev in ipairs(log) do
    if ev.type == kind then
      out[#out + 1] = ev
    end
  end
  return out
end

-- How many times `plain` occurs in s.
function H.count(s, plain)
  local n, at = 0, 1
  while true do
    local i = s:find(plain, at, true)
    if not i then
      return n
    end
    n, at = n + 1, i + #plain
  end
end

function H.lua_name()
  return os.getenv("RLM_SPEC_LUA") or _VERSION
end

return H
