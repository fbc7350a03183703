"""The self-test: fixed driver code, outside the guardrails, that tries what
the sandbox must forbid (docs/security.md lists the checks). What a sandbox
promises depends on its mode: bubblewrap's (an empty root, namespaces of its
own) or rlm-keeper's seccomp fallback (a seccomp filter, no capability and a
uid of its own, in the container's filesystem and processes), whose checks
are the ones it promises (MODES)."""

# _socket, the C module: `socket` costs the start a few ms, and its
# create_connection a cold getaddrinfo (NSS) for a numeric address.
import _socket
import encodings
import posix  # os's functions; os itself is not imported at the driver's start
import sys

from . import state
from .state import dirname

HOST_PATHS = ("/etc/passwd", "/etc/shadow", "/etc/hostname", "/home", "/var",
              "/run", "/root/.ssh", "/tmp/.X11-unix")
# PWD too: bwrap --chdir sets it, whatever --clearenv said.
SANDBOX_ENVIRONMENT = frozenset({"PATH", "LANG", "LC_ALL", "PYTHONUTF8", "PYTHONIOENCODING",
                                 "HOME", "TZ", "PYTHONHASHSEED", "TMPDIR", "PWD"})
WORKDIR = "/session"

# What each mode promises, by check: bubblewrap's all of them; the seccomp
# fallback's, the ones it can hold without namespaces (its network check is
# that no socket can be made at all, its canaries that none opens, and its
# workdir is the one it starts in). The host asks for the same lists
# (lua/rlm/sandbox/selftest.lua).
BUBBLEWRAP = ("network", "host_files", "canaries", "seccomp", "own_init", "pid_namespace",
              "read_only_install", "workdir_writable", "capabilities", "descriptors",
              "environment", "host_sysctl", "device_nodes", "workdir_mount", "setuid_files",
              "proc_hidden")
SECCOMP = ("network", "canaries", "seccomp", "read_only_install", "workdir_writable",
           "capabilities", "descriptors", "environment", "host_sysctl", "device_nodes",
           "setuid_files")
MODES = {"bubblewrap": BUBBLEWRAP, "seccomp": SECCOMP}


def self_test(absent, canaries, mode="bubblewrap"):
    status = {}
    names = MODES.get(mode)
    if names is None:  # a mode this driver does not know: nothing passes
        return {"mode": {"ok": False, "detail": f"unknown sandbox mode {mode!r}"}}
    workdir = WORKDIR if mode == "bubblewrap" else posix.getcwd()

    def own_status():  # /proc/self/status, read once for the checks that need it
        if not status:
            status.update(proc_status())
        return status

    every = {
        "network": check_network if mode == "bubblewrap" else check_no_sockets,
        "host_files": lambda: check_host_files(absent),
        "canaries": lambda: check_canaries(canaries, opens_only=mode != "bubblewrap"),
        "seccomp": lambda: check_seccomp(own_status()),
        "own_init": check_own_init,
        "pid_namespace": check_pid_namespace,
        "read_only_install": check_read_only_install,
        "workdir_writable": lambda: check_workdir_writable(workdir),
        "capabilities": lambda: check_capabilities(own_status()),
        "descriptors": check_descriptors,
        "environment": check_environment,
        "host_sysctl": check_host_sysctl,
        "device_nodes": check_device_nodes,
        "workdir_mount": lambda: check_workdir_mount(workdir),
        "setuid_files": lambda: check_setuid_files(workdir),
        "proc_hidden": check_proc_hidden,
    }
    checks = {name: every[name] for name in names}
    results = {}
    for name, check in checks.items():
        try:
            ok, detail = check()
        except Exception as exc:  # could not verify, so not ok
            ok, detail = False, f"check failed: {exc!r}"
        results[name] = {"ok": bool(ok), "detail": detail}
    return results


