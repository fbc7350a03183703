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

import mmap  # noqa: E402
import os  # noqa: E402

# The context: a sealed memfd the host hands over at this descriptor. It is
# mapped read-only here (load_context decodes it later) and the descriptor
# goes with the others.
CONTEXT_FD = 4


def take_context():
    try:
        size = os.fstat(CONTEXT_FD).st_size
    except OSError:
        return None
    try:
        return mmap.mmap(CONTEXT_FD, 0, access=mmap.ACCESS_READ) if size else b""
    except (OSError, ValueError):
        return None


CONTEXT_DATA = take_context()

# First of all: no descriptor leaked by the host may reach untrusted code.
# SC_OPEN_MAX is the soft RLIMIT_NOFILE.
os.closerange(3, os.sysconf("SC_OPEN_MAX"))

import importlib  # noqa: E402 (after the descriptors are closed)
import importlib.util  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

PACKAGE = "_rlm_driver"


def load_package():
    """The package beside this file, by path: its directory is never on
    sys.path, so nothing else can import it from there."""
    location = os.path.join(os.path.dirname(os.path.abspath(__file__)), PACKAGE)
    spec = importlib.util.spec_from_file_location(
        PACKAGE, os.path.join(location, "__init__.py"), submodule_search_locations=[location])
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    spec.loader.exec_module(package)
    for name in ("protocol", "state", "api", "screen", "guard", "shield", "step", "selftest"):
        importlib.import_module(f"{PACKAGE}.{name}")
    return importlib.import_module(f"{PACKAGE}.main")


if __name__ == "__main__":
    driver = load_package()
    try:
        driver.main(CONTEXT_DATA, (STARTED, time.monotonic()))
    except Exception as exc:  # a driver bug: say so on the protocol, details on stderr
        traceback.print_exc()
        driver.fatal(f"driver error: {exc!r}")
