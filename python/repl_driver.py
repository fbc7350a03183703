"""The rlm driver: runs model-written Python for the Lua host, in the sandbox.

It speaks the line-delimited JSON protocol of docs/protocol.md on stdin and
stdout. The OS sandbox around this process is the security boundary; the
guardrails here only keep a confused model on the rails.

This file is the entry point, run with -I -S; the driver itself is the
package _rlm_driver beside it, loaded by path under that private name and
never put on sys.path.
"""

import time

STARTED = time.monotonic()  # the start-up phases (hello's "t"): CLOCK_MONOTONIC, the host's clock

# posix under os's name: the functions used here are posix's own, and os
# itself (with the _collections_abc, stat and posixpath it imports) costs
# the start about 2 ms. Nothing the driver imports at its start imports os.
import posix as os  # noqa: E402

# The context: a memfd the host hands over at this descriptor, the one
# descriptor kept when the others are closed. A cold start's is written and
# sealed before the spawn; a pooled sandbox's is empty until a session takes
# the sandbox and the host writes and seals it. Either way load_context
# checks the seals, maps it and closes it, before any model code runs.
# (Mapping it here would leave mmap's own dup of it among the descriptors
# closed below, for the mapping's close to close again later.)
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


def say_hello():
    """The hello (docs/protocol.md), before the package is imported: the
    host's checks after it (the memory cgroup) overlap the imports. Written
    by hand, the json codec being in the package: the repr of a float is
    its JSON text."""
    line = '{"type": "hello", "protocol": %d, "python": "%d.%d.%d", "t": [%r, %r]}\n' % (
        (PROTOCOL_VERSION,) + tuple(sys.version_info[:3]) + (STARTED, time.monotonic()))
    sys.stdout.buffer.write(line.encode("ascii"))
    sys.stdout.buffer.flush()


PACKAGE = "_rlm_driver"
MODULES = ("protocol", "state", "api", "screen", "guard", "shield", "step", "selftest")


def package_spec(here):
    """Where the package is: in the sandbox, the zip the host copied in
    (driver.zip: each module's source and its bytecode, which zipimport
    checks against the source); elsewhere, the directory beside this file."""
    archive = here + "/driver.zip"
    if exists(archive):
        import zipimport
        importer = zipimport.zipimporter(archive)
        if hasattr(importer, "find_spec"):  # 3.10+
            return importer.find_spec(PACKAGE)
        import _frozen_importlib  # 3.8 and 3.9: importlib.util's, without importlib
        return _frozen_importlib.spec_from_loader(PACKAGE, importer, is_package=True)
    import importlib.util
    location = here + "/" + PACKAGE
    return importlib.util.spec_from_file_location(
        PACKAGE, location + "/__init__.py", submodule_search_locations=[location])


def exists(path):
    try:
        os.stat(path)
    except OSError:
        return False
    return True


def entry_directory():
    """os.path.dirname(os.path.abspath(__file__))."""
    path = __file__ if __file__.startswith("/") else os.getcwd() + "/" + __file__
    return path.rsplit("/", 1)[0] or "/"


def load_package():
    """The package, by its location: that is never on sys.path, so nothing
    else can import it from there."""
    spec = package_spec(entry_directory())
    package = type(sys)(PACKAGE)  # what importlib.util.module_from_spec makes
    package.__spec__, package.__loader__ = spec, spec.loader
    package.__package__, package.__path__ = PACKAGE, spec.submodule_search_locations
    if spec.has_location:
        package.__file__ = spec.origin
    sys.modules[PACKAGE] = package
    if hasattr(spec.loader, "exec_module"):
        spec.loader.exec_module(package)
    else:  # 3.8 and 3.9: zipimporter loads the old way, into the module above
        package = spec.loader.load_module(PACKAGE)
    # __import__, not importlib.import_module: importlib imports warnings.
    for name in MODULES:
        __import__(f"{PACKAGE}.{name}")
    __import__(f"{PACKAGE}.main")
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
