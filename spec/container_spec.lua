-- The container boundary (issue 27; docs/backends.md): the sandbox image
-- (make image) run by Podman with the flags docs/backends.md gives, and what
-- the boundary gives: no network, a read-only root, a user other than root,
-- the memory and process limits, the end of stdin ending the container,
-- bubblewrap's namespaces inside it (and which flag each needs), and rlm-keeper
-- as the image's command: a session over the stream. Real containers:
-- the spec imports the image's tarball into a Podman store of its own
-- (--root, --runroot, --tmpdir in a directory it made), and removes the
-- store, its containers and, rootless, its pause process at the end.
--
-- Where Podman is missing, or the image's tarball is, every case is pending
-- with the reason; under CI (CI=true) both are failures: .ci/run runs
-- `make image`, which installs Podman.
local H = require("helpers")
local P = require("helpers.podman")
local rlm = require("rlm")
local util = require("rlm.base.util")

local sh = H.sh
local CI = os.getenv("CI") == "true"
local VERSION = rlm._VERSION:match("^rlm (%S+)$")
local TAR = (os.getenv("RLM_SPEC_IMAGE_TAR") or ("build/rlm-sandbox-" .. VERSION .. ".tar"))
local IMAGE = "localhost/rlm-sandbox:" .. VERSION
local MEMORY = 128 * 2 ^ 20
local PIDS = 32

local q, words = util.shell_quote, util.shell_words

-- Podman's warning, on each run, where it starts a container without the
-- limits asked for (rootless on cgroup v1: no delegation).
local IGNORED = "Resource limits are not supported and ignored"

