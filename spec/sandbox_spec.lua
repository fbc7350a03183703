-- The sandbox from the outside: it refuses to run without bubblewrap, and
-- what the REPL's code can reach, observed by running it.
local H = require("helpers")
local core = require("rlm.core")
local fence = H.fence

-- Runs `code` (guardrails off: the OS sandbox must hold on its own) and
-- returns what it printed.
local function observe(code, opts)
  local o = {
    guardrails = false,
    root_llm = H.script({ fence(code .. "\nFINAL('done')") }),
  }
  for k, v in pairs(opts or {}) do
    o[k] = v
  end
  local result, err = H.run(o)
  assert.is_nil(err, err and tostring(err))
  return result.history[1].stdout
end

-- A run whose bubblewrap is a stand-in shell script with this body.
local function run_with_bwrap(body)
  local fake = os.tmpname()
  local f = assert(io.open(fake, "w"))
  f:write("#!/bin/sh\n" .. body)
  f:close()
  os.execute("chmod 755 " .. fake)
  local result, err = H.run({ sandbox = { bwrap = fake } })
  os.remove(fake)
  return result, err
end

describe("the sandbox", function()
  after_each(H.assert_clean)

  describe("fails closed", function()
    it("gives sandbox_unavailable when bubblewrap is missing, and never starts the driver", function()
      local ran = false
      local result, err = H.run({
        sandbox = { bwrap = "/nonexistent/bwrap" },
        root_llm = function() ran = true return "" end,
      })
      assert.is_nil(result)
      assert.are.equal("sandbox_unavailable", err.kind)
      assert.matches("bubblewrap", err.message)
      assert.is_truthy(err.message:find("apt-get install bubblewrap", 1, true), err.message) -- what to install
      assert.is_false(ran)
    end)

    it("gives sandbox_unavailable when bubblewrap cannot set the sandbox up", function()
      local result, err = H.run({ sandbox = { bwrap = "/bin/false" } })
      assert.is_nil(result)
      assert.are.equal("sandbox_unavailable", err.kind)
    end)

    it("says which of its needs is missing when bubblewrap cannot make its namespaces", function()
      -- A stand-in bubblewrap that fails as a container without user
      -- namespaces makes it fail (docs/containers.md).
      local result, err = run_with_bwrap("echo 'bwrap: No permissions to creating new namespace, likely because "
        .. "the kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n")
      assert.is_nil(result)
      assert.are.equal("sandbox_unavailable", err.kind)
      assert.matches("No permissions to creating new namespace", err.message, 1, true)
      -- The hint after bubblewrap's words names the switch that is off, the
      -- container's profile, or (when neither shows) the kernel.
      local hint = err.message:match("%((.-)%)$") or ""
      assert.is_truthy(hint:find("user namespaces are off", 1, true) or hint:find("container", 1, true)
        or hint:find("the kernel refused", 1, true), err.message)
    end)

    it("waits for bubblewrap's stderr to end before it reports the exit", function()
      -- stdout ends and the process exits before its words reach stderr:
      -- the error must still carry them.
      local result, err = run_with_bwrap("exec >&-\n(sleep 0.1; echo 'bwrap: late words' >&2) &\nexit 1\n")
      assert.is_nil(result)
      assert.are.equal("sandbox_unavailable", err.kind)
      assert.matches("bwrap: late words", err.message, 1, true)
    end)

    it("survives a driver that closes its stdin: the host's writes never raise SIGPIPE", function()
      -- The pipe has no other reader once the stand-in closed its end: a
      -- write there raises SIGPIPE, which kills a host that does not ignore
      -- it (busted does not). The host keeps a reader of its own.
      local result, err = run_with_bwrap("exec 0<&- 3<&- 4<&- 5<&- 6<&- 7<&- 8<&- 9<&-\n"
        .. "exec /bin/sh -c 'echo {\\\"type\\\":\\\"hello\\\",\\\"protocol\\\":1,\\\"python\\\":\\\"3\\\"}; "
        .. "sleep 1' 10<&-\n")
      assert.is_nil(result)
      assert.is_truthy(err.kind == "sandbox_unavailable" or err.kind == "driver_exited"
        or err.kind == "protocol_error", err.kind .. ": " .. err.message)
    end)

    it("gives sandbox_unavailable when the interpreter is missing", function()
      local _, err = H.run({ sandbox = { python = "/nonexistent/python3" } })
      assert.are.equal("sandbox_unavailable", err.kind)
    end)
  end)

  describe("holds with the guardrails off", function()
    local attacks = {
      -- name, code printing a verdict, expected verdict
      { "host files", "import os\nprint(os.path.exists('/etc/passwd'), os.path.exists('/home'))", "False False" },
      { "the host's cwd", "import os\nprint(os.path.exists(" .. ("%q"):format(os.getenv("PWD") or "/work") .. "))", "False" },
      { "the secret in the host's environment", "import os\nprint('sk-spec' in repr(dict(os.environ)))", "False" },
      { "network interfaces", "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))", "['lo']" },
      { "a TCP connection", [[
import socket
try:
    socket.create_connection(('1.1.1.1', 53), timeout=1)
    print('connected')
except OSError as e:
    print('refused')]], "refused" },
      { "host processes", "import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]) <= 3)", "True" },
      { "writing outside the workdir", [[
for path in ['/usr/evil', '/evil', '/rlm/evil']:
    try:
        open(path, 'w').write('x')
        print('wrote', path)
    except OSError:
        pass
print('none')]], "none" },
      -- The driver's files are copied into the root's tmpfs (--file), no
      -- mount of their own: read-only with the root.
      { "changing the driver's files", [[
import os
paths = ['/rlm/repl_driver.pyc', '/rlm/driver.zip']
for path in paths:
    os.stat(path)  # there, so that a refusal below means something
    for what, change in [('write', lambda: open(path, 'r+b').write(b'x')),
                         ('chmod', lambda: os.chmod(path, 0o666)),
                         ('unlink', lambda: os.unlink(path)),
                         ('rename', lambda: os.rename(path, path + '.old'))]:
        try:
            change()
            print(what, path)
        except OSError:
            pass
print('none')]], "none" },
      { "the workdir", "open('/session/note', 'w').write('hi')\nprint(open('/session/note').read())", "hi" },
      { "capabilities", "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')])", "['0000000000000000']" },
    }
    for _, a in ipairs(attacks) do
      it("denies " .. a[1], function()
        local out = observe(a[2])
        assert.are.equal(a[3], (out:gsub("%s+$", "")))
      end)
    end
  end)

  describe("finds the interpreter's installation", function()
    local interpreters = { "python3" }
    local debian = "/usr/bin/python3"
    if core.find_program(debian) and core.find_program("python3") ~= debian then
      interpreters[#interpreters + 1] = debian
    end
    for _, python in ipairs(interpreters) do
      it("for " .. python .. " (" .. tostring(core.find_program(python)) .. ")", function()
        local out = observe("import sys, hashlib, decimal, zlib\nprint(sys.prefix)", { sandbox = { python = python } })
        local prefix = H.sh("env -u LD_PRELOAD " .. python .. " -I -c 'import sys; print(sys.prefix)'")
        assert.are.equal(prefix, (out:gsub("%s+$", "")))
      end)
    end
  end)

  it("binds only the interpreter's installation, read-only", function()
    local argv = core.sandbox_argv({
      bwrap = "/usr/bin/bwrap", python = "/usr/bin/python3.11", driver = "/d.py",
      workdir_bytes = 4096, ro = { "/usr/lib/python3.11", "/usr/lib/python3.11/os.py" },
    })
    local s = table.concat(argv, " ")
    assert.matches("--ro-bind /usr/lib/python3.11 /usr/lib/python3.11", s, 1, true)
    assert.is_nil(s:find("/usr/lib/python3.11/os.py", 1, true)) -- inside a bound directory
    assert.matches("--ro-bind /usr/bin/python3.11 /usr/bin/python3.11", s, 1, true)
    assert.matches("--size 4096 --tmpfs /session", s, 1, true) -- nothing of the host's disk
    assert.matches("--ro-bind /dev/null /proc/slabinfo", s, 1, true)
    assert.matches("--remount-ro /proc", s, 1, true)
    assert.is_nil(s:find("--bind /tmp", 1, true))
    assert.matches("--unshare-all", s, 1, true)
    assert.matches("--die-with-parent", s, 1, true)
    assert.matches("--new-session", s, 1, true)
    assert.is_nil(s:find("--ro-bind / ", 1, true))
    assert.is_nil(s:find("--bind /usr ", 1, true))
  end)

  describe("starts on rlm.core's thread", function()
    -- The seccomp filter and the driver's zip are one sealed memfd each,
    -- shared by every spawn; bubblewrap read()s them, so each spawn must
    -- get a description of its own, or the second would read nothing.
    it("hands every sandbox the whole filter and package, one after another and side by side", function()
      local code = "import socket\ntry:\n    socket.socket()\n    print('socket')\nexcept OSError:\n    print('denied')"
      for _ = 1, 3 do
        assert.are.equal("denied\n", observe(code))
      end
      local sessions = {}
      for i = 1, 3 do
        sessions[i] = H.session({ guardrails = false,
          root_llm = H.script({ fence(code .. "\nFINAL('done')") }) })
      end
      for i = 1, 3 do
        local result, err = sessions[i]:run()
        sessions[i]:close()
        assert.is_nil(err, err and tostring(err))
        assert.are.equal("denied\n", result.history[1].stdout)
      end
    end)

    -- /proc/<pid>/stat's process group and session.
    local function group_and_session(pid)
      local stat = H.read_file("/proc/" .. pid .. "/stat") or ""
      local pgrp, sid = stat:match("%) %S+ %d+ (%d+) (%d+)")
      return tonumber(pgrp), tonumber(sid)
    end

    it("puts the launcher in a process group of its own, and the driver in a session of its own", function()
      local s = H.session({ root_llm = H.script({ fence("print(1)"), fence("FINAL('done')") }) })
      local entry, err = s:step()
      assert.is_truthy(entry, err and tostring(err))
      local tree = s.sandbox.driver:tree()
      local host_pgrp, host_sid = group_and_session(H.pid())
      local launcher_pgrp, launcher_sid = group_and_session(tree[1])
      local driver_pgrp, driver_sid = group_and_session(tree[#tree])
      s:close()
      assert.is_truthy(host_pgrp and launcher_pgrp and driver_pgrp)
      -- A ^C in the host's terminal reaches the host's group alone.
      assert.are_not.equal(host_pgrp, launcher_pgrp)
      assert.are.equal(tree[1], launcher_pgrp)
      -- What runs inside has no terminal of the host's (bubblewrap's
      -- --new-session): a session of its own.
      assert.are_not.equal(host_sid, driver_sid)
      assert.are_not.equal(launcher_sid, driver_sid)
    end)

    it("reports a failure there as sandbox_unavailable with its cause", function()
      local spawn = core.spawn
      core.spawn = function(spec)
        spec.driver, spec.driver_pyc = "/nonexistent/repl_driver.py", nil -- its text, from that path
        return spawn(spec)
      end
      local ok, result, err = pcall(H.run, {})
      core.spawn = spawn
      assert(ok, result)
      assert.is_nil(result)
      assert.are.equal("sandbox_unavailable", err.kind)
      assert.matches("starting the sandbox: opening /nonexistent/repl_driver.py: No such file", err.message, 1, true)
    end)

    it("still raises at the call for options that are not what they must be", function()
      local base = { bwrap = "/usr/bin/bwrap", python = "/usr/bin/python3", driver = "/d.py", ro = {}, context = "" }
      local function with(k, v)
        local t = {}
        for key, val in pairs(base) do
          t[key] = val
        end
        t[k] = v
        return t
      end
      assert.has_error(function() core.spawn(with("ro", { {} })) end)
      assert.has_error(function() core.spawn(with("driver_zip", 42)) end)
      assert.has_error(function() core.spawn(with("driver_pyc", 42)) end)
      assert.has_error(function() core.spawn(with("driver_modules", { "../x.py" })) end)
      assert.has_error(function() core.spawn(with("context", false)) end)
      assert.has_error(function() core.spawn(with("max_rss", -1)) end)
    end)
  end)

  it("runs from a working directory above what it binds (/ and /usr)", function()
    for _, dir in ipairs({ "/", "/usr" }) do
      local out = H.sh(("cd %s && PWD=%s %s -e 'local H = require(\"helpers\") "
        .. "local r, e = H.run({}) print(r and r.answer or tostring(e))' 2>&1"):format(dir, dir, H.lua_name()))
      assert.are.equal("done", out)
    end
  end)
end)
