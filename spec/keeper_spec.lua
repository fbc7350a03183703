-- rlm-keeper driven directly over its stdin and stdout (docs/protocol.md,
-- "The stream"), as a helper process of rlm.core's: a real keeper, a real
-- bubblewrap sandbox, real pipes; the host's side spelled out here.
local core = require("rlm.core")
local cjson = require("cjson")
local H = require("helpers")

local KEEPER = (os.getenv("RLM_SPEC_BUILD") or "build") .. "/rlm-keeper"
-- The probe's cache, in the build tree (made again at will, like it).
local CACHE = os.getenv("PWD") .. "/build/keeper-cache"
os.execute("mkdir -p " .. CACHE)

local function start_message(over)
  local m = {
    type = "start", protocol = 1, max_message_bytes = 16 * 2 ^ 20, max_message_values = 65536,
    max_rss_bytes = 2 ^ 30, rss_poll_interval_ms = 50, workdir_max_bytes = 2 ^ 28,
    workdir_max_files = 10000, uid_first = 1879048192, uid_count = 65536, memory_cgroup = true,
    bind_pth_paths = false, modules = { "re", "json" }, allowed_modules = {}, guardrails = true,
    int_bits = 64, sandboxes = { "bubblewrap" },
    rlimits = { RLIMIT_NPROC = 64, RLIMIT_FSIZE = 2 ^ 30, RLIMIT_NOFILE = 64, RLIMIT_CORE = 0,
      RLIMIT_SIGPENDING = 64, RLIMIT_MSGQUEUE = 0, RLIMIT_MEMLOCK = 0 },
  }
  for k, v in pairs(over or {}) do
    m[k] = v
  end
  return "K" .. cjson.encode(m)
end

local LOAD = "D" .. cjson.encode({ type = "load_context", format = "text", stdout_limit = 2000,
  rlimits = { RLIMIT_AS = 2 ^ 34, RLIMIT_CPU = 1000 } })

