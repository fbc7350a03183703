-- The exec backend: sessions whose sandbox is rlm-keeper at the far end of
-- a byte stream (docs/backends.md, docs/protocol.md "The stream"), here
-- behind processes that only copy bytes. Real keeper, real bubblewrap,
-- real pipes; the faults are real processes killed or filtered.
local rlm = require("rlm")
local core = require("rlm.core")
local H = require("helpers")

local KEEPER = os.getenv("PWD") .. "/" .. (os.getenv("RLM_SPEC_BUILD") or "build") .. "/rlm-keeper"
-- The probe's cache, in the build tree (made again at will, like it).
local CACHE = os.getenv("PWD") .. "/build/keeper-cache"
os.execute("mkdir -p " .. CACHE)
local K = KEEPER .. " --cache " .. CACHE
local ROOT = H.sh("id -u") == "0"

local function through(cmd)
  return { backend = "exec", argv = { "sh", "-c", cmd } }
end
local RELAY = through("cat | " .. K .. " | cat")

-- A copy of sandbox option sb with the fields of more.
local function with(sb, more)
  local out = {}
  for k, v in pairs(sb) do
    out[k] = v
  end
  for k, v in pairs(more) do
    out[k] = v
  end
  return out
end

local function opts(o)
  o = o or {}
  if type(o.sandbox) ~= "table" or o.sandbox.backend == nil then
    local sandbox = {}
    for k, v in pairs(RELAY) do
      sandbox[k] = v
    end
    for k, v in pairs(type(o.sandbox) == "table" and o.sandbox or {}) do
      sandbox[k] = v
    end
    if o.sandbox == nil or type(o.sandbox) == "table" then
      o.sandbox = sandbox
    end
  end
  return H.opts(o)
end

-- The sandbox's own uid (a root keeper claims one per sandbox), read from
-- the keeper's checks while the session runs.
local function sandbox_uid(s)
  local checks = s.sandbox.driver and s.sandbox.driver.checks
  return checks and checks.uids and checks.uids.detail:match("as uid (%d+)")
end

-- Whether pid runs (a zombie does not: this machine's init may be slow to
-- reap what it inherits).
local function running(pid)
  return H.sh(("env -u LD_PRELOAD ps -o stat= -p %d | grep -v '^Z'"):format(pid)) ~= ""
end

local function assert_gone(uid)
  if uid then
    assert.equals("", H.settled(function()
      return H.sh("env -u LD_PRELOAD ps -o pid= -u " .. uid .. " 2>/dev/null | tr -d ' \\n'")
    end, function(v)
      return v == ""
    end))
  end
end

