"""What the nginx host tests share: their tally, ports and /proc readers.

test.py (make test-hosts) and example.py (make openresty-example) import it
from their own directory, which is sys.path[0] when python3 runs them."""

import os
import socket


class Tally:
    """Prints one TAP-like line per case under a prefix and counts them."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.passed = 0
        self.failed = 0

    def __call__(self, ok, name, detail=None):
        if ok:
            self.passed += 1
            print("ok - %s: %s%s" % (self.prefix, name, " (%s)" % detail if detail else ""), flush=True)
        else:
            self.failed += 1
            print("not ok - %s: %s: %s" % (self.prefix, name, detail), flush=True)

    def summary(self):
        print("# %s: %d passed, %d failed" % (self.prefix, self.passed, self.failed), flush=True)
        return 1 if self.failed else 0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def state(pid):
    """A process's state letter (R, S, Z, ...), or None once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def descendants(pid):
    """Every process below pid (the sandbox's bwrap and python below a worker)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for tid in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, tid)) as f:
                    kids = [int(k) for k in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            pass
    return out


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "?"