def read_bytes(path, limit=1 << 16):
    """Up to `limit` bytes of a file, by posix calls alone: open() would build
    a buffered reader (and a text one, a decoder) for each of the files the
    checks read."""
    fd = posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC)
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = posix.read(fd, limit - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        posix.close(fd)


def read_text(path):
    return read_bytes(path).decode("utf-8", "replace")


def check_network():
    lines = read_text("/proc/net/dev").splitlines()[2:]
    interfaces = {line.split(":")[0].strip() for line in lines if ":" in line}
    outcomes = [try_connect(host, port) for host, port in (("1.1.1.1", 53), ("10.0.0.1", 80))]
    ok = interfaces <= {"lo"} and not any(connected for connected, _ in outcomes)
    details = [f"interfaces: {', '.join(sorted(interfaces)) or 'none'}"] + [d for _, d in outcomes]
    return ok, "; ".join(details)


# Every family a REPL could reach anything with: the fallback's filter
# refuses socket() itself, whatever the container's network is.
SOCKET_FAMILIES = (("AF_INET", _socket.AF_INET), ("AF_INET6", _socket.AF_INET6),
                   ("AF_UNIX", _socket.AF_UNIX), ("AF_NETLINK", getattr(_socket, "AF_NETLINK", 16)),
                   ("AF_PACKET", getattr(_socket, "AF_PACKET", 17)))


def check_no_sockets():
    made = []
    for name, family in SOCKET_FAMILIES:
        for kind in (_socket.SOCK_STREAM, _socket.SOCK_DGRAM, _socket.SOCK_RAW):
            try:
                sock = _socket.socket(family, kind)
            except OSError:
                continue
            sock.close()
            made.append(f"{name}/{kind}")
    if made:
        return False, f"sockets made: {', '.join(made)}"
    return True, "no socket of any family (" + ", ".join(n for n, _ in SOCKET_FAMILIES) + ")"


def try_connect(host, port):
    """A TCP connection to a numeric IPv4 address (what create_connection
    does once it has resolved one)."""
    try:
        sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    except Exception as exc:  # no sockets at all
        return False, f"{host}:{port} blocked ({exc})"
    try:
        sock.settimeout(0.5)
        sock.connect((host, port))
        return True, f"{host}:{port} reachable"
    except Exception as exc:  # refused or unreachable
        return False, f"{host}:{port} blocked ({exc})"
    finally:
        sock.close()


def check_host_files(absent):
    present = [path for path in HOST_PATHS + tuple(absent) if path_present(path)]
    return not present, f"present: {', '.join(present)}" if present else "none present"


def path_present(path):
    try:
        posix.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:  # e.g. permission denied: something is there
        return True
    return True


def check_canaries(canaries, opens_only=False):
    """What the host planted: a file in its home, listeners on 127.0.0.1, a
    path and an abstract unix socket, a descriptor it leaked, itself.
    Without bubblewrap the host's home is there to see (opens_only): its
    file must not open."""
    reached = []
    home_file = canaries.get("home_file")
    if isinstance(home_file, str) and home_file and \
            (opens_only and opens(home_file) or not opens_only and path_present(home_file)):
        reached.append("home file")
    port = canaries.get("tcp_port")
    if isinstance(port, int) and port > 0 and try_connect("127.0.0.1", port)[0]:
        reached.append(f"127.0.0.1:{port}")
    for key, prefix in (("unix_path", ""), ("abstract", "\0")):
        name = canaries.get(key)
        if isinstance(name, str) and name and unix_connects(prefix + name):
            reached.append(key)
    fd = canaries.get("leaked_fd")
    if isinstance(fd, int) and fd > 2 and descriptor_open(fd):
        reached.append(f"descriptor {fd}")
    host_pid = canaries.get("host_pid")
    if isinstance(host_pid, int) and host_pid > 4 and signals(host_pid):
        reached.append(f"host process {host_pid}")
    secret = canaries.get("secret")
    if isinstance(secret, str) and secret and secret in repr(environment()):
        reached.append("secret in environment")
    if reached:
        return False, "reached: " + ", ".join(reached)
    return True, "none reached"


def opens(path):
    try:
        posix.close(posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC))
    except OSError:
        return False
    return True


def unix_connects(address):
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    except Exception:  # no sockets at all
        return False
    try:
        sock.settimeout(0.5)
        sock.connect(address)
        return True
    except Exception:  # refused or absent
        return False
    finally:
        sock.close()


def descriptor_open(fd):
    try:
        posix.fstat(fd)
        return True
    except OSError:
        return False


def signals(pid):
    try:
        posix.kill(pid, 0)  # signal 0: only asks whether it could be signalled
        return True
    except OSError:
        return False


def check_seccomp(status):
    return status.get("Seccomp") == "2", f"Seccomp={status.get('Seccomp')}"


def check_own_init():
    argv0 = read_bytes("/proc/1/cmdline").split(b"\0", 1)[0]
    return argv0.rsplit(b"/", 1)[-1] == b"bwrap", f"pid 1 is {argv0.decode(errors='replace')}"


def proc_status():
    status = {}
    for line in read_text("/proc/self/status").splitlines():
        key, _, value = line.partition(":")
        status[key] = value.strip()
    return status


def check_pid_namespace():
    pid = posix.getpid()
    processes = [entry for entry in posix.listdir("/proc") if entry.isdigit()]
    return pid <= 4 and len(processes) <= 4, f"pid {pid}, {len(processes)} processes visible"