describe("the exec backend", function()
  it("survives a step timeout with its variables", function()
    local result, err = H.run(opts({
      step_timeout_ms = 500,
      root_llm = H.script({
        H.fence("kept = 42"),
        H.fence("import time\nwhile True: time.sleep(0.01)"),
        H.fence("FINAL(str(kept))"),
      }),
    }))
    assert.is_nil(err)
    assert.equals("42", result.answer)
    assert.matches("KeyboardInterrupt", result.history[2].error)
  end)

  -- (After a first session: libuv's process-wide signal pipe is made by
  -- the first loop of the process, and stays.)
  it("answers over a 5 MB context with an llm_query through sh -c 'cat | rlm-keeper | cat'", function()
    local uid
    H.assert_no_leaks(function()
      local s
      s = rlm.Session.new(opts({
        context = ("0123456789abcde\n"):rep(5 * 2 ^ 16),
        root_llm = H.script({
          H.fence("n = len(context)\nprint(llm_query('size ' + str(n)))"),
          function()
            uid = sandbox_uid(s)
            return H.fence("FINAL(str(n))")
          end,
        }),
      }))
      local result, err = s:run()
      s:close()
      assert.is_nil(err)
      assert.equals("5242880", result.answer)
      assert.equals("echo: size 5242880\n", result.history[1].stdout)
      assert.equals(1, result.sub_calls)
    end)
    if ROOT then
      assert.is_string(uid)
      assert_gone(uid)
    end
  end)

  it("ends with memory_limit when the far side allocates past max_rss_bytes", function()
    local uid
    local s
    s = rlm.Session.new(opts({
      max_rss_bytes = 200 * 2 ^ 20,
      root_llm = H.script({ function()
        uid = sandbox_uid(s)
        return H.fence("x = bytearray(800 * 2**20)\nprint(len(x))")
      end }),
    }))
    local _, err = s:run()
    s:close()
    assert.equals("memory_limit", err.kind)
    assert_gone(ROOT and uid)
  end)

  -- The keeper killed while the host writes (the sub-call's answer goes
  -- out after the kill) and while the host only waits on the step: a relay
  -- that outlives the keeper (the first cat, blocked on the host's input)
  -- learns of its death at the host's next write, and in the second case
  -- the host writes nothing but the heartbeat's ping. The step sleeps 60 s
  -- under a 120 s step_timeout_ms: neither can end it in time.
  local lost_cases = {
    { "while the host writes", function(pid)
      os.execute(("kill -9 %d"):format(pid))
    end },
    { "while the host only waits", function(pid)
      os.execute(("(sleep 0.3; kill -9 %d) &"):format(pid))
    end },
  }
  for _, case in ipairs(lost_cases) do
    it("ends with sandbox_lost when the keeper is killed mid-step " .. case[1] .. ", and leaves nothing behind",
      function()
        local uid, pid
        local s
        local t0 = core.now_ms()
        s = rlm.Session.new(opts({
          step_timeout_ms = 120000,
          root_llm = H.script({ H.fence("print(llm_query('now'))\nimport time\ntime.sleep(60)") }),
          llm_query = function()
            uid = sandbox_uid(s)
            pid = s.sandbox.driver.hello.pid
            case[2](pid)
            return "ok"
          end,
        }))
        local _, err = s:run()
        s:close()
        local took = core.now_ms() - t0
        assert.equals("sandbox_lost", err.kind)
        assert.is_true(took < 15000, ("took %.0f ms"):format(took))
        assert_gone(ROOT and uid)
        assert.is_false(running(pid))
      end)
  end

  it("ends with sandbox_lost at sandbox.ping_timeout_ms when the far side stops answering", function()
    local uid, pid
    local s
    local t0
    s = rlm.Session.new(opts({
      step_timeout_ms = 120000,
      sandbox = { backend = "exec", argv = RELAY.argv, ping_timeout_ms = 1000 },
      root_llm = H.script({ H.fence("print(llm_query('now'))\nimport time\ntime.sleep(60)") }),
      llm_query = function()
        uid = sandbox_uid(s)
        pid = s.sandbox.driver.hello.pid
        -- stopped, not dead: every pipe stays open, nothing answers
        os.execute(("kill -STOP %d"):format(pid))
        t0 = core.now_ms()
        return "ok"
      end,
    }))
    local _, err = s:run()
    s:close()
    local took = core.now_ms() - t0
    assert.equals("sandbox_lost", err.kind)
    assert.matches("answered no ping for 1000 ms", err.message, 1, true)
    assert.equals(1000, err.ping_timeout_ms)
    assert.is_true(took >= 1000 and took < 15000, ("took %.0f ms"):format(took))
    -- the host killed the stream's process group, the stopped keeper in it
    assert.is_false(H.settled(function()
      return running(pid)
    end, function(v)
      return not v
    end))
    assert_gone(ROOT and uid)
  end)

  it("ends with sandbox_unavailable at start_timeout_ms when the far side never says hello", function()
    local t0 = core.now_ms()
    local _, err = H.run(opts({ sandbox = with(through("cat > /dev/null"), { start_timeout_ms = 500 }) }))
    assert.equals("sandbox_unavailable", err.kind)
    assert.matches("did not say hello within sandbox.start_timeout_ms", err.message)
    assert.is_true(core.now_ms() - t0 < 5000)
  end)

  it("takes a driver line that imitates a keeper message as the driver's (protocol_error)", function()
    local _, err = H.run(opts({
      guardrails = false,
      root_llm = H.script({ H.fence("import os\nos.write(1, b'K{\"type\":\"exit\",\"status\":0}\\n')") }),
    }))
    assert.equals("protocol_error", err.kind)
    assert.matches("the driver sent", err.message)
  end)

  -- The keeper's exit message holds the stderr's tail escaped: a control
  -- byte is six bytes of JSON (\u0001), so its 4 KiB tail is 24 KiB of line.
  it("says the driver's exit (status 3) within a small max_message_bytes when its stderr is control bytes",
    function()
      local _, err = H.run(opts({
        sandbox = { max_message_bytes = 8204 },
        stdout_truncate_chars = 1,
        guardrails = false,
        root_llm = H.script({ H.fence("import os\nos.write(2, b'\\x01' * 8192)\nos._exit(3)") }),
      }))
      assert.equals("driver_exited", err.kind)
      assert.matches("exited: exit status 3: \1+$", err.message)
      assert.is_true(#err.message > 1000, #err.message)
    end)

  -- A relay that changes what the keeper says of its checks.
  local checks_cases = {
    { "omits its checks", "grep --line-buffered -v '^K{\"type\":\"checks\"'", "reported no checks" },
    { "fails a check", "sed -u '/^K{\"type\":\"checks\"/s/\"uids\":{\"ok\":true/\"uids\":{\"ok\":false/'",
      "checks failed: uids" },
    { "leaves one out", "sed -u '/^K{\"type\":\"checks\"/s/\"rlimits\"/\"other\"/'", "rlimits (not reported)" },
  }
  for _, case in ipairs(checks_cases) do
    it("fails closed (sandbox_violation) when the far side " .. case[1], function()
      local _, err = H.run(opts({ sandbox = through(K .. " | " .. case[2]) }))
      assert.equals("sandbox_violation", err.kind)
      assert.matches(case[3], err.message, 1, true)
    end)
  end

  it("answers through a throttled pipe (a relay that passes bytes slowly)", function()
    local slow = "python3 -c 'import os,sys,time\nwhile True:\n b=os.read(0,4096)\n if not b: break\n"
      .. " time.sleep(0.002); os.write(1,b)'"
    local result, err = H.run(opts({
      sandbox = through(slow .. " | " .. K .. " | " .. slow),
      context = ("x"):rep(2 ^ 18),
      root_llm = H.script({ H.fence("FINAL(str(len(context)))") }),
    }))
    assert.is_nil(err)
    assert.equals("262144", result.answer)
  end)

  -- Every keeper message is a write of the host's and a wake-up of the
  -- far side (over a pod's network, a packet each way). A step arms the
  -- root call's deadline (none, without max_wall_ms), the exec's, and
  -- none after it: the host says none only when the keeper may have one
  -- armed, and the exec's deadline in the same write as the exec. A relay
  -- before the keeper logs each read of the host's bytes (a pipe's read
  -- takes a write whole).
  it("sends a step's deadline in the exec's write, and no deadline of none twice", function()
    local log = H.tmpdir .. "/reads-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e6))
    local tap = ("python3 -c 'import os,sys\nf=open(sys.argv[1],\"w\")\nwhile True:\n b=os.read(0,65536)\n"
      .. " if not b: break\n f.write(repr(b)+\"\\n\"); f.flush(); os.write(1,b)' %s"):format(log)
    local code = H.fence("x = 1")
    local result, err = H.run(opts({
      sandbox = through(tap .. " | " .. K),
      max_iterations = 8,
      root_llm = H.script({ code, code, code, code, H.fence("FINAL('done')") }),
    }))
    assert.is_nil(err)
    assert.equals("done", result.answer)
    local reads, lines = {}, {}
    for r in io.lines(log) do
      reads[#reads + 1] = r
      for line in r:gmatch("([KD]{.-})\\n") do
        lines[#lines + 1] = { line = line, read = #reads }
      end
    end
    os.remove(log)
    local execs = 0
    for i, l in ipairs(lines) do
      if l.line:find('"type":"exec"', 1, true) then
        execs = execs + 1
        local before = lines[i - 1]
        assert.matches('^K{"type":"deadline","ms":%d+}$', before.line)
        assert.is_true(before.read == l.read, "the exec's deadline came in another write: " .. reads[l.read])
      end
      local prev = lines[i - 1]
      if prev and l.line == 'K{"type":"deadline","ms":0}' then
        assert.is_true(prev.line ~= l.line, "a deadline of none twice in a row")
      end
    end
    assert.equals(5, execs)
  end)

  -- The hard deadline is the keeper's to keep while a blocking callback
  -- holds the host (lua/rlm/engine/clock.lua): max_wall_ms's, armed for a
  -- root call, reaches the keeper at once, not with the host's next write
  -- (which comes only after the callback). As root the keeper runs the
  -- sandbox as a uid of its own, whose processes are then gone.
  it("kills the sandbox at max_wall_ms while a blocking root call holds the host", function()
    local s, uid, alive_after
    s = rlm.Session.new(opts({
      max_wall_ms = 2000,
      root_llm = H.script({
        H.fence("x = 1"),
        function()
          if alive_after == nil then -- the first call (a fallback answer may ask again)
            uid = sandbox_uid(s)
            os.execute("sleep 4")
            alive_after = ROOT and uid ~= nil and H.sh("env -u LD_PRELOAD ps -o pid= -u " .. uid .. " 2>/dev/null | tr -d ' \\n'") ~= ""
          end
          return H.fence("FINAL('late')")
        end,
      }),
    }))
    local result, err = s:run()
    s:close()
    local why = err or result.reason -- a partial answer: the last reply, marked
    assert.equals("cost_budget", why.kind)
    assert.matches("max_wall_ms", why.message, 1, true)
    if not (ROOT and uid) then
      pending("the keeper runs the sandbox as a uid of its own only as root (else ps -u would list the host's)")
      return
    end
    assert.is_false(alive_after, "the sandbox outlived max_wall_ms while the callback held the host")
    assert_gone(uid)
  end)

  it("gives rlm.Pool's sessions their sandboxes through the stream", function()
    local pool = assert(rlm.Pool.new({ size = 1, sandbox = H.sandbox(RELAY) }))
    local result, err = H.run({ pool = pool, context = "pooled context",
      root_llm = H.script({ H.fence("FINAL(context.upper())") }) })
    pool:close()
    assert.is_nil(err)
    assert.equals("POOLED CONTEXT", result.answer)
  end)

  -- A pooled sandbox was started with the pool's sandbox option: a session
  -- may repeat it (the same data, defaults spelled out or not), never change
  -- what the backend reads of it.
  it("takes a session's sandbox option only when it is the pool's", function()
    local pool = assert(rlm.Pool.new({ size = 1, sandbox = H.sandbox(RELAY) }))
    local local_pool = assert(rlm.Pool.new({ size = 1, sandbox = { tmpdir = H.tmpdir } }))
    local differs = {
      { pool, through("cat | " .. K .. " --python python3 | cat") },
      { pool, { backend = "exec", argv = RELAY.argv, allow = { "bubblewrap", "seccomp" } } },
      { pool, { backend = "exec", argv = RELAY.argv, ping_timeout_ms = 5000 } },
      { pool, { backend = "bubblewrap" } },
      { local_pool, RELAY },
    }
    for _, case in ipairs(differs) do
      local ok, e = pcall(rlm.Session.new, H.opts({ pool = case[1], sandbox = case[2] }))
      assert.is_false(ok)
      assert.matches("option 'sandbox%.[%w_]+' differs from the pool's", e)
    end
    local argv = {}
    for i, a in ipairs(RELAY.argv) do
      argv[i] = a
    end
    local fine = {
      { pool, { backend = "exec", argv = argv } },
      { pool, { backend = "exec", argv = argv, allow = { "bubblewrap" }, ping_timeout_ms = 10000 } },
      { local_pool, { backend = "bubblewrap" } },
    }
    for _, case in ipairs(fine) do
      rlm.Session.new(H.opts({ pool = case[1], sandbox = case[2] })):close()
    end
    pool:close()
    local_pool:close()
  end)

  local misuse = {
    { { backend = "exec" }, "option 'sandbox.argv' must be" },
    { { backend = "exec", argv = {} }, "option 'sandbox.argv' must be" },
    { { backend = "exec", argv = { "" } }, "option 'sandbox.argv' must be" },
    { { backend = "kubernetes", argv = { "sh" } }, "option 'sandbox.backend' must be" },
    { { backend = "exec", argv = { "sh" }, image = "x" }, "has no field 'image'" },
    { { backend = "exec", argv = { "sh" }, ping_timeout_ms = 50 }, "option 'sandbox.ping_timeout_ms' must be" },
    { { backend = "exec", argv = { "sh" }, allow = { "none" } }, "option 'sandbox.allow' must be" },
    { { backend = "exec", argv = { "sh" }, allow = {} }, "option 'sandbox.allow' must be" },
    { { backend = "exec", argv = { "sh" }, allow = "seccomp" }, "option 'sandbox.allow' must be" },
    { { backend = "exec", argv = { "sh" }, allow = { "bubblewrap", x = 1 } }, "option 'sandbox.allow' must be" },
    { { backend = "exec", argv = { "sh" }, ping_timeout_ms = 1.5e3 + 0.5 }, "option 'sandbox.ping_timeout_ms' must be" },
    { "exec", "option 'sandbox' must be" },
  }
  for _, case in ipairs(misuse) do
    it("raises naming the field on " .. (case[2]:match("'[^']+'") or case[2]), function()
      local ok, e = pcall(rlm.Session.new, opts({ sandbox = case[1] }))
      assert.is_false(ok)
      assert.matches(case[2], e, 1, true)
    end)
  end

  it("says which program was not found", function()
    local _, err = H.run(opts({ sandbox = { backend = "exec", argv = { "no-such-program-rlm" } } }))
    assert.equals("sandbox_unavailable", err.kind)
    assert.matches("sandbox.argv", err.message, 1, true)
  end)
end)

-- rlm-keeper where bubblewrap cannot run (docs/security.md, "The
-- fallback"): here bubblewrap is taken away from it (--bwrap /nonexistent);
-- a container whose profile refuses its namespaces is the case below. The
-- REPL's interpreter must be one the REPL's uid may run (the host's python3
-- may sit under a home of 0700, as pyenv's does here): /usr/bin/python3.
describe("the seccomp fallback", function()
  local PY = "/usr/bin/python3"
  local have_py = H.sh("test -x " .. PY .. " && echo yes") == "yes"
  local scratch = H.sh("mktemp -d /tmp/rlm-spec-fallback.XXXXXX")
  os.execute("chmod 755 " .. scratch)
  local function fallback(extra, relay)
    return { backend = "exec", allow = extra, argv = { "sh", "-c", ("TMPDIR=%s %s --bwrap /nonexistent "
      .. "--python %s %s"):format(scratch, K, PY, relay or "") } }
  end
  local BOTH = { "bubblewrap", "seccomp" }
  -- What the keeper left in its TMPDIR (its REPL directories).
  local function left()
    return H.sh("ls -A " .. scratch)
  end
  local function settled_left()
    return H.settled(left, function(v)
      return v == ""
    end)
  end

  teardown(function()
    os.execute("rm -rf " .. scratch)
  end)

  it("is refused unless sandbox.allow names it (sandbox_unavailable), and nothing of it runs", function()
    local _, err = H.run(opts({ sandbox = fallback(nil) }))
    assert.equals("sandbox_unavailable", err.kind)
    assert.matches("makes a " .. (ROOT and "seccomp" or "none") .. " sandbox", err.message, 1, true)
    assert.matches("option 'sandbox.allow'", err.message, 1, true)
    assert.equals("", settled_left())
  end)

  if not ROOT then
    it("is refused where the keeper cannot give the REPL a uid of its own (not root)", function()
      local _, err = H.run(opts({ sandbox = fallback(BOTH) }))
      assert.equals("sandbox_unavailable", err.kind)
      assert.matches("needs rlm-keeper to run as root", err.message, 1, true)
    end)
    return
  end
  if not have_py then
    pending("needs " .. PY .. " (an interpreter the REPL's uid may run)")
    return
  end

  it("runs a session when allowed, says so, and leaves nothing behind", function()
    local uid, events = nil, {}
    local s
    H.assert_no_leaks(function()
      s = rlm.Session.new(opts({
        sandbox = fallback(BOTH),
        context = ("0123456789abcde\n"):rep(2 ^ 16),
        on_event = function(ev)
          events[#events + 1] = ev
        end,
        root_llm = H.script({
          H.fence("n = len(context)\nprint(llm_query('size ' + str(n)))"),
          function()
            uid = sandbox_uid(s)
            return H.fence("FINAL(str(n))")
          end,
        }),
      }))
      local result, err = s:run()
      s:close()
      assert.is_nil(err)
      assert.equals("1048576", result.answer)
      assert.equals("echo: size 1048576\n", result.history[1].stdout)
      assert.same({ "exec", "seccomp" }, { result.sandbox.backend, result.sandbox.mode })
      assert.matches("not found", result.sandbox.detail, 1, true)
      assert.is_string(result.sandbox.not_promised.host_files)
      local ready
      for _, ev in ipairs(events) do
        ready = ready or ev.type == "sandbox_ready" and ev
      end
      assert.same({ "exec", "seccomp", "cold" }, { ready.backend, ready.mode, ready.start })
    end)
    assert_gone(uid)
    assert.equals("", settled_left())
  end)

  -- The limits hold there as with bubblewrap: the interrupt, the memory
  -- watchdog, the workdir's files (counted by walking it).
  it("survives a step timeout with its variables", function()
    local result, err = H.run(opts({ sandbox = fallback(BOTH), step_timeout_ms = 500,
      root_llm = H.script({ H.fence("kept = 42"), H.fence("import time\nwhile True: time.sleep(0.01)"),
        H.fence("FINAL(str(kept))") }) }))
    assert.is_nil(err)
    assert.equals("42", result.answer)
    assert.matches("KeyboardInterrupt", result.history[2].error)
  end)

  it("ends with memory_limit past max_rss_bytes", function()
    local _, err = H.run(opts({ sandbox = fallback(BOTH), max_rss_bytes = 200 * 2 ^ 20,
      root_llm = H.script({ H.fence("x = bytearray(800 * 2**20)\nprint(len(x))") }) }))
    assert.equals("memory_limit", err.kind)
    assert.equals("", settled_left())
  end)

  it("ends with memory_limit past workdir_max_files in its directory", function()
    local _, err = H.run(opts({ sandbox = with(fallback(BOTH), { workdir_max_files = 50 }), guardrails = false,
      root_llm = H.script({ H.fence("import os, time\nos.makedirs('a/b')\n"
        .. "for i in range(200): open('a/b/f%d' % i, 'w').close()\ntime.sleep(5)") }) }))
    assert.equals("memory_limit", err.kind)
    assert.equals("workdir files", err.mechanism)
    assert.equals("", settled_left())
  end)

  -- What the REPL's code tries there, with the guardrails off: each block
  -- prints one line. The last rows are what the fallback does not hide
  -- (docs/security.md): the far side's files any uid may read, its /proc.
  local secret = scratch .. "-secret"
  local attacks = {
    { "makes no socket of any family", [[
import _socket
for fam in (_socket.AF_INET, _socket.AF_INET6, _socket.AF_UNIX, 16, 17):
    try:
        _socket.socket(fam, _socket.SOCK_DGRAM)
        print("made", fam)
    except PermissionError:
        pass
print("refused")]], "^refused\n$" },
    { "may not ptrace rlm-keeper", [[
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(libc.ptrace(16, os.getppid(), 0, 0), ctypes.get_errno())]], "^%-1 1\n$" },
    { "may not fork", [[
import os
try:
    os.fork()
    print("forked")
except PermissionError:
    print("refused")]], "^refused\n$" },
    { "may not signal rlm-keeper", [[
import os
try:
    os.kill(os.getppid(), 0)
    print("signalled")
except PermissionError:
    print("refused")]], "^refused\n$" },
    { "may not read rlm-keeper's environment", [[
import os
try:
    open("/proc/%d/environ" % os.getppid()).read()
    print("read")
except PermissionError:
    print("refused")]], "^refused\n$" },
    { "may not read a file of the far side's that is not for others", ([[
try:
    open(%q).read()
    print("read")
except PermissionError:
    print("refused")]]):format(secret), "^refused\n$" },
    { "may not write into its interpreter's installation", [[
import os
try:
    open(os.path.dirname(os.__file__) + "/rlm_probe.py", "w")
    print("wrote")
except OSError as e:
    print("refused", e.errno in (1, 13, 30))]], "^refused True\n$" },
    { "may not make a namespace or mount", [[
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
a = libc.unshare(0x10000000)
b = ctypes.get_errno()
print(a, b, libc.mount(b"none", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno())]], "^%-1 1 %-1 1\n$" },
    { "may not make a setuid file", [[
import os
try:
    os.close(os.open("x", os.O_CREAT | os.O_WRONLY, 0o4755))
    print("made")
except PermissionError:
    print("refused")]], "^refused\n$" },
    { "does not hide the far side's world-readable files", [[print("read" if open("/etc/passwd").read() else "")]],
      "^read\n$" },
    { "does not hide the far side's processes", [[
import os
print(len([p for p in os.listdir("/proc") if p.isdigit()]) > 2)]], "^True\n$" },
  }
  it("holds against the REPL's code (attacks), and shows what it does not hide", function()
    local f = assert(io.open(secret, "w"))
    f:write("far side's own\n")
    f:close()
    os.execute("chmod 600 " .. secret)
    local blocks = {}
    for i, case in ipairs(attacks) do
      blocks[i] = H.fence(case[2])
    end
    blocks[#blocks + 1] = H.fence("FINAL('done')")
    local result, err = H.run(opts({ sandbox = fallback(BOTH), guardrails = false, root_llm = H.script(blocks),
      max_iterations = #blocks + 1 }))
    os.remove(secret)
    assert.is_nil(err)
    for i, case in ipairs(attacks) do
      local entry = result.history[i]
      assert.matches(case[3], entry.stdout, nil, false, case[1] .. ": " .. entry.stdout .. tostring(entry.error))
    end
  end)

  -- A far side that lies about its sandbox: the host holds it to what the
  -- keeper's hello said, and to what that mode promises.
  local lies = {
    { "says a sandbox the host does not know", [[sed -u 's/"sandbox":"seccomp"/"sandbox":"gvisor"/']],
      "sandbox_unavailable", "makes a gvisor sandbox" },
    { "ran its self-test for another mode", [[sed -u 's/"mode": "seccomp"/"mode": "bubblewrap"/']],
      "sandbox_violation", "self-test ran for a bubblewrap sandbox" },
    { "leaves a promised check out", [[sed -u 's/"canaries": {/"other": {/']], "sandbox_violation",
      "canaries (not reported)" },
    { "fails the confinement check", [[sed -u 's/"confinement":{"ok":true/"confinement":{"ok":false/']],
      "sandbox_violation", "confinement" },
  }
  for _, case in ipairs(lies) do
    it("fails closed when the far side " .. case[1], function()
      local _, err = H.run(opts({ sandbox = fallback(BOTH, "| " .. case[2]) }))
      assert.equals(case[3], err.kind)
      assert.matches(case[4], err.message, 1, true)
      assert.equals("", settled_left())
    end)
  end

  -- The fallback where it is meant to run: a container whose seccomp
  -- profile and masked /proc refuse bubblewrap (Podman's defaults), with
  -- this build's keeper and driver mounted into the project's image (make
  -- image), run as the container's root.
  local image = H.sh("podman images --format '{{.Repository}}:{{.Tag}}' 2>/dev/null | grep -m1 rlm-sandbox")
  local podman_why = image == "" and "no podman, or no rlm-sandbox image (make image)"
    or H.sh("command -v runc >/dev/null || echo 'no runc'")
  if podman_why ~= "" then
    pending("the fallback in a Podman container: " .. podman_why)
    return
  end
  it("is what rlm-keeper makes in a Podman container with its default profile", function()
    local root = os.getenv("PWD")
    local result, err = H.run(opts({
      sandbox = { backend = "exec", allow = BOTH, argv = { "sh", "-c", "cd /tmp && exec podman --runtime runc run -i "
        .. "--rm --user 0 --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 --network=none "
        .. ("-v %s/build/rlm-keeper:/opt/spec/rlm-keeper:ro -v %s/python:/opt/spec/python:ro %s "):format(root, root,
          image)
        .. "/opt/spec/rlm-keeper --driver-dir /opt/spec/python" }, start_timeout_ms = 30000 },
      root_llm = H.script({ H.fence("FINAL(str(len(context)))") }),
    }))
    assert.is_nil(err)
    assert.equals(tostring(#H.opts().context), result.answer)
    assert.equals("seccomp", result.sandbox.mode)
    assert.matches("cannot make its namespaces here", result.sandbox.detail, 1, true)
  end)
end)
