"""The package's loader, run by the entry script (python/repl_driver.py)
before any other module of the package: it loads them from driver.zip (or
the directory) under the package's private name and runs main's message
loop. Its own bytecode is the zip's first member, checked against its
source, the second (probe.py packs them so), as it checks the others.
"""

import posix as os
import sys

PACKAGE = "_rlm_driver"
# What the start needs, loaded first; and what only a step needs, read from
# the zip now (its descriptor is closed before the host looks) and loaded
# later (main.first_step_modules), in the driver's first idle spell.
MODULES = ("protocol", "state", "api", "selftest", "main")
LATER = ("tree", "screen", "shield", "guard", "prose", "step")


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
        self.path, self.fd, self.members, self.held = path, os.open(path, os.O_RDONLY | os.O_CLOEXEC), {}, {}
        end = os.pread(self.fd, 22, max(os.fstat(self.fd).st_size - 22, 0))
        cd = os.pread(self.fd, number(end, 12, 4), number(end, 16, 4)) if end[:4] == b"PK\5\6" else b""
        while cd[:4] == b"PK\1\2":  # name: (local header, its length, size)
            n, skip = number(cd, 28), number(cd, 28) + number(cd, 30) + number(cd, 32)
            self.members[cd[46:46 + n].decode()] = (number(cd, 42, 4), 30 + n + number(cd, 30),
                                                    number(cd, 20, 4), number(cd, 10))
            cd = cd[46 + skip:]
        if not self.members or cd:
            raise ImportError(f"{path} is not a zip as probe.py packs it")

    def hold(self, modules):
        """Reads the members of `modules` now, for read() once the zip is closed."""
        for module in modules:
            for entry in (f"{PACKAGE}/{module}.py", f"{PACKAGE}/{module}.pyc"):
                self.held[entry] = self.read(entry)

    def read(self, name):
        if name in self.held:
            return self.held.pop(name)
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


def load_package(here):
    """The package, from the directory `here` (never on sys.path)."""
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
        if finder is not None:
            finder.hold(LATER)
    finally:
        if finder is not None:
            os.close(finder.fd)  # no descriptor left open when the host looks
    return sys.modules[f"{PACKAGE}.main"]


def run(here, context_data):
    """Load the package, then its message loop; a driver bug is said on the
    protocol, its details on stderr."""
    try:
        driver = load_package(here)
    except Exception:
        import traceback
        traceback.print_exc()
        sys.stdout.buffer.write(b'{"type": "fatal", "message": "driver error: the package did '
                                b'not load"}\n')
        sys.stdout.buffer.flush()
        os._exit(2)
    try:
        driver.main(context_data)
    except Exception as exc:
        import traceback
        traceback.print_exc()
        driver.fatal(f"driver error: {exc!r}")
    # End of file: the session is over, and the host is killing the sandbox
    # by now. No finalization (it would free every object one by one, some
    # milliseconds of CPU, and wait for the REPL's threads), only stderr's
    # last bytes.
    try:
        sys.__stderr__.flush()
    finally:
        os._exit(0)
