"""The rlm driver's entry, run with -I -S -B (docs/protocol.md). The sandbox
gets it as bytecode (probe.py's entry_pyc, /rlm/repl_driver.pyc), so that
no start compiles it; the package _rlm_driver beside it (in driver.zip, as
bytecode) does the rest, from its loader module, never from sys.path."""

import time

STARTED = time.monotonic()  # hello's "t": CLOCK_MONOTONIC, the host's clock

import posix  # noqa: E402 (not os, which costs ~2 ms)

# First of all: no descriptor the host leaked may reach untrusted code. 4 is
# kept: the context's memfd, which main.load_context checks, maps, closes.
try:
    CONTEXT_DATA = posix.fstat(4) and 4
except OSError:
    CONTEXT_DATA = None
posix.closerange(3, 4)
posix.closerange(5, posix.sysconf("SC_OPEN_MAX"))  # the soft RLIMIT_NOFILE

import sys  # noqa: E402

# The hello, by hand (a float's repr is its JSON text), before the package
# loads: the host's checks (the cgroup) overlap the loading.
sys.stdout.buffer.write(('{"type": "hello", "protocol": 1, "python": "%d.%d.%d", "t": [%r, %r]}\n' % (
    tuple(sys.version_info[:3]) + (STARTED, time.monotonic()))).encode())
sys.stdout.buffer.flush()


def loader_code(here):
    """The code of _rlm_driver/loader.py: the zip's first member, its .pyc,
    checked against the second, its source, as zipimport would (a mismatch
    compiles the source); without a zip, the file's source."""
    path = here + "/_rlm_driver/loader.py"
    try:
        fd = posix.open(here + "/driver.zip", posix.O_RDONLY | posix.O_CLOEXEC)
    except FileNotFoundError:
        with open(path, "rb") as f:
            return compile(f.read(), path, "exec", dont_inherit=True)
    members, at = [], 0
    try:
        for name in (b"_rlm_driver/loader.pyc", b"_rlm_driver/loader.py"):
            head = posix.pread(fd, 30 + len(name), at)  # the local header and name
            at += 30 + len(name) + int.from_bytes(head[28:30], "little")
            size = int.from_bytes(head[18:22], "little")
            members.append(posix.pread(fd, size, at))
            at += size
            if head[:4] != b"PK\3\4" or head[8:10] != b"\0\0" or head[30:] != name \
                    or int.from_bytes(head[26:28], "little") != len(name) or len(members[-1]) != size:
                raise ImportError(f"{here}/driver.zip does not start with {name.decode()}")
    finally:
        posix.close(fd)
    import _frozen_importlib_external as external, _imp, marshal
    pyc, source = members
    if pyc[:8] == external.MAGIC_NUMBER + b"\3\0\0\0" and \
            pyc[8:16] == _imp.source_hash(external._RAW_MAGIC_NUMBER, source):
        return marshal.loads(memoryview(pyc)[16:])
    return compile(source, here + "/driver.zip/_rlm_driver/loader.py", "exec", dont_inherit=True)


if __name__ == "__main__":
    HERE = (__file__ if __file__.startswith("/") else posix.getcwd() + "/" + __file__).rpartition("/")[0]
    try:
        loader = sys.modules["_rlm_driver.loader"] = type(sys)("_rlm_driver.loader")
        exec(loader_code(HERE or "/"), vars(loader))
    except Exception:  # a driver bug, after the hello: say so on the protocol
        import traceback
        traceback.print_exc()
        sys.stdout.buffer.write(b'{"type": "fatal", "message": "driver error: the package did '
                                b'not load"}\n')
        sys.stdout.buffer.flush()
        posix._exit(2)
    loader.run(HERE or "/", CONTEXT_DATA)
