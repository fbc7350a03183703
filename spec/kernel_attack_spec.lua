-- Kernel memory and the host user's kernel limits (issue 33): hostile code
-- that holds what no process's RSS shows (SysV message queues, pipe
-- buffers, memfd_secret pages), or uses up a budget the kernel keeps per
-- host user (inotify instances, queued signals, pipe pages). Each case runs
-- where only the RSS poll guards memory (memory_cgroup = false) with the
-- guardrails off (the OS layer alone: through them the code cannot even
-- import os), and the host looks while the sandbox still holds what it
-- made: the root model's second turn, run on the host after the attack's
-- step, measures /proc/meminfo, the sandbox's pipes (through
-- /proc/<pid>/fd) and its own pipe, inotify and signal budgets. Each case
-- prints those figures beside the ones taken before the session.
local H = require("helpers")

local sh = H.sh

local function meminfo()
  local f = assert(io.open("/proc/meminfo", "r"))
  local text = f:read("*a")
  f:close()
  return {
    sunreclaim = tonumber(text:match("SUnreclaim:%s*(%d+)")),
    mlocked = tonumber(text:match("Mlocked:%s*(%d+)")),
  }
end

-- What the host user can still get (a new pipe's size, an inotify
-- instance, a queued signal, a POSIX timer), and what the sandbox's pipes
-- hold and may hold (each pipe once, by inode): "key value" lines.
local PROBE = [[
import ctypes, fcntl, os, signal, sys, termios
libc = ctypes.CDLL(None, use_errno=True)
def result(r):
    return 'ok' if r >= 0 else os.strerror(ctypes.get_errno())
r, w = os.pipe()
print('pipe_size', fcntl.fcntl(w, 1032))
print('inotify', result(libc.inotify_init1(0)).replace(' ', '_'))
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
print('sigqueue', result(libc.sigqueue(os.getpid(), signal.SIGRTMIN, 0)).replace(' ', '_'))
timer = ctypes.c_void_p()
print('timer_create', result(libc.timer_create(1, None, ctypes.byref(timer))).replace(' ', '_'))
seen, size, held, locked = set(), 0, 0, 0
for pid in sys.argv[1:]:
    try:
        for line in open('/proc/%s/status' % pid):
            if line.startswith('VmLck:'):
                locked += int(line.split()[1])
        fds = os.listdir('/proc/%s/fd' % pid)
    except OSError:
        continue
    for fd in fds:
        path = '/proc/%s/fd/%s' % (pid, fd)
        try:
            ino = os.readlink(path)
            if not ino.startswith('pipe:') or ino in seen:
                continue
            seen.add(ino)
            p = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        size += fcntl.fcntl(p, 1032)
        n = ctypes.c_int()
        fcntl.ioctl(p, termios.FIONREAD, n)
        held += n.value
        os.close(p)
print('sandbox_pipes', len(seen))
print('sandbox_pipe_kib', size // 1024)
print('sandbox_pipe_held_kib', held // 1024)
print('sandbox_vmlck_kib', locked)
]]

local function probe(pids)
  local path = H.tmpdir .. "/kernel-probe.py"
  local f = assert(io.open(path, "w"))
  f:write(PROBE)
  f:close()
  local out = sh("python3 -I " .. path .. " " .. table.concat(pids or {}, " ") .. " 2>&1")
  os.remove(path)
  local t = meminfo()
  for k, v in out:gmatch("(%S+) (%S+)") do
    t[k] = tonumber(v) or v
  end
  assert(t.pipe_size, "the host probe failed: " .. out)
  return t
end

-- The hostile code. refused() prints ESCAPED unless the call failed with
-- EPERM (what the filter answers): a call that fails otherwise (EINVAL for
-- a queue id that does not exist) was not stopped by the sandbox.
local PRELUDE = [[
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
held = []
def refused(what, r):
    e = ctypes.get_errno()
    if r >= 0 or e != 1:
        print('ESCAPED', what, r, os.strerror(e) if r < 0 else '')
        return False
    print('refused', what)
    return True
]]

local MiB = 2 ^ 20

local cases = {
  { "queues 384 MiB in SysV message queues under max_rss_bytes = 128 MiB", [[
buf = ctypes.create_string_buffer(8 + 8192)
ctypes.memset(ctypes.addressof(buf) + 8, 120, 8192)
ctypes.c_long.from_buffer(buf).value = 1
queued = 0
while queued < (384 << 20):
    q = libc.msgget(0, 0o1600)
    if q < 0:
        break
    n = 0
    while libc.msgsnd(q, buf, 8192, 0o4000) == 0:
        n += 1
    queued += n * 8192
    if n == 0:
        break
print('queued_kib', queued >> 10)
refused('msgget', libc.msgget(0, 0o1600))
refused('msgsnd', libc.msgsnd(0, buf, 8192, 0o4000))
refused('msgrcv', libc.msgrcv(0, buf, 8192, 0, 0o4000))
refused('semget', libc.semget(0, 1, 0o1600))
refused('semop', libc.semop(0, buf, 1))
refused('shmget', libc.shmget(0, 1 << 20, 0o1600))
libc.shmat.restype = ctypes.c_long
refused('shmat', libc.shmat(0, None, 0))
refused('mq_open', libc.mq_open(b'/rlm-attack', os.O_CREAT | os.O_RDWR, 0o600, None))
import resource
print('msgqueue_limit', resource.getrlimit(resource.RLIMIT_MSGQUEUE))
]], max_rss = 128 * MiB, check = function(out, before, during)
      local grew = during.sunreclaim - before.sunreclaim
      assert.is_true(grew < 64 * 1024, ("the host's SUnreclaim grew by %d KiB"):format(grew))
      local queued = tonumber(out:match("queued_kib (%d+)"))
      assert.is_true(queued == 0, "the sandbox queued " .. tostring(queued) .. " KiB")
      -- Behind the filter's mq_open: no POSIX queue's bytes either.
      assert.is_truthy(out:find("msgqueue_limit (0, 0)", 1, true), "RLIMIT_MSGQUEUE is not 0: " .. out)
    end },
  { "holds pipe buffers past max_rss_bytes = 24 MiB with F_SETPIPE_SZ", [[
import fcntl
resized, opened = 0, 0
try:
    while opened < 512:
        r, w = os.pipe()
        held.append((r, w))
        opened += 1
        os.set_blocking(w, False)
        try:
            fcntl.fcntl(w, 1031, 1 << 20)
            resized += 1
        except OSError:
            pass
        try:
            while True:
                os.write(w, b'x' * 65536)
        except BlockingIOError:
            pass
except OSError as e:
    print('stopped', os.strerror(e.errno))
print('pipes', opened, 'resized', resized, 'size', fcntl.fcntl(held[0][1], 1032))
if resized:
    print('ESCAPED F_SETPIPE_SZ', resized)
print('getfl', fcntl.fcntl(held[0][1], fcntl.F_GETFL) & os.O_NONBLOCK != 0)
]], max_rss = 24 * MiB, check = function(out, _, during)
      assert.are.equal(65536, during.pipe_size, "a new host pipe got " .. during.pipe_size .. " bytes")
      assert.is_true(during.sandbox_pipe_held_kib < 4096,
        ("the sandbox's pipes held %d KiB"):format(during.sandbox_pipe_held_kib))
      assert.is_truthy(out:find("getfl True", 1, true), "fcntl's other commands failed: " .. out)
    end },
  { "locks pages with memfd_secret and mlock", [[
import mmap
fd = libc.syscall(447, 0)
if not refused('memfd_secret', fd):
    size = 8 << 20
    while size > 0 and os.ftruncate(fd, size) is None:
        try:
            m = mmap.mmap(fd, size)
            break
        except OSError:
            size -= 1 << 20
    if size:
        m.write(b'x' * size)
        held.append(m)
    print('secret_kib', size >> 10)
buf = ctypes.create_string_buffer(4 << 20)
refused('mlock', libc.mlock(buf, 4 << 20))
held.append(buf)
]], max_rss = 128 * MiB, check = function(_, before, during)
      local grew = during.mlocked - before.mlocked
      assert.is_true(grew < 1024, ("the host's Mlocked grew by %d KiB"):format(grew))
      assert.are.equal(0, during.sandbox_vmlck_kib, "the sandbox locked pages")
    end },
  { "takes the host user's inotify and fanotify instances", [[
made = 0
while made < 1024:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    made += 1
print('inotify', made)
refused('inotify_init1', libc.inotify_init1(0))
refused('inotify_init', libc.inotify_init())
refused('fanotify_init', libc.fanotify_init(0x200, 0))
]], max_rss = 128 * MiB, check = function(_, _, during)
      assert.are.equal("ok", during.inotify, "the host's inotify_init1 failed: " .. during.inotify)
    end },
  { "queues the host user's pending signals and timers", [[
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
libc.pthread_self.restype = ctypes.c_ulong
me = ctypes.c_ulong(libc.pthread_self())
queued = 0
while queued < 200000 and libc.pthread_sigqueue(me, signal.SIGRTMIN, 0) == 0:
    queued += 1
timers = 0
timer = ctypes.c_void_p()
while timers < 200000 and libc.timer_create(1, None, ctypes.byref(timer)) == 0:
    timers += 1
print('signals', queued, 'timers', timers)
if queued + timers > 64:
    print('ESCAPED queued', queued + timers)
]], max_rss = 128 * MiB, check = function(_, _, during)
      assert.are.equal("ok", during.sigqueue, "the host's sigqueue failed: " .. during.sigqueue)
      assert.are.equal("ok", during.timer_create, "the host's timer_create failed: " .. during.timer_create)
    end },
}

local MODULES = { "ctypes", "fcntl", "signal", "mmap", "resource" }

local function run_case(case)
  local session, pids, during = nil, {}, nil
  local before = probe()
  local root = H.script({
    H.fence(PRELUDE .. case[2]),
    function()
      during = probe(pids)
      return H.fence("FINAL('done')")
    end,
  })
  session = H.session({
    guardrails = false,
    sandbox = { allowed_modules = MODULES, memory_cgroup = false },
    max_rss_bytes = case.max_rss,
    step_timeout_ms = 20000,
    max_iterations = 2,
    root_llm = root,
    on_event = function(ev)
      -- The whole tree once it is up (step_start may come before it).
      if ev.type == "sandbox_ready" and #pids == 0 then
        for _, pid in ipairs(session.sandbox.driver:tree()) do
          pids[#pids + 1] = pid
        end
      end
    end,
  })
  local ok, result, err = pcall(session.run, session)
  session:close()
  assert.is_true(ok, "the session raised: " .. tostring(result))
  assert.is_truthy(result, "the run failed: " .. tostring(err))
  assert.is_truthy(during, "the host never looked")
  local out = result.history[1].stdout
  print(("\n%s\n  in the sandbox: %s\n  host: SUnreclaim %+.1f MiB, Mlocked %+.1f MiB,"
    .. " a new pipe %d B, inotify_init1 %s, sigqueue %s, timer_create %s;"
    .. " the sandbox's %d pipes hold %d KiB of %d KiB, VmLck %d KiB")
    :format(case[1], (out:gsub("\n", "; ")), (during.sunreclaim - before.sunreclaim) / 1024,
      (during.mlocked - before.mlocked) / 1024, during.pipe_size, during.inotify, during.sigqueue,
      during.timer_create, during.sandbox_pipes, during.sandbox_pipe_held_kib, during.sandbox_pipe_kib,
      during.sandbox_vmlck_kib))
  case.check(out, before, during)
  assert.is_nil(out:find("ESCAPED", 1, true), "an operation succeeded: " .. (out:match("ESCAPED[^\n]*") or ""))
end

describe("kernel memory and the host user's kernel limits", function()
  after_each(H.assert_clean)
  for _, case in ipairs(cases) do
    it("holds when the code " .. case[1], function()
      run_case(case)
    end)
  end
end)
