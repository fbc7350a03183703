-- The attack suite: hostile Python run in real sessions, each case twice,
-- through the guardrails and with them off (the OS sandbox alone). Every
-- case asserts what the host observes: no canary content in any result,
-- error or event; no file created outside the workdir; the victim process
-- alive; nothing left running after close; the host's memory bounded; a
-- result or a structured err, never a raise or a hang.
local H = require("helpers")
local core = require("rlm.core")
local errors = require("rlm.base.errors")
local fence = H.fence

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  return (out:gsub("%s+$", ""))
end

local function exists(path)
  return sh("test -e '" .. path .. "' -o -L '" .. path .. "' && echo yes") == "yes"
end

local function host_rss_kb()
  return tonumber(sh("grep VmRSS /proc/" .. H.pid() .. "/status | awk '{print $2}'"))
end

-- The host's canaries, planted once for the suite.
local home = os.getenv("HOME") or "/root"
local secret = "attack-canary-" .. sh("head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
local env_secret = os.getenv("RLM_SPEC_SECRET") or "sk-spec-secret"
local canary_file = home .. "/.rlm-attack-canary"
local trap_dir = H.tmpdir .. "-trap"
local abstract = "rlm-attack-" .. sh("head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
local written = { -- where the cases try to write; none may exist afterwards
  home .. "/.rlm-attack-written", "/tmp/rlm-attack-written", "/dev/shm/rlm-attack-written",
  "/usr/rlm-attack-written",
}
local checkout = sh("pwd")
local victim, listener, leaked
local ports = {}

local function plant()
  local f = assert(io.open(canary_file, "w"))
  f:write(secret)
  f:close()
  leaked = assert(io.open(canary_file, "r")) -- no O_CLOEXEC: Lua's fopen never sets it
  sh("mkdir -p " .. trap_dir .. " && echo keep > " .. trap_dir .. "/keep")
  victim = tonumber(sh("sleep 600 >/dev/null 2>&1 & echo $!"))
  -- TCP, path and abstract unix listeners on the host, as an ssh-agent or a
  -- local database would be.
  listener = io.popen([[python3 -I -c '
import os, socket, sys, time
t = socket.socket(); t.bind(("127.0.0.1", 0)); t.listen()
u = socket.socket(socket.AF_UNIX); u.bind("]] .. H.tmpdir .. [[-agent.sock"); u.listen()
a = socket.socket(socket.AF_UNIX); a.bind("\0]] .. abstract .. [["); a.listen()
print(t.getsockname()[1], os.getpid(), flush=True)
time.sleep(600)' &]])
  local line = listener:read("*l")
  listener:close() -- reaps the shell; the listener lives on
  ports.tcp, ports.pid = assert(line, "the host listeners did not start"):match("(%d+) (%d+)")
end

local function unplant()
  os.remove(canary_file)
  if leaked then
    leaked:close()
  end
  sh("rm -rf " .. trap_dir .. " " .. H.tmpdir .. "-agent.sock")
  for _, pid in ipairs({ victim, ports.pid }) do
    sh("kill -9 " .. pid .. " 2>/dev/null; true")
  end
end

local function fill(code)
  return (code:gsub("{(%u+)}", {
    HOME = home, CANARY = canary_file, VICTIM = tostring(victim), PORT = tostring(ports.tcp),
    UNIX = H.tmpdir .. "-agent.sock", TRAP = trap_dir, ABSTRACT = abstract, CHECKOUT = checkout,
    SPECTMP = H.tmpdir,
  }))
end

-- Each case: a name, the code (it prints ESCAPED when an operation it
-- should not manage succeeds), and optional session options and checks.
local PRELUDE = [[
import os, sys, socket, time
def attempt(what, fn):
    try:
        r = fn()
        print('ESCAPED', what, repr(r)[:200])
    except BaseException as e:
        print('blocked', what, type(e).__name__)
def libc():
    import ctypes
    return ctypes.CDLL(None, use_errno=True)
def syscall_escapes(what, nr, *args):
    import ctypes
    r = libc().syscall(nr, *args)
    print(('ESCAPED' if r >= 0 else 'blocked'), what, r, ctypes.get_errno())
]]

local cases = {
  { "reads /etc/passwd", "attempt('passwd', lambda: open('/etc/passwd').read())" },
  { "reads the home canary", "attempt('home', lambda: open('{CANARY}').read())" },
  -- The interpreter may live under $HOME (pyenv): the path to it is bound,
  -- nothing beside it.
  { "lists the home directory", "print(os.listdir('{HOME}'))", deny = { ".rlm-attack-canary" } },
  { "lists /home", "attempt('/home', lambda: os.listdir('/home'))" },
  { "reads host processes in /proc", [[
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            print(p, open('/proc/%s/cmdline' % p, 'rb').read()[:80])
        except OSError:
            pass]], deny = { "busted", "lua" } },
  { "reads environments through /proc", [[
for p in os.listdir('/proc'):
    if p.isdigit() or p == 'self':
        try:
            print(p, open('/proc/%s/environ' % p, 'rb').read())
        except OSError:
            pass
print(dict(os.environ))]] },
  { "reads every descriptor from 3 to 4096", [[
for fd in range(3, 4097):
    try:
        data = os.pread(fd, 200, 0)
        print('fd', fd, data)
    except OSError:
        pass
print('scanned')]] },
  { "writes into the home directory", "attempt('home write', lambda: open('{HOME}/.rlm-attack-written', 'w').write('x'))" },
  { "writes into /tmp", "attempt('tmp write', lambda: open('/tmp/rlm-attack-written', 'w').write('x'))" },
  { "writes into /dev/shm", "attempt('shm write', lambda: open('/dev/shm/rlm-attack-written', 'w').write('x'))" },
  { "writes into /usr", "attempt('usr write', lambda: open('/usr/rlm-attack-written', 'w').write('x'))" },
  { "writes into the root", "attempt('root write', lambda: open('/rlm-attack-written', 'w').write('x'))" },
  { "sets a symlink trap for the host's cleanup", [[
os.symlink('{TRAP}', '/session/trap')
os.symlink('{TRAP}/keep', '/session/trap_file')
os.makedirs('/session/deep/' + 'd/' * 30)
os.symlink('{TRAP}', '/session/deep/' + 'd/' * 30 + 'trap')
print('planted')]] },
  { "sets a FIFO trap", "os.mkfifo('/session/fifo')\nos.mkfifo('/session/context.json')\nprint('planted')" },
  { "connects to the internet", "attempt('tcp', lambda: socket.create_connection(('1.1.1.1', 53), timeout=1))" },
  { "connects to a host listener on 127.0.0.1", "attempt('loopback', lambda: socket.create_connection(('127.0.0.1', {PORT}), timeout=1))" },
  { "connects to a host path unix socket", [[
def f():
    s = socket.socket(socket.AF_UNIX); s.connect('{UNIX}'); return s
attempt('unix path', f)]] },
  { "connects to a host abstract unix socket", [[
def f():
    s = socket.socket(socket.AF_UNIX); s.connect('\0{ABSTRACT}'); return s
attempt('abstract', f)]] },
  { "opens a netlink socket", "attempt('netlink', lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))" },
  { "opens a raw socket", "attempt('raw', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))" },
  { "opens a vsock socket", "attempt('vsock', lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM))" },
  { "kills a host process", "attempt('kill', lambda: os.kill({VICTIM}, 9))" },
  { "kills every process it can see", "attempt('kill -1', lambda: os.kill(-1, 9))" },
  { "ptraces a host process", "syscall_escapes('ptrace', 101, 16, {VICTIM}, 0, 0)", modules = { "ctypes" } },
  { "pushes keystrokes with TIOCSTI", [[
import fcntl, termios
for fd in (0, 1, 2):
    attempt('tiocsti %d' % fd, lambda: fcntl.ioctl(fd, termios.TIOCSTI, b'x'))
attempt('tty', lambda: open('/dev/tty', 'rb'))]] },
  { "pushes keystrokes with the high-bit TIOCSTI", [[
import fcntl, termios
attempt('tiocsti high', lambda: fcntl.ioctl(0, termios.TIOCSTI | (1 << 32), b'x'))
syscall_escapes('tiocsti raw', 16, 0, termios.TIOCSTI | (0xffffffff << 32), b'x')]], modules = { "ctypes" } },
  { "runs a fork bomb", [[
n = 0
while n < 10000:
    os.fork()
    n += 1
print('ESCAPED forked', n)]] },
  { "leaves a daemon behind", [[
attempt('fork', os.fork)
import threading
threading.Thread(target=lambda: time.sleep(600), daemon=False, name='rlm-attack-daemon').start()
print('thread started')]] },
  { "executes a setuid binary", "attempt('su', lambda: os.execv('/usr/bin/su', ['su']))" },
  { "replaces the driver with another program", "os.execv(sys.executable, [sys.executable, '-c', 'print(1)'])" },
  { "creates a nested user namespace", [[
syscall_escapes('unshare user', 272, 0x10000000)
if hasattr(os, 'unshare'):
    attempt('os.unshare', lambda: os.unshare(os.CLONE_NEWUSER))]], modules = { "ctypes" } },
  { "mounts a tmpfs", "import ctypes\nr = libc().mount(b'none', b'/session', b'tmpfs', 0, None)\nprint(('ESCAPED' if r == 0 else 'blocked'), 'mount', r)", modules = { "ctypes" } },
  { "joins another namespace", "syscall_escapes('setns', 308, 0, 0)", modules = { "ctypes" } },
  { "loads a BPF program", "syscall_escapes('bpf', 321, 0, 0, 0)", modules = { "ctypes" } },
  { "sets up io_uring", "import ctypes\nbuf = ctypes.create_string_buffer(120)\nsyscall_escapes('io_uring', 425, 8, buf)", modules = { "ctypes" } },
  { "opens a perf event", "syscall_escapes('perf', 298, 0, 0, -1, -1, 0)", modules = { "ctypes" } },
  { "uses the keyring", "syscall_escapes('keyctl', 250, 0, 0)", modules = { "ctypes" } },
  { "hides memory in a memfd", "attempt('memfd', lambda: os.memfd_create('hide'))" },
  { "hides memory in SysV shared memory", "syscall_escapes('shmget', 29, 0, 64 << 20, 0o1600)", modules = { "ctypes" } },
  { "hides memory in a tmpfs", "attempt('dev write', lambda: open('/dev/rlm-hide', 'wb').write(b'x' * (64 << 20)))" },
  { "exhausts descriptors", [[
fds = []
try:
    while len(fds) < 100000:
        fds.append(os.open('/dev/null', os.O_RDONLY))
except OSError as e:
    print('stopped at', len(fds), type(e).__name__)
for fd in fds:
    os.close(fd)]], check = function(out)
      local n = tonumber(out:match("stopped at (%d+)"))
      assert.is_true(n == nil or n <= 64, "RLIMIT_NOFILE did not hold: " .. out)
    end },
  { "creates a SysV message queue the host would see", [[
import ctypes
q = libc().msgget(0, 0o1600)
print('queue', q)]], modules = { "ctypes" }, ipc = true },
  { "burns CPU in many threads", [[
import threading
stop = time.time() + 0.5
def burn():
    while time.time() < stop:
        pass
ts = [threading.Thread(target=burn) for _ in range(32)]
[t.start() for t in ts]
[t.join() for t in ts]
print('burned')]] },
  { "recurses deeply", "def f(n):\n    return f(n + 1)\nf(0)" },
  { "spoofs an exec_result with FINAL on fd 1", [[
os.write(1, b'{"type":"exec_result","id":1,"stdout":"","error":null,"final":{"kind":"value","value":"pwned"}}\n')]] },
  { "floods stdout with lines", "os.write(1, b'{\"type\":\"llm_query\",\"id\":1,\"prompt\":\"x\"}\\n' * 20000)", opts = { max_sub_calls = 5 } },
  { "writes a multi-GB line with no newline", [[
chunk = b'x' * (1 << 20)
for _ in range(3 * 1024):
    os.write(1, chunk)]], bounded = true },
  { "writes invalid UTF-8", "os.write(1, b'{\"type\":\"exec_result\",\"id\":1,\"stdout\":\"\\xff\\xfe\",\"error\":null,\"final\":null}\\n')" },
  { "writes half a line and stalls", "os.write(1, b'{\"type\": \"exec_res')\ntime.sleep(60)", opts = { step_timeout_ms = 1500 } },
  { "closes its stdout", "os.close(1)\ntime.sleep(60)", opts = { step_timeout_ms = 1500 } },
  { "changes its user and root", "attempt('setuid', lambda: os.setuid(0))\nattempt('chroot', lambda: os.chroot('/session'))" },
  -- Round two (issue 12): a root host's uid, setuid files, device nodes,
  -- host sysctls, /session's quota, /proc, mountinfo.
  { "writes a setuid or setgid file in /session", [[
import stat
def made(path):
    m = os.stat(path).st_mode
    if m & (stat.S_ISUID | stat.S_ISGID):
        print('ESCAPED mode', path, oct(m))
attempt('open 04755', lambda: os.close(os.open('/session/suid', os.O_WRONLY | os.O_CREAT, 0o4755)))
open('/session/plain', 'w').write('x')
attempt('chmod 04755', lambda: os.chmod('/session/plain', 0o4755))
attempt('chmod 02755', lambda: os.chmod('/session/plain', 0o2755))
fd = os.open('/session/plain', os.O_RDONLY)
attempt('fchmod 06755', lambda: os.fchmod(fd, 0o6755))
attempt('mkdir 02755', lambda: os.mkdir('/session/sgid', 0o2755))
attempt('mknod', lambda: os.mknod('/session/node', 0o600 | stat.S_IFCHR, os.makedev(1, 7)))
for name in os.listdir('/session'):
    made('/session/' + name)
syscall_escapes('fchmodat2', 452, -100, b'/session/plain', 0o4755, 0)
print('openat2', libc().syscall(437, -100, b'/session/x', 0, 0), ctypes.get_errno())
syscall_escapes('setxattr', 188, b'/session/plain', b'security.capability', b'x', 1, 0)
made('/session/plain')]], modules = { "ctypes", "stat" } },
  { "changes a host device node's mode", [[
for dev in ('/dev/full', '/dev/null'):
    mode = os.stat(dev).st_mode & 0o7777  # to what it is: nothing changes even if it works
    attempt('chmod ' + dev, lambda: os.chmod(dev, mode))]] },
  { "opens a host sysctl for writing", [[
attempt('sysctl', lambda: os.open('/proc/sys/kernel/printk_ratelimit', os.O_WRONLY))
attempt('core_pattern', lambda: os.open('/proc/sys/kernel/core_pattern', os.O_WRONLY))
attempt('sysrq', lambda: os.open('/proc/sysrq-trigger', os.O_WRONLY))]] },
  { "reads host-global kernel state in /proc", [[
for name in ('slabinfo', 'kpageflags', 'kpagecount', 'timer_list', 'keys', 'key-users', 'kallsyms',
             'modules', 'sched_debug', 'vmallocinfo', 'iomem', 'interrupts', 'zoneinfo'):
    def read(name=name):
        data = open('/proc/' + name, 'rb').read(64)
        if not data:
            raise EOFError
        return data
    attempt('/proc/' + name, read)
for name in ('irq', 'bus', 'acpi', 'scsi', 'driver', 'fs'):
    def listing(name=name):
        entries = os.listdir('/proc/' + name)
        if not entries:
            raise EOFError
        return entries
    attempt('/proc/' + name, listing)]] },
  -- Checked inside: the whole of mountinfo is longer than the output the
  -- host is shown. A bind shows its path in its filesystem, so the
  -- driver's is looked for in that form too.
  { "reads host paths from mountinfo", [[
m = open('/proc/self/mountinfo').read()
for w in ('{CHECKOUT}', '{SPECTMP}', '/python/repl_driver.py', '/python/_rlm_driver'):
    if w in m:
        print('ESCAPED mountinfo shows', w)
print(len(m.splitlines()), 'mounts')]] },
  { "fills /session past max_rss_bytes where no cgroup counts it", [[
chunk = b'x' * (8 << 20)
with open('/session/fill', 'wb') as f:
    for i in range(75):
        f.write(chunk)
print('ESCAPED wrote 600 MiB')]], kind = "memory_limit",
    opts = { sandbox = { memory_cgroup = false, workdir_max_bytes = 2 ^ 30 }, max_rss_bytes = 256 * 2 ^ 20, } },
  { "writes past workdir_max_bytes", [[
chunk = b'x' * (8 << 20)
with open('/session/fill', 'wb') as f:
    for i in range(40):
        f.write(chunk)
print('ESCAPED wrote 320 MiB')]], opts = { max_rss_bytes = 2 ^ 31 } },
  { "makes 100k files in /session", [[
for i in range(100000):
    open('/session/f%d' % i, 'w').close()
print('ESCAPED made 100k files')]], kind = "memory_limit", close_ms = 100 },
  { "starts 401 threads under RLIMIT_NPROC 64 with no pids cgroup", [[
import threading
ev = threading.Event()
started = 0
try:
    for _ in range(401):
        threading.Thread(target=ev.wait).start()
        started += 1
except RuntimeError:
    pass
ev.set()
print('started', started)]], opts = { sandbox = { memory_cgroup = false } }, check = function(out)
      local n = tonumber(out:match("started (%d+)"))
      assert.is_true(n ~= nil and n < 64, "RLIMIT_NPROC did not hold: " .. out)
    end },
}

local function run_case(case, guardrails)
  local events, sandbox_pids, session = {}, {}, nil
  local root = H.script({ fence(PRELUDE .. fill(case[2])), fence("FINAL('done')") })
  local opts = {
    guardrails = guardrails,
    sandbox = { allowed_modules = case.modules },
    step_timeout_ms = 10000,
    max_iterations = 2,
    root_llm = root,
    on_event = function(ev)
      events[#events + 1] = ev
      -- The whole tree once it is up (step_start may come before it).
      if ev.type == "sandbox_ready" then
        for _, pid in ipairs(session.sandbox.driver:tree()) do
          sandbox_pids[#sandbox_pids + 1] = pid
        end
      end
    end,
  }
  for k, v in pairs(case.opts or {}) do
    opts[k] = v
  end
  local rss_before = host_rss_kb()
  local queues_before = case.ipc and sh("ipcs -q | grep -c '^0x' || true")
  local dev_modes = sh("stat -c %a /dev/full /dev/null")
  session = H.session(opts)
  local ok, result, err = pcall(session.run, session)
  local t0 = require("rlm.core").now_ms()
  session:close()
  local close_ms = require("rlm.core").now_ms() - t0
  assert.are.equal(dev_modes, sh("stat -c %a /dev/full /dev/null"), "a host device node changed")
  if case.close_ms then
    assert.is_true(close_ms < case.close_ms, ("close() took %.1f ms"):format(close_ms))
  end
  -- Through the guardrails the code cannot even start (no open, os or
  -- threading): what the OS layer must do is checked with them off.
  if case.kind and not guardrails then
    assert.is_true(ok and not result and err.kind == case.kind,
      "wanted " .. case.kind .. ", got " .. tostring(result and "a result" or err))
  end
  assert.is_true(ok, "the session raised: " .. tostring(result))
  if case.bounded then
    assert.is_true(host_rss_kb() - rss_before < 64 * 1024, "host memory grew")
  end
  if not result then
    assert.is_true(errors.kinds[err.kind] ~= nil, "not a structured err")
  end
  -- The attack ran: the sandbox started and the model's code was sent.
  assert.is_true(#root.calls >= 1 and (result ~= nil or not err.kind:match("^sandbox_")),
    "the attack never ran: " .. tostring(err))
  assert.is_true(#sandbox_pids >= 3, "the sandbox's processes were not seen")
  -- close() hands the kill and the reaping to rlm.core's keeper thread:
  -- done within moments (allowed 5 s).
  local gone_by = core.now_ms() + 5000
  local function any_left()
    for _, pid in ipairs(sandbox_pids) do
      if exists("/proc/" .. pid) then
        return true
      end
    end
  end
  while any_left() and core.now_ms() < gone_by do
    local w = assert(core.waitset())
    w:wait(10)
    w:close()
  end
  for _, pid in ipairs(sandbox_pids) do
    assert.is_false(exists("/proc/" .. pid), "sandbox process " .. pid .. " outlived the session")
  end
  local history = (result or err).history or {}
  if case.check and history[1] and not guardrails then
    case.check(history[1].stdout)
  end
  if case.ipc then
    assert.are.equal(queues_before, sh("ipcs -q | grep -c '^0x' || true"), "a queue appeared on the host")
  end
  -- Everything the host was told, in one string to search.
  local seen = { tostring(err), result and result.answer or "" }
  for _, entry in ipairs(history) do
    seen[#seen + 1] = tostring(entry.stdout) .. tostring(entry.error)
  end
  for _, ev in ipairs(events) do
    seen[#seen + 1] = tostring(ev.stdout) .. tostring(ev.error) .. tostring(ev.prompt)
  end
  seen = table.concat(seen, "\n")
  assert.is_nil(seen:find(secret, 1, true), "the home canary leaked")
  assert.is_nil(seen:find(env_secret, 1, true), "the host's environment leaked")
  assert.is_nil(seen:find("root:x:0:0", 1, true), "/etc/passwd leaked")
  assert.is_nil(seen:find("ESCAPED", 1, true), "an operation succeeded: " .. (seen:match("ESCAPED[^\n]*") or ""))
  for _, word in ipairs(case.deny or {}) do
    assert.is_nil(seen:find(word, 1, true), word .. " leaked")
  end
  for _, path in ipairs(written) do
    assert.is_false(exists(path), path .. " was created")
  end
  assert.is_true(exists("/proc/" .. victim), "the victim process died")
  assert.is_true(exists(trap_dir .. "/keep"), "the host's cleanup followed a symlink")
end

describe("the attack suite", function()
  setup(plant)
  teardown(unplant)
  after_each(H.assert_clean)

  for _, guardrails in ipairs({ true, false }) do
    describe(guardrails and "through the guardrails" or "with the guardrails off", function()
      for _, case in ipairs(cases) do
        it("holds when the code " .. case[1], function()
          run_case(case, guardrails)
        end)
      end
    end)
  end

  it("has at least 58 cases", function()
    assert.is_true(#cases >= 58)
  end)
end)
