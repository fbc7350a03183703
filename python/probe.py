"""Reports what of the host's filesystem this interpreter needs, as one JSON
line: its real path, its ELF program interpreter, the existing sys.path
directories and every file mapped once the given modules are imported. The
host binds exactly these, read-only, into the sandbox. Directories that .pth
files add to sys.path are reported apart (pth_paths): they can be anything (a
project's checkout, with its .env), and are bound only when the user asks.
Run with -I -S: site runs here, after the interpreter's own path is noted.
Trusted: it runs on the host, with no user input but module names.

With `--driver DIR` first, it also packs the driver's package
(DIR/_rlm_driver/*.py) into one zip archive for the sandbox, each module as
its source and this interpreter's bytecode for it (a checked hash-based
pyc, which repl_driver.py's loader checks against the source beside it): one file to bind, and no
compiling in every sandbox (driver_zip, base64)."""
import importlib
import json
import os
import struct
import sys


def elf_interpreter(path):
    """PT_INTERP of an ELF executable, or None."""
    try:
        with open(path, "rb") as f:
            ident = f.read(16)
            if ident[:4] != b"\x7fELF":
                return None
            is64, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
            if is64:
                f.seek(32)
                phoff, = struct.unpack(order + "Q", f.read(8))
                f.seek(54)
            else:
                f.seek(28)
                phoff, = struct.unpack(order + "I", f.read(4))
                f.seek(42)
            phentsize, phnum = struct.unpack(order + "HH", f.read(4))
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                if is64:
                    ptype, _, offset, _, _, size = struct.unpack(
                        order + "IIQQQQ", f.read(40))
                else:
                    ptype, offset, _, _, size = struct.unpack(
                        order + "IIIII", f.read(20))
                if ptype == 3:
                    f.seek(offset)
                    return f.read(size).rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def mapped_files():
    files = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                path = parts[5].rstrip("\n")
                if not path.endswith(" (deleted)") and path not in files:
                    files.append(path)
    return files


def soname_links(files):
    """The symlinks beside each mapped library that point at it: the loader
    opens libz.so.1, which maps as libz.so.1.2.13."""
    wanted = set(files)
    links = []
    for directory in sorted({os.path.dirname(f) for f in files}):
        try:
            entries = os.scandir(directory)
        except OSError:
            continue
        with entries:
            for entry in entries:
                if entry.is_symlink() and os.path.realpath(entry.path) in wanted:
                    links.append(entry.path)
    return links


def driver_zip(directory):
    """The zip of the package: for each module its .py and a checked-hash
    .pyc, stored, with no comment: what repl_driver.py's loader reads."""
    import base64
    import importlib.util
    import io
    import zipfile
    package = os.path.join(directory, "_rlm_driver")
    # loader.py first, its .pyc before its source: the entry script reads
    # these two members by their place, the loader the rest by name.
    names = sorted((n for n in os.listdir(package) if n.endswith(".py") and n[:-3].isidentifier()),
                   key=lambda n: (n != "loader.py", n))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for name in names:
            with open(os.path.join(package, name), "rb") as f:
                source = f.read()
            # The same name the entry's loader gives the module (__file__).
            code = compile(source, "/rlm/driver.zip/_rlm_driver/" + name, "exec",
                           dont_inherit=True)
            pyc = importlib._bootstrap_external._code_to_hash_pyc(
                code, importlib.util.source_hash(source), checked=True)
            # A fixed date: the archive is the same for the same sources.
            for entry, data in ((name + "c", pyc), (name, source)):
                info = zipfile.ZipInfo("_rlm_driver/" + entry, (1980, 1, 1, 0, 0, 0))
                archive.writestr(info, data)
    return base64.b64encode(out.getvalue()).decode("ascii")


def entry_pyc(directory):
    """repl_driver.py as bytecode: the sandbox runs it as its script
    (python runs a .pyc it is given as it is, after the magic number's
    check), so that no start compiles it."""
    import base64
    import importlib.util
    with open(os.path.join(directory, "repl_driver.py"), "rb") as f:
        source = f.read()
    code = compile(source, "/rlm/repl_driver.py", "exec", dont_inherit=True)
    pyc = importlib._bootstrap_external._code_to_hash_pyc(
        code, importlib.util.source_hash(source), checked=False)
    return base64.b64encode(pyc).decode("ascii")


def main():
    driver_dir = None
    if sys.argv[1:2] == ["--driver"]:
        driver_dir = sys.argv[2]
        del sys.argv[1:3]
    import site
    own = [p for p in sys.path if p]
    site.main()  # no-op for what -S did not skip; adds site-packages and .pth paths
    site_dirs = set(site.getsitepackages())
    pth_paths = [p for p in sys.path
                 if p and p not in own and p not in site_dirs and os.path.isdir(p)]
    failed = []
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
        except Exception:  # a module the user asked for may be missing
            failed.append(name)
    executable = os.path.realpath(sys.executable)
    files = mapped_files()
    # After the files are listed: what packing maps (zlib) is not bound.
    packed = driver_zip(driver_dir) if driver_dir else None
    entry = entry_pyc(driver_dir) if driver_dir else None
    print(json.dumps({
        "executable": executable,
        "version": "%d.%d.%d" % sys.version_info[:3],
        "interpreter": elf_interpreter(executable),
        "sys_path": [p for p in sys.path
                     if p and p not in pth_paths and os.path.isdir(p)],
        "pth_paths": pth_paths,
        "files": files + soname_links(files),
        "missing": failed,
        "driver_zip": packed,
        "driver_pyc": entry,
    }))


main()
