"""The rlm driver's entry, run with -I -S -B (docs/protocol.md). The driver
is the package _rlm_driver, loaded from driver.zip beside this file (or the
directory _rlm_driver/ beside it) under that private name, never from
sys.path. The interpreter compiles this file at every start: keep it short."""

import time

STARTED = time.monotonic()  # hello's "t": CLOCK_MONOTONIC, the host's clock

# posix, not os: os (with _collections_abc, stat, posixpath) costs ~2 ms.
import posix as os  # noqa: E402

# The context: the host's memfd at this descriptor, the one kept when the
# others are closed; main.load_context checks its seals, maps and closes it.
CONTEXT_FD = 4


def held_context():
    try:
        os.fstat(CONTEXT_FD)
    except OSError:
        return None
    return CONTEXT_FD


CONTEXT_DATA = held_context()

# First of all: no descriptor leaked by the host may reach untrusted code.
# SC_OPEN_MAX is the soft RLIMIT_NOFILE.
if CONTEXT_DATA is not None:
    os.closerange(3, CONTEXT_FD)
    os.closerange(CONTEXT_FD + 1, os.sysconf("SC_OPEN_MAX"))
else:
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))

import sys  # noqa: E402 (after the descriptors are closed)

PROTOCOL_VERSION = 1
PACKAGE = "_rlm_driver"
MODULES = ("protocol", "state", "api", "screen", "guard", "shield", "step", "selftest", "main")


def say_hello():
    """Before the package loads, so that the host's checks (its cgroup)
    overlap the loading; by hand: the repr of a float is its JSON text."""
    line = '{"type": "hello", "protocol": %d, "python": "%d.%d.%d", "t": [%r, %r]}\n' % (
        (PROTOCOL_VERSION,) + tuple(sys.version_info[:3]) + (STARTED, time.monotonic()))
    sys.stdout.buffer.write(line.encode("ascii"))
    sys.stdout.buffer.flush()


def number(data, at, size=2):
    return int.from_bytes(data[at:at + size], "little")


class ZipPackage:
    """Finder and loader of the package's modules in driver.zip, as probe.py
    packs it (stored, no comment). A module's bytecode is a checked
    hash-based .pyc, checked as zipimport does (magic, flags, the hash of
    the source beside it; a mismatch compiles the source). Each member is
    one pread into memory the last one freed: fresh pages cost a start
    more than anything."""

    def __init__(self, path):
        self.path, self.fd, self.members = path, os.open(path, os.O_RDONLY | os.O_CLOEXEC), {}
        end = os.pread(self.fd, 22, max(os.fstat(self.fd).st_size - 22, 0))
        cd = os.pread(self.fd, number(end, 12, 4), number(end, 16, 4)) if end[:4] == b"PK\5\6" else b""
        while cd[:4] == b"PK\1\2":  # name: (local header, its length, size)
            n, skip = number(cd, 28), number(cd, 28) + number(cd, 30) + number(cd, 32)
            self.members[cd[46:46 + n].decode()] = (number(cd, 42, 4), 30 + n + number(cd, 30),
                                                    number(cd, 20, 4), number(cd, 10))
            cd = cd[46 + skip:]
        if not self.members or cd:
            raise ImportError(f"{path} is not a zip as probe.py packs it")

    def read(self, name):
        at, skip, size, method = self.members[name]
        data = os.pread(self.fd, skip + size, at)
        if method != 0 or data[:4] != b"PK\3\4" or 30 + number(data, 26) + number(data, 28) != skip \
                or len(data) != skip + size:
            raise ImportError(f"{self.path}: {name} is not stored as probe.py stores it")
        return data[skip:]

    def find_spec(self, name, path=None, target=None):
        entry = PACKAGE + "/" + (name[len(PACKAGE) + 1:] if name != PACKAGE else "__init__") + ".py"
        if (name == PACKAGE or name.startswith(PACKAGE + ".")) and entry in self.members:
            import _frozen_importlib
            spec = _frozen_importlib.ModuleSpec(name, self, origin=f"{self.path}/{entry}",
                                                is_package=name == PACKAGE)
            spec.has_location = True
            return spec
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        import _frozen_importlib_external as external, _imp, marshal
        entry = module.__file__[len(self.path) + 1:]
        source, pyc = self.read(entry), self.read(entry + "c")
        if pyc[:4] == external.MAGIC_NUMBER and number(pyc, 4, 4) == 3 and \
                pyc[8:16] == _imp.source_hash(external._RAW_MAGIC_NUMBER, source):
            code = marshal.loads(memoryview(pyc)[16:])
        else:
            code = compile(source, module.__file__, "exec", dont_inherit=True)
        exec(code, vars(module))


def load_package():
    """The package, by its location (never on sys.path)."""
    here = __file__ if __file__.startswith("/") else os.getcwd() + "/" + __file__
    here = here.rsplit("/", 1)[0] or "/"
    try:
        finder = ZipPackage(here + "/driver.zip")
    except FileNotFoundError:
        finder = None
    if finder is not None:
        spec = finder.find_spec(PACKAGE)
        sys.meta_path.append(finder)  # for the package's modules alone
    else:
        import importlib.util
        location = here + "/" + PACKAGE
        spec = importlib.util.spec_from_file_location(
            PACKAGE, location + "/__init__.py", submodule_search_locations=[location])
    package = type(sys)(PACKAGE)  # what importlib.util.module_from_spec makes
    package.__spec__, package.__loader__, package.__file__ = spec, spec.loader, spec.origin
    package.__package__, package.__path__ = PACKAGE, spec.submodule_search_locations
    sys.modules[PACKAGE] = package
    try:
        spec.loader.exec_module(package)
        # __import__, not importlib.import_module: importlib imports warnings.
        for name in MODULES:
            __import__(f"{PACKAGE}.{name}")
    finally:
        if finder is not None:
            os.close(finder.fd)  # no descriptor left open when the host looks
    return sys.modules[f"{PACKAGE}.main"]


if __name__ == "__main__":
    say_hello()
    try:
        driver = load_package()
    except Exception:  # a driver bug, after the hello: say so on the protocol
        import traceback
        traceback.print_exc()
        sys.stdout.buffer.write(b'{"type": "fatal", "message": "driver error: the package did '
                                b'not load"}\n')
        sys.stdout.buffer.flush()
        os._exit(2)
    try:
        driver.main(CONTEXT_DATA)
    except Exception as exc:  # a driver bug: say so on the protocol, details on stderr
        import traceback
        traceback.print_exc()
        driver.fatal(f"driver error: {exc!r}")