-- out, exit status of a shell command (stdout and stderr together, less
-- Podman's IGNORED warning: engine.setup notes it once).
local function run(cmd)
  local out = sh("(" .. cmd .. ") 2>&1; echo \"rc=$?\"")
  local text, rc = out:match("^(.-)\n?rc=(%d+)$")
  local kept = {}
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    if not line:find(IGNORED, 1, true) then
      kept[#kept + 1] = line
    end
  end
  return table.concat(kept, "\n"), tonumber(rc)
end

-- The engine: podman with a store of this spec's own and the flags this
-- host needs to start anything (docs/backends.md, "What this host needs").
local engine = { why = nil }

function engine.setup()
  local podman = P.find()
  if not podman then
    engine.why = "podman is not installed (make image installs it)"
    return
  end
  local tar = io.open(TAR, "rb")
  if not tar then
    engine.why = TAR .. " is missing (make image builds it)"
    return
  end
  tar:close()
  local host, why = P.global_flags()
  if not host then
    engine.why = why
    return
  end
  engine.podman = podman
  engine.rootless = sh("id -u") ~= "0"
  engine.dir = sh("mktemp -d /tmp/rlm-podman.XXXXXX")
  local d = engine.dir
  engine.global = { "--root", d .. "/root", "--runroot", d .. "/run", "--tmpdir", d .. "/tmp",
    "--storage-driver", "overlay" }
  for _, w in ipairs(host) do
    engine.global[#engine.global + 1] = w
  end
  -- The image as make image imports it: its user, its command.
  local out, rc = run("env -u LD_PRELOAD sandbox/image/import " .. words({ TAR, IMAGE, engine.podman }) .. " "
    .. words(engine.global))
  if rc ~= 0 then
    engine.why = "podman import failed: " .. out
    return
  end
  -- The engine's own start, with no flag of the boundary's but
  -- --network=none, which every container of ours has: if this fails, the
  -- engine cannot run here, whatever the boundary's flags. (Without it,
  -- rootless Podman needs slirp4netns, only a recommended package of
  -- Debian's podman, which make image does not install.)
  out, rc = run(engine.cmd(engine.run_args({ "--network=none" }, { "true" }, true)) .. " </dev/null")
  if rc ~= 0 then
    engine.why = "podman cannot start a container here: " .. out
    return
  end
  -- Whether --memory and --pids-limit are applied, or dropped with a word.
  out = sh(engine.cmd(engine.run_args({}, { "true" })) .. " </dev/null 2>&1")
  engine.limits_ignored = out:match("[^\n]*" .. IGNORED .. "[^\n]*")
  engine.keeper = sh(engine.cmd({ "image", "inspect", "--format", "{{.Config.Cmd}}", IMAGE }) .. " 2>&1")
    :find("rlm-keeper", 1, true) ~= nil
  engine.seccomp = d .. "/seccomp.json"
  out, rc = run("env -u LD_PRELOAD python3 sandbox/image/seccomp.py /usr/share/containers/seccomp.json "
    .. q(engine.seccomp))
  if rc ~= 0 then
    engine.why = "sandbox/image/seccomp.py failed: " .. out
  end
end

-- Podman runs in the spec's own directory: Debian 12's conmon (2.1.6)
-- leaves an empty file "oom" in its working directory when a container is
-- OOM-killed (containers/conmon#504). `make check` preloads the
-- sanitizers' runtime into the Lua: not into Podman.
function engine.cmd(args)
  return "cd " .. q(engine.dir) .. " && exec env -u LD_PRELOAD " .. words({ engine.podman }) .. " "
    .. words(engine.global) .. " " .. words(args)
end

-- The arguments of `podman run`: the boundary's flags unless bare, then
-- extra, the image and the command. ulimits overrides P.ULIMITS' (a second
-- --ulimit of the same name does not replace the first).
function engine.run_args(extra, command, bare, ulimits)
  local a = { "run", "-i", "--rm" }
  local function add(list)
    for _, w in ipairs(list) do
      a[#a + 1] = w
    end
  end
  add(P.ulimit_flags(ulimits))
  if not bare then
    add(P.boundary_flags(MEMORY, PIDS))
  end
  add(extra)
  a[#a + 1] = IMAGE
  for _, w in ipairs(command) do
    a[#a + 1] = w
  end
  return a
end

-- Runs python code in a container with the boundary's flags: out, status.
local function python(code, extra, ulimits)
  return run(engine.cmd(engine.run_args(extra or {}, { "python3", "-I", "-c", code }, false, ulimits))
    .. " </dev/null")
end

function engine.containers()
  return sh(engine.cmd({ "ps", "-a", "-q" }) .. " 2>/dev/null")
end

function engine.teardown()
  if not engine.dir then
    return
  end
  sh(engine.cmd({ "rm", "-a", "-f", "-t", "0" }) .. " >/dev/null 2>&1")
  sh(engine.cmd({ "rmi", "-a", "-f" }) .. " >/dev/null 2>&1")
  if engine.rootless then
    -- The image's files belong to the user namespace's uids, and the
    -- pause process that holds that namespace (its pid in our --tmpdir)
    -- ignores SIGTERM.
    sh(engine.cmd({ "unshare", "rm", "-rf", engine.dir .. "/root" }) .. " >/dev/null 2>&1")
    local pause = tonumber(H.read_file(engine.dir .. "/tmp/pause.pid"):match("%d+") or "")
    if pause then
      sh("kill -9 " .. pause .. " 2>/dev/null")
    end
  end
  sh("rm -rf " .. q(engine.dir))
end

-- A case that needs the engine: pending with the reason where it cannot run.
local function it_engine(name, fn)
  it(name, function()
    if engine.why then
      return pending(engine.why)
    end
    fn()
  end)
end

-- Waits up to 20 s until no container is left: after a client's end,
-- conmon removes its container (--rm) a moment later.
local function no_containers()
  local core = require("rlm.core")
  local t0, ids = core.now_ms(), engine.containers()
  while ids ~= "" and core.now_ms() - t0 < 20000 do
    sh("sleep 0.1")
    ids = engine.containers()
  end
  return ids
end

local function bwrap_flags()
  return P.bwrap_flags(engine.seccomp)
end

-- The whole argv of a container that runs the image's command
-- (rlm-keeper), from the spec's directory (engine.cmd says why).
local function keeper_argv()
  local argv = { "/bin/sh", "-c", 'cd "$0" && exec "$@"', engine.dir, engine.podman }
  for _, w in ipairs(engine.global) do
    argv[#argv + 1] = w
  end
  for _, w in ipairs(engine.run_args(bwrap_flags(), {})) do
    argv[#argv + 1] = w
  end
  return argv
end

local NO_KEEPER = "the image has no rlm-keeper as its command: rebuild it (make image)"

describe("the sandbox image under Podman", function()
  setup(function()
    engine.setup()
    if engine.why and CI then
      error(engine.why)
    end
  end)

  teardown(function()
    engine.teardown()
  end)

  after_each(function()
    if not engine.why then
      -- --rm: every container is gone once its run is over.
      assert.equals("", no_containers())
    end
    H.assert_clean()
  end)

  -- Podman gives a container a PATH when its image has none; containerd,
  -- and so the kubelet, does not: a pod's command "sleep" then fails with
  -- exec: "sleep": executable file not found in $PATH (issue 42).
  it_engine("sets PATH in the image's configuration, not only the engine's default", function()
    local env = sh(engine.cmd({ "image", "inspect", "--format", "{{json .Config.Env}}", IMAGE }) .. " 2>&1")
    assert.matches('"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"', env, 1, true)
  end)

  -- docs/backends.md gives the image's size as `podman image ls` does
  -- (issue 43: it said 95 MB in one place and 99 MB in another).
  it_engine("is the size docs/backends.md gives", function()
    local doc = assert(util.read_file("docs/backends.md")):gsub("%s+", " ")
    local said = assert(doc:match("It is ([%d.]+ [kMG]B) %(`podman image ls`"), "docs/backends.md gives no size")
    local size = sh(engine.cmd({ "image", "ls", "--format", "{{.Size}}", IMAGE }) .. " 2>&1")
    assert.are.equal(size, said)
    assert.is_nil(doc:find("%d MB image"), "docs/backends.md gives the size in a second place")
  end)

  it_engine("runs as uid 10001, not root", function()
    local out, rc = python("import os; print(os.getuid(), os.getgid())")
    assert.equals(0, rc, out)
    assert.equals("10001 10001", out)
  end)

  it_engine("has no capability, and gains none by exec", function()
    local out, rc = python("print(*[l.split()[1] for l in open('/proc/self/status') "
      .. "if l.startswith(('CapEff', 'CapBnd', 'NoNewPrivs'))])")
    assert.equals(0, rc, out)
    assert.equals("0000000000000000 0000000000000000 1", out)
  end)

  -- What unmask=/proc/* (which bubblewrap needs) shows is still guarded by
  -- the kernel's own permissions: uid 10001 without capabilities writes no
  -- sysctl and reads no kernel memory.
  it_engine("gives uid 10001 nothing to write in an unmasked /proc", function()
    local out, rc = python([[
for path, mode in (('/proc/sys/vm/drop_caches', 'w'), ('/proc/sys/kernel/core_pattern', 'w'),
                   ('/proc/sys/kernel/panic', 'w'), ('/proc/sysrq-trigger', 'w'), ('/proc/kcore', 'rb')):
    try:
        open(path, mode)
        print(path, 'opened')
    except OSError as e:
        print(path, 'refused' if e.strerror in ('Permission denied', 'No such file or directory',
                                                'Read-only file system') else e.strerror)
]], bwrap_flags())
    assert.equals(0, rc, out)
    assert.equals(table.concat({ "/proc/sys/vm/drop_caches refused", "/proc/sys/kernel/core_pattern refused",
      "/proc/sys/kernel/panic refused", "/proc/sysrq-trigger refused", "/proc/kcore refused" }, "\n"), out)
  end)

  it_engine("has no network: no interface but lo, no route", function()
    local out, rc = python("import re; dev = open('/proc/net/dev').read().splitlines()[2:]; "
      .. "print(sorted(l.split(':')[0].strip() for l in dev), len(open('/proc/net/route').read().splitlines()))")
    assert.equals(0, rc, out)
    assert.equals("['lo'] 1", out) -- the route table's header alone
  end)

  it_engine("has a read-only root; /tmp is a tmpfs", function()
    local out, rc = python([[
import os
for path in ('/x', '/usr/x', '/home/rlm/x', '/usr/local/share/rlm-keeper/x'):
    try:
        open(path, 'w')
        print(path, 'written')
    except OSError as e:
        print(path, e.strerror)
print('/tmp', [l.split()[2] for l in open('/proc/self/mounts') if l.split()[1] == '/tmp'])
]])
    assert.equals(0, rc, out)
    assert.equals(table.concat({ "/x Read-only file system", "/usr/x Read-only file system",
      "/home/rlm/x Read-only file system", "/usr/local/share/rlm-keeper/x Read-only file system",
      "/tmp ['tmpfs']" }, "\n"), out)
  end)

  it_engine("kills a container that allocates past --memory", function()
    if engine.limits_ignored then
      return pending("podman ignores --memory here (" .. engine.limits_ignored
        .. "): the keeper's own limit is all there is")
    end
    local out, rc = python([[
chunks = []
for i in range(32):
    chunks.append(bytearray(16 * 2 ** 20))
    print(16 * (i + 1), flush=True)
print('survived')
]])
    print(("\n# --memory %d MiB: killed after %s MiB, exit %d"):format(MEMORY / 2 ^ 20,
      out:match("(%d+)%s*$") or "?", rc))
    assert.equals(137, rc, out) -- SIGKILL, from the cgroup's OOM killer
    assert.is_nil(out:find("survived"))
    assert.is_true(tonumber(out:match("(%d+)%s*$")) <= MEMORY / 2 ^ 20, out)
  end)

  -- Forks until refused, children held: how many it got.
  local FORKS = [[
import os, time
n = 0
try:
    for i in range(200):
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
except OSError as e:
    print('refused after', n, e.strerror)
]]

  it_engine("refuses processes past --pids-limit", function()
    if engine.limits_ignored then
      return pending("podman ignores --pids-limit here (" .. engine.limits_ignored
        .. "): --ulimit nproc is what holds (the next case)")
    end
    local out, rc = python(FORKS)
    assert.equals(0, rc, out)
    local n = tonumber(out:match("refused after (%d+) Resource temporarily unavailable"))
    assert.is_number(n, out)
    print(("\n# --pids-limit %d: %d forks, then EAGAIN"):format(PIDS, n))
    assert.is_true(n < PIDS, out) -- python itself is one of the PIDS
  end)

  it_engine("refuses processes past --ulimit nproc, also where --pids-limit is ignored", function()
    -- RLIMIT_NPROC counts the uid's processes (rootless: outside uids
    -- included), so this is a ceiling, not an exact count.
    local out, rc = python(FORKS, {}, { nproc = 24 })
    assert.equals(0, rc, out)
    local n = tonumber(out:match("refused after (%d+) Resource temporarily unavailable"))
    assert.is_number(n, out)
    print(("\n# --ulimit nproc=24: %d forks, then EAGAIN"):format(n))
    assert.is_true(n < 24, out)
  end)

  it_engine("ends the container when its stdin ends", function()
    local t0 = os.time()
    local out, rc = run("printf 'line\\n' | (" .. engine.cmd(engine.run_args({}, { "python3", "-I", "-c",
      "import sys; print('read', len(sys.stdin.read()))" })) .. ")")
    assert.equals(0, rc, out)
    assert.equals("read 5", out)
    assert.is_true(os.time() - t0 < 20)
  end)

  it_engine("ends the container when the podman client is killed (conmon closes its stdin)", function()
    local pidfile, outfile = engine.dir .. "/client.pid", engine.dir .. "/client.out"
    -- The shell writes its pid, then becomes podman (engine.cmd execs it):
    -- io.popen holds its stdin.
    local client = assert(io.popen("echo $$ > " .. q(pidfile) .. "; " .. engine.cmd(engine.run_args({},
      { "python3", "-I", "-c", "import sys; print('up', flush=True); sys.stdin.read(); print('eof')" }))
      .. " > " .. q(outfile) .. " 2>&1", "w"))
    -- Whatever fails below, the client's stdin ends and it is reaped.
    finally(function()
      client:close()
    end)
    local core = require("rlm.core")
    local t0, up = core.now_ms(), ""
    while not up:find("up") and core.now_ms() - t0 < 20000 do
      sh("sleep 0.05")
      local f = io.open(outfile, "r")
      up = f and f:read("*a") or ""
      if f then
        f:close()
      end
    end
    assert.truthy(up:find("up"), up)
    assert.are_not.equals("", engine.containers())
    local pid = assert(tonumber(H.read_file(pidfile):match("%d+")))
    -- Rootless, podman runs itself again inside its user namespace, and
    -- that child is the client that holds the container's stdin: both go.
    -- procps without make check's preloaded ASan: pkill under it once
    -- hung on a futex for good (exec_spec's ps is run so too).
    sh("env -u LD_PRELOAD pkill -9 -P " .. pid .. "; kill -9 " .. pid)
    assert.equals("", no_containers())
  end)

  -- bubblewrap with the sandbox's namespaces and mounts (csrc/sandbox.c's
  -- head: a new user namespace and every other, no nested ones, uid 65534,
  -- its own hostname, /proc and /dev, a tmpfs workdir, the root read-only).
  local BWRAP = { "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--new-session",
    "--die-with-parent", "--cap-drop", "ALL", "--uid", "65534", "--gid", "65534", "--hostname", "rlm",
    "--proc", "/proc", "--dev", "/dev", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin", "--size", "1048576", "--tmpfs",
    "/session", "--remount-ro", "/", "--chdir", "/session", "--", "/usr/bin/python3", "-I", "-S", "-c",
    "import os, socket; print('inside', os.getuid(), socket.gethostname(), os.getcwd())" }
  local cases = {
    { "runs with /proc unmasked and the widened seccomp profile", true, true, "inside 65534 rlm /session" },
    { "cannot mount /proc where the engine masks parts of it",
      false, true, "bwrap: Can't mount proc on /newroot/proc: Operation not permitted" },
    { "cannot set its hostname under Podman's own seccomp profile",
      true, false, "bwrap: Can't set hostname to rlm: Operation not permitted" },
  }
  for _, case in ipairs(cases) do
    local name, unmask, widened, expected = case[1], case[2], case[3], case[4]
    it_engine("bubblewrap inside the container " .. name, function()
      local flags, extra = bwrap_flags(), {}
      if unmask then
        extra[#extra + 1] = flags[1]
        extra[#extra + 1] = flags[2]
      end
      if widened then
        extra[#extra + 1] = flags[3]
        extra[#extra + 1] = flags[4]
      end
      local out, rc = run(engine.cmd(engine.run_args(extra, BWRAP)) .. " </dev/null")
      assert.equals(expected, out)
      assert.equals(expected:find("^inside") and 0 or 1, rc, out)
    end)
  end

  -- rlm-keeper in the container, driven over `podman run -i`'s stdin and
  -- stdout as the exec backend drives it (docs/protocol.md, "The stream"):
  -- the keeper's own hello and checks, the driver's self-test, one exec.
  it_engine("runs a session through rlm-keeper over the container's stdin and stdout", function()
    assert(engine.keeper, NO_KEEPER)
    local core = require("rlm.core")
    local cjson = require("cjson")
    local k = assert(core.helper(keeper_argv(), 60000, 64 * 2 ^ 20))
    -- The container's stdin ends: the keeper ends, --rm removes it (after_each
    -- looks), whatever fails below.
    finally(function()
      k:close()
    end)
    local function next_line()
      local t0 = core.now_ms()
      while core.now_ms() - t0 < 30000 do
        local kind, a = k:poll(1000)
        if kind == "line" then
          return a
        elseif kind then
          error("rlm-keeper's container ended: " .. tostring(kind) .. " " .. tostring(a))
        end
      end
      error("no line from rlm-keeper within 30 s")
    end
    local hello = cjson.decode(next_line():match("^K(.*)$"))
    assert.same({ "hello", "bubblewrap" }, { hello.type, hello.sandbox })
    assert(k:send("K" .. cjson.encode({
      type = "start", protocol = 1, sandboxes = { "bubblewrap" }, max_message_bytes = 16 * 2 ^ 20, max_message_values = 65536,
      max_rss_bytes = 96 * 2 ^ 20, rss_poll_interval_ms = 50, workdir_max_bytes = 2 ^ 24,
      workdir_max_files = 1000, uid_first = 1879048192, uid_count = 65536, memory_cgroup = true,
      bind_pth_paths = false, modules = require("rlm.sandbox.bwrap").default_modules,
      allowed_modules = {}, guardrails = true, int_bits = 64,
      rlimits = { RLIMIT_NPROC = 64, RLIMIT_FSIZE = 2 ^ 24, RLIMIT_NOFILE = 64, RLIMIT_CORE = 0,
        RLIMIT_SIGPENDING = 64, RLIMIT_MSGQUEUE = 0, RLIMIT_MEMLOCK = 0 },
    })))
    local text = ("word "):rep(1000)
    assert(k:send('K{"type":"context","bytes":' .. (#text + 1) .. "}"))
    assert(k:send(text))
    assert(k:send("D" .. cjson.encode({ type = "load_context", format = "text", stdout_limit = 2000,
      rlimits = { RLIMIT_AS = 2 ^ 34, RLIMIT_CPU = 1000 } })))
    local checks, self_test
    repeat
      local line = next_line()
      if line:find('^K{"type":"checks"') then
        checks = cjson.decode(line:sub(2)).checks
      elseif line:find('^D{"type": "self_test_result"') then
        self_test = cjson.decode(line:sub(2)).checks
      end
      -- Any other word of the keeper's before ready is its end (exit,
      -- failed, memory, timeout...).
      assert.is_true(line:sub(1, 1) == "D" or checks ~= nil, "rlm-keeper: " .. line)
    until line:find('^D{"type": "ready"')
    for name, c in pairs(self_test) do
      assert.is_true(c.ok, name .. ": " .. tostring(c.detail))
    end
    for name, c in pairs(checks) do
      assert.is_true(c.ok, name .. ": " .. tostring(c.detail))
    end
    assert(k:send("D" .. cjson.encode({ type = "exec", id = 1, code = "print(context.count('word'))" })))
    local result
    repeat
      result = next_line()
    until result:find('^D{"type": "exec_result"')
    assert.equals("1000\n", cjson.decode(result:sub(2)).stdout)
  end)

  -- The same through the exec backend: a real Session whose sandbox is
  -- the container.
  it_engine("answers a session whose sandbox is the container (backend = \"exec\")", function()
    assert(engine.keeper, NO_KEEPER)
    local result, run_err = H.run({
      context = ("word "):rep(1000),
      sandbox = { backend = "exec", argv = keeper_argv() },
      root_llm = H.script({ H.fence("n = context.count('word')\nprint(llm_query(f'count {n}'))"),
        H.fence("FINAL(str(n))") }),
    })
    assert.is_nil(run_err)
    assert.equals("1000", result.answer)
    assert.equals(1, result.sub_calls)
  end)
end)
