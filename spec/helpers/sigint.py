"""sigint.py MARKER CMD...: runs CMD, waits (up to 20 s) for MARKER on its
stderr and 300 ms more, sends it SIGINT, and waits (up to 10 s, then
SIGKILL) for it to exit. Prints one JSON object: started (the marker came),
exit_ms (from the signal to the exit), status, stdout, stderr, sandbox (how
many of its descendants there were when the signal went) and left (those of
them still alive, not zombies, 500 ms after its exit)."""
import json, os, signal, subprocess, sys, time

marker = sys.argv[1].encode()
p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
os.set_blocking(p.stderr.fileno(), False)
err, deadline = b"", time.time() + 20
while marker not in err and time.time() < deadline and p.poll() is None:
    time.sleep(0.01)
    err += p.stderr.read() or b""
started = marker in err
time.sleep(0.3)


def descendants(pid):
    found, todo = [], [pid]
    while todo:
        for task in os.listdir("/proc/%d/task" % todo[0]) if os.path.isdir("/proc/%d/task" % todo[0]) else []:
            try:
                with open("/proc/%d/task/%s/children" % (todo[0], task)) as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                kids = []
            found += kids
            todo += kids
        todo.pop(0)
    return found


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


before = descendants(p.pid)
t0 = time.time()
p.send_signal(signal.SIGINT)
try:
    p.wait(timeout=10)
except subprocess.TimeoutExpired:
    p.kill()
    p.wait()
exit_ms = (time.time() - t0) * 1000
os.set_blocking(p.stderr.fileno(), True)
err += p.stderr.read()
out = p.stdout.read()
time.sleep(0.5)
print(json.dumps({"started": started, "exit_ms": exit_ms, "status": p.returncode,
                  "stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace"),
                  "sandbox": len(before), "left": [q for q in before if alive(q)]}))