-- The keeper as a helper process: its lines come from poll().
local function keeper(argv)
  local k = assert(core.helper(argv or { KEEPER, "--cache", CACHE }, 60000, 64 * 2 ^ 20))
  local self = { k = k }
  function self.send(line)
    assert(k:send(line))
  end
  -- The next line (or the end, as "exit"), within 30 s.
  function self.next()
    local t0 = core.now_ms()
    while core.now_ms() - t0 < 30000 do
      local kind, a, b, c = k:poll(1000)
      if kind == "line" then
        return a
      elseif kind then
        return kind, a, b, c
      end
    end
    error("no line from rlm-keeper within 30 s")
  end
  -- Lines up to and including the first that matches pattern.
  function self.upto(pattern)
    local seen = {}
    repeat
      local line, status = self.next()
      assert(line ~= "exit", "rlm-keeper ended (" .. tostring(status) .. ") after: "
        .. table.concat(seen, "\n"):sub(-2000))
      seen[#seen + 1] = line
    until line:find(pattern)
    return seen
  end
  return self
end

-- The context as the stream carries it: its message, then its raw bytes
-- (the helper's send adds a newline: that is the context's last byte).
local function send_context(k, text)
  k.send('K{"type":"context","bytes":' .. (#text + 1) .. "}")
  k.send(text)
end

local function decode(line, channel)
  assert.equals(channel, line:sub(1, 1), line:sub(1, 200))
  return cjson.decode(line:sub(2))
end

-- The processes that run as uid (a root keeper's sandbox has a uid of its
-- own), none once it is gone.
local function processes_of(uid)
  return H.sh("env -u LD_PRELOAD ps -o pid= -u " .. uid .. " 2>/dev/null | tr -d ' ' | tr '\\n' ' '")
end

local function sandbox_uid(checks)
  return checks.checks.uids.detail:match("as uid (%d+)")
end

describe("rlm-keeper", function()
  it("says hello first, starts the driver under bubblewrap and relays its lines on the D channel", function()
    local k = keeper()
    local hello = decode(k.next(), "K")
    assert.same({ "hello", "bubblewrap", 1 }, { hello.type, hello.sandbox, hello.protocol })
    k.send(start_message())
    send_context(k, ("word "):rep(1000))
    k.send(LOAD)
    local lines = k.upto('^D{"type": "ready"')
    assert.equals("hello", decode(lines[1], "D").type)
    local result, checks
    for _, line in ipairs(lines) do
      if line:find('^D{"type": "self_test_result"') then
        result = decode(line, "D")
      elseif line:sub(1, 1) == "K" then
        checks = decode(line, "K")
      end
    end
    -- the driver's self-test against the keeper's canaries, relayed
    for name, c in pairs(result.checks) do
      assert.is_true(c.ok, name .. ": " .. c.detail)
    end
    -- the keeper's own checks, before the ready they vouch for
    assert.equals("checks", checks.type)
    for _, name in ipairs({ "memory_cgroup", "uids", "rlimits", "descriptors", "context_sealed" }) do
      assert.is_true(checks.checks[name].ok, name .. ": " .. tostring(checks.checks[name].detail))
    end
    assert.equals(5001, decode(lines[#lines], "D").context_len)
    k.send("D" .. cjson.encode({ type = "exec", id = 1, code = "print(context.count('word'))" }))
    local done = decode(k.upto("exec_result")[1], "D")
    assert.equals("1000\n", done.stdout)
    local uid = tonumber(H.sh("id -u"))
    k.k:close()
    if uid == 0 then
      -- a root keeper's sandbox runs as a uid of its own: gone with it
      local own = sandbox_uid(checks)
      assert.equals("", H.settled(function()
        return processes_of(own)
      end, function(v)
        return v == ""
      end))
    end
  end)

  it("relays a driver line that imitates a keeper message as the driver's", function()
    local k = keeper()
    k.next()
    k.send(start_message({ guardrails = false }))
    send_context(k, "x")
    k.send(LOAD)
    k.upto("ready")
    -- raw bytes on the driver's stdout, past its protocol writer
    k.send("D" .. cjson.encode({ type = "exec", id = 1,
      code = "import os\nos.write(1, b'K{\"type\":\"timeout\"}\\nK{\"type\":\"exit\",\"status\":0}\\n')" }))
    local lines = k.upto("exec_result")
    assert.same({ 'DK{"type":"timeout"}', 'DK{"type":"exit","status":0}' }, { lines[1], lines[2] })
    k.k:close()
  end)

  it("answers the host's ping with a pong, before its start and while a step runs", function()
    local k = keeper()
    k.next()
    k.send('K{"type":"ping"}')
    assert.equals('K{"type":"pong"}', k.next())
    k.send(start_message())
    send_context(k, "x")
    k.send(LOAD)
    k.upto("ready")
    k.send("D" .. cjson.encode({ type = "exec", id = 1, code = "import time\ntime.sleep(30)" }))
    k.send('K{"type":"ping"}')
    assert.equals('K{"type":"pong"}', k.next())
    k.k:close()
  end)

  it("kills the driver at the deadline it is given and says so", function()
    local k = keeper()
    k.next()
    k.send(start_message())
    send_context(k, "x")
    k.send(LOAD)
    k.upto("ready")
    k.send('K{"type":"deadline","ms":300}')
    k.send("D" .. cjson.encode({ type = "exec", id = 1, code = "while True: pass" }))
    local t0 = core.now_ms()
    local line = k.upto("^K")[1]
    assert.equals("timeout", decode(line, "K").type)
    assert.is_true(core.now_ms() - t0 < 5000)
    assert.equals("exit", (k.next())) -- and it ends
    k.k:close()
  end)

  it("interrupts the step it is told to, and the REPL keeps its variables", function()
    local k = keeper()
    k.next()
    k.send(start_message())
    send_context(k, "x")
    k.send(LOAD)
    k.upto("ready")
    k.send("D" .. cjson.encode({ type = "exec", id = 1, code = "kept = 42" }))
    k.upto("exec_result")
    k.send("D" .. cjson.encode({ type = "exec", id = 2, code = "import time\nwhile True: time.sleep(0.01)" }))
    local w = assert(core.waitset())
    w:wait(300)
    w:close()
    k.send('K{"type":"interrupt"}')
    local result = decode(k.upto("exec_result")[1], "D")
    assert.matches("KeyboardInterrupt", result.error)
    k.send("D" .. cjson.encode({ type = "exec", id = 3, code = "print(kept)" }))
    assert.equals("42\n", decode(k.upto("exec_result")[1], "D").stdout)
    k.k:close()
  end)

  it("kills the driver past max_rss_bytes and says so", function()
    local k = keeper()
    k.next()
    k.send(start_message({ max_rss_bytes = 200 * 2 ^ 20 }))
    send_context(k, "x")
    k.send(LOAD)
    k.upto("ready")
    k.send("D" .. cjson.encode({ type = "exec", id = 1, code = "x = bytearray(600 * 2**20)" }))
    local line = k.upto("^K")[1]
    local msg = decode(line, "K")
    assert.is_true(msg.type == "memory" or (msg.type == "exit" and msg.oom_kills > 0), line)
    k.k:close()
  end)

  -- Which sandbox it says it makes (docs/security.md, "The fallback"):
  -- bubblewrap where it runs, else the seccomp fallback, which needs a
  -- root keeper (a uid for the REPL of its own); none otherwise.
  local ROOT = H.sh("id -u") == "0"
  local modes = {
    { { "--bwrap", "/nonexistent" }, ROOT and "seccomp" or "none", "bubblewrap (/nonexistent) was not found" },
    { { "--sandbox", "seccomp" }, ROOT and "seccomp" or "none", "--sandbox seccomp" },
    { { "--bwrap", "/nonexistent", "--sandbox", "bubblewrap" }, "none", "was not found" },
  }
  for _, case in ipairs(modes) do
    it(("says %s in its hello with %s"):format(case[2], table.concat(case[1], " ")), function()
      local argv = { KEEPER, "--cache", CACHE }
      for _, a in ipairs(case[1]) do
        argv[#argv + 1] = a
      end
      local k = keeper(argv)
      local hello = decode(k.next(), "K")
      assert.equals(case[2], hello.sandbox)
      assert.matches(case[3], hello.detail, 1, true)
      -- and it starts nothing the host's start does not list
      k.send(start_message())
      local msg = decode(k.next(), "K")
      assert.equals("failed", msg.type)
      assert.matches(case[2] == "none" and "can make no sandbox here" or "the host allows", msg.message, 1, true)
      k.k:close()
    end)
  end

  it("keeps its namespaces probe's verdict in its cache, and goes by it", function()
    local dir = H.sh("mktemp -d /tmp/rlm-spec-keeper-cache.XXXXXX")
    local function hello()
      local k = keeper({ KEEPER, "--cache", dir })
      local msg = decode(k.next(), "K")
      k.k:close()
      return msg
    end
    assert.equals("bubblewrap", hello().sandbox)
    local file = H.sh("ls " .. dir .. "/namespaces-*")
    local f = assert(io.open(file))
    local key, verdict = f:read("*l"), f:read("*l")
    f:close()
    assert.matches("^rlm%-keeper namespaces 1\t", key)
    assert.equals("1 ", verdict)
    -- a refusal kept for the same key: no child asked again
    f = assert(io.open(file, "w"))
    f:write(key, "\n0 planted: Operation not permitted\n")
    f:close()
    local again = hello()
    os.execute("rm -rf " .. dir)
    assert.equals(ROOT and "seccomp" or "none", again.sandbox)
    assert.matches("planted: Operation not permitted", again.detail, 1, true)
  end)

  -- The host's side broken: the keeper says why and ends.
  local broken = {
    { "a start without its fields", 'K{"type":"start","protocol":1}', "missing a field" },
    { "another protocol", start_message({ protocol = 2 }), "keeper protocol" },
    { "a keeper message that is not JSON", "K{not json", "not a JSON object" },
    { "a message it does not take", 'K{"type":"reboot"}', "does not take" },
    { "a line with no channel", "X{}", "no channel" },
  }
  for _, case in ipairs(broken) do
    it("ends with failed on " .. case[1], function()
      local k = keeper()
      k.next()
      k.send(case[2])
      local msg = decode(k.next(), "K")
      assert.equals("failed", msg.type)
      assert.matches(case[3], msg.message, 1, true)
      assert.equals("exit", (k.next()))
      k.k:close()
    end)
  end

  it("ends on a line past max_message_bytes + 1 from the host", function()
    local k = keeper()
    k.next()
    k.send(start_message({ max_message_bytes = 1024 }))
    k.send("D" .. ("x"):rep(2000))
    local msg
    repeat
      local line = k.next()
      msg = line:sub(1, 1) == "K" and cjson.decode(line:sub(2)) or nil
    until msg and msg.type == "failed"
    assert.matches("longer than max_message_bytes", msg.message, 1, true)
    k.k:close()
  end)
end)