def check_read_only_install():
    # encodings is a package of plain source modules in the stdlib's
    # directory (and loaded at every start: it costs no import).
    stdlib = dirname(dirname(encodings.__file__))
    directories = [dirname(sys.executable), stdlib]
    writable = [d for d in directories if can_create_file_in(d)]
    if writable:
        return False, f"writable: {', '.join(writable)}"
    return True, f"read-only: {', '.join(directories)}"


def can_create_file_in(directory):
    path = f"{directory.rstrip('/')}/.rlm_probe_{posix.getpid()}"
    try:
        descriptor = posix.open(path, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL, 0o600)
    except OSError:
        return False
    posix.close(descriptor)
    posix.unlink(path)
    return True


def check_workdir_writable(workdir):
    probe = workdir + "/.rlm_self_test"
    payload = b"rlm self test\n"
    flags = posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC | posix.O_CLOEXEC
    fd = posix.open(probe, flags, 0o600)
    try:
        try:
            wrote = posix.write(fd, payload)
        finally:
            posix.close(fd)
        same = wrote == len(payload) and read_bytes(probe) == payload
    finally:
        posix.unlink(probe)
    return same, "created, wrote, read back and removed " + probe


def check_capabilities(status):
    keys = ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs")
    ok = all(int(status[key], 16) == 0 for key in keys[:3]) and status["NoNewPrivs"] == "1"
    return ok, ", ".join(f"{key}={status[key]}" for key in keys)


def check_descriptors():
    descriptors = sorted(int(entry) for entry in posix.listdir("/proc/self/fd"))
    held = state.current.context_data  # the context's descriptor, until load_context
    extra = [fd for fd in descriptors if fd > 2 and not (isinstance(held, int) and fd == held)]
    # One extra is expected: the descriptor the listing itself used.
    return len(extra) <= 1, f"open: {descriptors}"


def environment():
    """os.environ as a dict: posix.environ's bytes, decoded as os decodes them."""
    encoding = sys.getfilesystemencoding()
    return {key.decode(encoding, "surrogateescape"): value.decode(encoding, "surrogateescape")
            for key, value in posix.environ.items()}


def check_environment():
    environ = environment()
    extra = sorted(set(environ) - SANDBOX_ENVIRONMENT)
    if extra:
        return False, f"unexpected: {', '.join(extra)}"
    return True, f"keys: {', '.join(sorted(environ))}"


SYSCTL_PROBE = "/proc/sys/kernel/printk_ratelimit"


def check_host_sysctl():
    """A host-global sysctl must not open for writing (nothing is written)."""
    try:
        descriptor = posix.open(SYSCTL_PROBE, posix.O_WRONLY)
    except OSError as exc:
        return True, f"{SYSCTL_PROBE}: {exc.strerror}"
    posix.close(descriptor)
    return False, f"{SYSCTL_PROBE} opens for writing"


def check_device_nodes():
    """The host's device nodes are bound in: their mode must not change
    (set to what it is, so nothing changes even when it can)."""
    mode = posix.stat("/dev/null").st_mode & 0o7777
    try:
        posix.chmod("/dev/null", mode)
    except OSError as exc:
        return True, f"chmod /dev/null: {exc.strerror}"
    return False, "chmod /dev/null succeeded"


def check_workdir_mount(workdir):
    flags = posix.statvfs(workdir).f_flag
    ok = bool(flags & posix.ST_NOSUID) and bool(flags & posix.ST_NODEV)
    return ok, f"{workdir} nosuid={bool(flags & posix.ST_NOSUID)} nodev={bool(flags & posix.ST_NODEV)}"


def check_setuid_files(workdir):
    path = workdir + "/.rlm_setuid_probe"
    try:
        descriptor = posix.open(path, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL, 0o4755)
    except OSError as exc:
        return True, f"create mode 04755: {exc.strerror}"
    try:
        posix.close(descriptor)
        posix.chmod(path, 0o2755)
        return False, f"a setgid file was made in {workdir}"
    except OSError as exc:
        setuid = posix.stat(path).st_mode & 0o6000
        return not setuid, f"chmod 02755: {exc.strerror}; mode bits {oct(setuid)}"
    finally:
        posix.unlink(path)


HIDDEN_PROC = ("slabinfo", "kallsyms", "timer_list", "keys", "sched_debug", "kpageflags",
               "modules", "vmallocinfo", "iomem")


def check_proc_hidden():
    shown = []
    for name in HIDDEN_PROC:
        try:
            if read_bytes("/proc/" + name, 1):
                shown.append(name)
        except OSError:
            pass
    return not shown, f"readable: {', '.join(shown)}" if shown else "none readable"
