#!/usr/bin/env python3
"""The nginx host test: rlm.adapters.resty inside Debian's nginx with the Lua
module from build/resty-root (spec/hosts/deps nginx unpacks it).

Starts nginx (master + one worker, a private prefix, a free port on
127.0.0.1), runs the cases, stops nginx. Prints one "ok - ..." or
"not ok - ..." line per case. Environment: RLM_ROOT (the checkout),
RLM_BUILD (the build directory holding 5.1/rlm/core.so), RLM_RESTY_ROOT.
"""
import http.client
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

from hostlib import Tally, descendants, free_port, state

ROOT = os.environ["RLM_ROOT"]
BUILD = os.environ.get("RLM_BUILD", os.path.join(ROOT, "build"))
RESTY = os.environ.get("RLM_RESTY_ROOT", os.path.join(ROOT, "build", "resty-root"))
HERE = os.path.dirname(os.path.abspath(__file__))

PINGS = 100            # requests to /ping while the session runs
PING_THREADS = 4       # clients at once
P99_LIMIT_MS = 100     # a blocked worker shows seconds; a busy 2-core machine tens of ms
PHASE_TIMEOUT_S = 30

report = Tally("nginx")


def readable_by_others(path):
    """Whether a user with no rights of its own can read path."""
    path = os.path.realpath(path)
    parts = path.split("/")
    for i in range(2, len(parts)):
        if not os.stat("/".join(parts[:i])).st_mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o004)


# As root, the workers run as nobody, as in production, when nobody can read
# the checkout; otherwise (a private clone) as root.
WORKER_USER = "root"
if os.geteuid() == 0 and all(readable_by_others(p) for p in (
        os.path.join(ROOT, "lua/rlm/init.lua"), os.path.join(ROOT, "python/repl_driver.py"),
        os.path.join(BUILD, "5.1/rlm/core.so"), os.path.join(RESTY, "usr/share/lua/5.1/resty/core.lua"))):
    WORKER_USER = "nobody nogroup"


class Server:
    """nginx from the test's own conf (nginx.conf.in)."""

    def __init__(self):
        self.prefix = tempfile.mkdtemp(prefix="rlm-nginx.")
        self.tmpdir = os.path.join(self.prefix, "sessions")
        os.mkdir(self.tmpdir)
        os.mkdir(os.path.join(self.prefix, "logs"))
        os.mkdir(os.path.join(self.prefix, "tmp"))
        os.chmod(self.prefix, 0o755)
        if os.geteuid() == 0 and WORKER_USER.startswith("nobody"):
            nobody = pwd.getpwnam("nobody")
            os.chown(self.tmpdir, nobody.pw_uid, nobody.pw_gid)
        self.port = free_port()
        with open(os.path.join(HERE, "nginx.conf.in")) as f:
            conf = f.read()
        for key, value in (("@RESTY@", RESTY), ("@PREFIX@", self.prefix), ("@ROOT@", ROOT),
                           ("@BUILD@", BUILD), ("@PORT@", str(self.port)),
                           ("@CA@", CERTS["ca"])):
            conf = conf.replace(key, value)
        conf = conf.replace("daemon off;\n", "daemon off;\nuser %s;\n" % WORKER_USER, 1)
        self.conf = os.path.join(self.prefix, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(conf)
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.path.join(RESTY, "usr/lib/x86_64-linux-gnu")
        env["RLM_HOSTS_TMPDIR"] = env["RLM_TMPDIR"] = self.tmpdir
        self.proc = subprocess.Popen(
            ["nginx", "-p", self.prefix, "-c", self.conf, "-e", os.path.join(self.prefix, "error.log")],
            env=env, stdin=subprocess.DEVNULL)
        deadline = time.time() + 10
        while True:
            try:
                if self.get("/ping")[1].strip() == "pong":
                    break
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("nginx did not come up: " + self.log()[-2000:])
            time.sleep(0.05)

    def get(self, path, timeout=60, method="GET", body=None, headers=None):
        t0 = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            text = r.read().decode()
            return r.status, text, (time.perf_counter() - t0) * 1000, dict(r.getheaders())
        finally:
            c.close()

    def log(self):
        text = ""
        for name in ("error.log", "logs/error.log"):
            try:
                with open(os.path.join(self.prefix, name)) as f:
                    text += f.read()
            except OSError:
                pass
        return text

    def master_children(self):
        pids = []
        task_dir = "/proc/%d/task" % self.proc.pid
        for tid in os.listdir(task_dir):
            with open(os.path.join(task_dir, tid, "children")) as f:
                pids += [int(p) for p in f.read().split()]
        return pids

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                workers = self.master_children()
                self.proc.kill()
                for pid in workers:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                self.proc.wait()
        return self.proc.returncode


def percentile(values, p):
    values = sorted(values)
    k = max(0, min(len(values) - 1, int(round(p / 100 * len(values) + 0.5)) - 1))
    return values[k]


def ping_many(srv, n, threads, spacing_s):
    latencies, errors = [], []
    lock = threading.Lock()

    def worker(count):
        for _ in range(count):
            try:
                status, body, ms, _ = srv.get("/ping", timeout=10)
                with lock:
                    if status == 200 and body.strip() == "pong":
                        latencies.append(ms)
                    else:
                        errors.append("%s %r" % (status, body))
            except OSError as e:
                with lock:
                    errors.append(str(e))
            time.sleep(spacing_s)

    ts = [threading.Thread(target=worker, args=(n // threads,)) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return latencies, errors


def stats(lat):
    return "p50 %.1f ms, p99 %.1f ms, max %.1f ms over %d requests" % (
        percentile(lat, 50), percentile(lat, 99), max(lat), len(lat))


def case_session(srv):
    # The floor: the same requests with no session running.
    floor, _ = ping_many(srv, PINGS, PING_THREADS, 0.03)
    box = {}

    def session():
        box["t0"] = time.time()
        try:
            box["reply"] = srv.get("/session", timeout=90)
        except OSError as e:
            box["reply"] = (0, str(e), 0, {})
        box["t1"] = time.time()

    st = threading.Thread(target=session)
    st.start()
    time.sleep(0.02)  # from the start: the spawn of the sandbox is measured too
    execs = []
    ex = threading.Thread(target=lambda: [execs.append(srv.get("/exec")) or time.sleep(0.8)
                                          for _ in range(3)])
    ex.start()
    p0 = time.time()
    lat, errs = ping_many(srv, PINGS, PING_THREADS, 0.17)
    p1 = time.time()
    ex.join()
    st.join()
    status, body, _, _ = box["reply"]
    try:
        reply = json.loads(body)
    except ValueError:
        reply = {"answer": None, "error": body}
    report(status == 200 and reply.get("answer") == "pong/ABC",
           "a session in content_by_lua ends with the right answer",
           "%r after %s ms, %s iterations, %s sub-calls" % (
               reply.get("answer"), reply.get("elapsed_ms"), reply.get("iterations"),
               reply.get("sub_calls")) if reply.get("answer") else reply.get("error"))
    report(reply.get("most_concurrent_sub_calls") == 3,
           "llm_query_batched's three sub-calls run at once, in light threads",
           "at most %s at once" % reply.get("most_concurrent_sub_calls"))
    overlap = p0 >= box["t0"] and p1 <= box["t1"]
    ok = not errs and len(lat) == PINGS and overlap and percentile(lat, 99) < P99_LIMIT_MS
    report(ok, "the worker serves %d requests while the session runs (p99 < %d ms)" % (
        PINGS, P99_LIMIT_MS),
        "%s; floor without a session: %s; pings %.1f-%.1f s into a %.1f s session%s" % (
            stats(lat) if lat else "none", stats(floor), p0 - box["t0"], p1 - box["t0"],
            box["t1"] - box["t0"], "; errors: " + "; ".join(errs[:3]) if errs else ""))
    contrast(srv)
    ok, details = len(execs) == 3, []
    for status, body, _, _ in execs:
        try:
            got = json.loads(body)
        except ValueError:
            got = {}
        ok = ok and got.get("execute") == 768 and got.get("popen") == "from-popen\n"
        details.append("os.execute('exit 3') -> %s, popen -> %r" % (got.get("execute"), got.get("popen")))
    report(ok, "os.execute and io.popen work in the worker while the session runs", "; ".join(details))


def contrast(srv):
    """For comparison, not a case: Session:run() called directly in the
    worker, the REPL spinning for a second."""
    box = {}
    st = threading.Thread(target=lambda: box.update(reply=srv.get("/blocking", timeout=60)))
    st.start()
    time.sleep(0.05)
    lat, _ = ping_many(srv, 20, PING_THREADS, 0.05)
    st.join()
    print("# for contrast, Session:run() without the adapter: %s (%s)" % (
        stats(lat) if lat else "no requests", box["reply"][1].strip()), flush=True)


def case_concurrent(srv):
    status, body, _, _ = srv.get("/concurrent")
    got = json.loads(body) if status == 200 else {}
    report(got.get("answer") == "P1,P2,P3" and got.get("most") == 3 and got.get("elapsed_ms", 1e9) < 500,
           "requests outstanding together run at once, each in a light thread",
           "%r: at most %s at once, three 200 ms calls in %s ms" % (
               got.get("answer"), got.get("most"), got.get("elapsed_ms")) if got else body)


def case_tools(srv):
    """Host tools under rlm.adapters.resty: ngx.shared, a yield, done() later."""
    status, body, ms, _ = srv.get("/tools")
    try:
        got = json.loads(body)
    except ValueError:
        got = {"error": body}
    report(status == 200 and got.get("answer") == "team-db None 42 hi!"
           and "fails_later: the cache is cold" in (got.get("stdout") or ""),
           "host tools under the resty adapter: ngx.shared, a yield, done() from a timer, a caught failure",
           "%s %r in %.0f ms" % (status, got, ms))


def wait_result(srv, key):
    deadline = time.time() + PHASE_TIMEOUT_S
    while time.time() < deadline:
        body = srv.get("/result?key=" + key)[1].strip()
        if body:
            return body
        time.sleep(0.1)
    return "(no result after %d s)" % PHASE_TIMEOUT_S


def case_phases(srv):
    for phase in ("rewrite", "access", "content"):
        status, body, ms, _ = srv.get("/phase/" + phase)
        report(body.strip() == "ok-" + phase, "the blocking form works in %s_by_lua" % phase,
               "%r in %.0f ms" % (body.strip(), ms))
    srv.get("/phase/timer")
    got = wait_result(srv, "timer")
    report(got == "ok-timer", "the blocking form works in an ngx.timer callback", repr(got))
    for phase in ("log", "header_filter"):
        _, _, _, headers = srv.get("/phase/" + phase)
        got = wait_result(srv, phase)
        report(got == "ok-" + phase, "the callback form works from %s_by_lua (in a timer)" % phase, repr(got))
        if phase == "header_filter":
            refused = headers.get("X-Rlm-Blocking", "")
            report("'header_filter' phase" in refused,
                   "the blocking form refuses header_filter_by_lua, naming the phase", refused)
    body = srv.get("/phase/set")[1].strip()
    report("'set' phase" in body, "the blocking form refuses set_by_lua, naming the phase", body)


def case_reload(srv):
    # rlm is loaded in the master (init_by_lua) and a worker ran sessions;
    # the master must still reap the worker a reload retires.
    old = int(srv.get("/pid")[1])
    caught = srv.get("/sigchld")[1].strip()
    os.kill(srv.proc.pid, signal.SIGHUP)
    new, deadline = old, time.time() + 10
    while new == old and time.time() < deadline:
        time.sleep(0.1)
        try:
            new = int(srv.get("/pid")[1])
        except (OSError, ValueError):
            pass
    deadline = time.time() + 10
    while time.time() < deadline and (old in srv.master_children() or state(old) is not None):
        time.sleep(0.1)
    zombies = [p for p in srv.master_children() if state(p) == "Z"]
    exited = ("worker process %d exited with code 0" % old) in srv.log()
    report(new != old and old not in srv.master_children() and not zombies and exited,
           "the master reaps its old worker after a reload",
           "worker %d -> %d, zombies %s, %s; worker SIGCHLD: %s" % (
               old, new, zombies or "none", "exit logged" if exited else "no exit logged", caught))


CERTS = {}


def case_abort(srv):
    """A client that disconnects mid-run, lua_check_client_abort on: the run
    ends (cancelled), its sandbox is gone within 0.5 s, and root_llm is not
    called again; with no body, a 1 KB body and a 64 KB one (a body nginx
    has not read keeps the socket readable, which hid the client's going
    away until the adapter read it)."""
    for size in (0, 1024, 65536):
        abort_with_body(srv, size)


def abort_with_body(srv, size):
    worker = int(srv.get("/pid")[1])
    c = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    if size:
        c.sendall(b"POST /abort HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size + b"b" * size)
    else:
        c.sendall(b"GET /abort HTTP/1.1\r\nHost: x\r\n\r\n")
    head = c.recv(4096)
    deadline = time.time() + 20
    calls = 0
    while time.time() < deadline:  # a few steps in, a sandbox running
        calls = int(srv.get("/result?key=abort_calls")[1].strip() or 0)
        if calls >= 3 and descendants(worker):
            break
        time.sleep(0.05)
    sandbox = descendants(worker)
    t0 = time.time()
    c.close()
    gone = None
    while time.time() - t0 < 5:
        if not [p for p in sandbox if state(p) not in (None, "Z")] and not descendants(worker):
            gone = time.time() - t0
            break
        time.sleep(0.02)
    at_close = calls
    calls = int(srv.get("/result?key=abort_calls")[1].strip() or 0)
    time.sleep(1.5)  # several steps' worth: a run still going would call again
    later = int(srv.get("/result?key=abort_calls")[1].strip() or 0)
    end = srv.get("/result?key=abort_end")[1].strip()
    body = "a %d-byte body" % size if size else "no body"
    report(b"started" in head and sandbox and gone is not None and gone < 0.5,
           "a client that disconnects mid-run (%s): the sandbox is gone within 0.5 s" % body,
           "%d sandbox processes, gone after %s" % (
               len(sandbox), "%.0f ms" % (gone * 1000) if gone is not None else "more than 5 s (still there)"))
    report(end == "cancelled" and later == calls and calls <= at_close + 1,
           "a client that disconnects mid-run (%s): the run ends cancelled and root_llm is not called after" % body,
           "ended %r; root_llm calls: %d at the disconnect, %d when the sandbox was gone, %d 1.5 s later" % (
               end, at_close, calls, later))


def case_unread_body(srv):
    """A body left unread hides a client's going away from nginx: start says
    so in error.log (once per worker), naming the directive that reads it."""
    before = srv.log().count("the request body is unread")
    got = [srv.get("/unread", method="POST", body=b"b" * 2048)[0] for _ in range(2)]
    said = srv.log().count("the request body is unread") - before
    report(got == [200, 200] and said == 1 and "lua_need_request_body on" in srv.log(),
           "an unread request body under lua_check_client_abort is named in error.log, once",
           "statuses %s; said %d times" % (got, said))


def case_cancel(srv):
    status, body, _, _ = srv.get("/cancel")
    kind, _, ms = body.strip().partition(" ")
    report(status == 200 and kind == "cancelled" and int(ms or 1e9) < 3000,
           "resty.start's handle: cancel() from a light thread ends wait() with `cancelled`", body.strip())


def make_certs(d):
    """A CA and server certificates signed by it (for localhost and
    127.0.0.1, and one for another name), and a second CA with a server
    certificate of its own, with openssl."""
    def run(*args):
        subprocess.run(["openssl"] + list(args), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, cwd=d)

    for ca in ("ca", "otherca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", ca + ".key",
            "-out", ca + ".pem", "-subj", "/CN=rlm test " + ca,
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    for name, ca, san in (("good", "ca", "DNS:localhost,IP:127.0.0.1"),
                          ("wrongca", "otherca", "DNS:localhost,IP:127.0.0.1"),
                          ("wronghost", "ca", "DNS:other.invalid")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out", name + ".csr",
            "-subj", "/CN=" + name)
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write("subjectAltName=%s\nextendedKeyUsage=serverAuth\n" % san)
        run("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
            "-CAcreateserial", "-days", "2", "-out", name + ".pem", "-extfile", name + ".ext")
    CERTS.update({n: os.path.join(d, n + ".pem") for n in ("ca", "good", "wrongca", "wronghost")})
    CERTS.update({n + "_key": os.path.join(d, n + ".key") for n in ("good", "wrongca", "wronghost")})
    os.chmod(d, 0o755)
    for name in os.listdir(d):
        os.chmod(os.path.join(d, name), 0o644)  # nginx's workers may run as nobody


class Fake:
    """spec/helpers/fake_openai.py, plain or with a certificate."""

    def __init__(self, cert=None):
        argv = [sys.executable, os.path.join(ROOT, "spec/helpers/fake_openai.py")]
        if cert:
            argv += ["--tls", CERTS[cert], CERTS[cert + "_key"]]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        self.port = int(self.proc.stdout.readline().split()[0])
        self.tls = cert is not None

    def control(self, method, path, body=None):
        if self.tls:
            import ssl
            ctx = ssl.create_default_context(cafile=CERTS["ca"])
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the fake's control only
            c = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=ctx)
        else:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request(method, path, body=json.dumps(body) if body is not None else None)
        reply = json.loads(c.getresponse().read())
        c.close()
        return reply

    def script(self, replies):
        self.control("POST", "/_control/script", {"replies": replies})

    def requests(self):
        return self.control("GET", "/_control/requests")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def transport(srv, url, **args):
    q = "&".join("%s=%s" % (k, v) for k, v in args.items())
    status, body, _, _ = srv.get("/transport?url=" + urllib.parse.quote(url, safe="") + ("&" + q if q else ""))
    return json.loads(body) if status == 200 else [{"status": None, "error": "HTTP %s: %s" % (status, body)}]


def case_transport(srv):
    """rlm.llm.transport.resty against the fake server: plain HTTP, chunked,
    keep-alive, a timeout and a bound, and TLS with the test's CA: a good
    certificate, one from another CA and one for another name."""
    plain = Fake()
    fakes = {"good": Fake("good"), "wrongca": Fake("wrongca"), "wronghost": Fake("wronghost")}
    try:
        base = "http://127.0.0.1:%d/v1/chat/completions" % plain.port
        plain.script([{"content": "plain"}, {"content": "chunked", "chunked": True}])
        got = transport(srv, base, n=2)
        reqs = plain.requests()
        ok = [g["status"] for g in got] == [200, 200] and '"plain"' in (got[0]["body"] or "") \
            and '"chunked"' in (got[1]["body"] or "") and len(reqs) == 2 \
            and reqs[0]["headers"].get("authorization") == "Bearer sk-transport" \
            and reqs[0]["json"]["model"] == "m1" and got[0]["content_type"] == "application/json"
        report(ok, "the cosocket transport: HTTP/1.1 with Content-Length and chunked replies",
               "%s in %s ms" % ([g["status"] or g["error"] for g in got], [g["ms"] for g in got]))

        plain.script([{"content": "a", "keepalive": True}, {"content": "b", "keepalive": True},
                      {"content": "c"}, {"content": "d"}])
        got = transport(srv, base, n=4)
        ports = [r["peer_port"] for r in plain.requests()]
        report([g["status"] for g in got] == [200] * 4 and len(ports) == 4 and ports[0] == ports[1] == ports[2]
               and ports[3] != ports[2],
               "keep-alive: a connection goes back to the pool and is reused, one the server closes is not",
               "client ports %s" % ports)

        plain.script([{"content": "slow", "delay_ms": 3000}])
        got = transport(srv, base, timeout_ms=500)[0]
        report(got["status"] is None and "timeout" in (got["error"] or "") and got["ms"] < 2000,
               "a request past its timeout_ms fails with a timeout", "%r after %s ms" % (got["error"], got["ms"]))

        plain.script([{"content": "x" * 5000}, {"content": "y" * 5000, "chunked": True}])
        got = transport(srv, base, n=2, max=1000)
        report(all(g["status"] is None and "more than 1000" in (g["error"] or "")
                   or "longer than 1000" in (g["error"] or "") for g in got),
               "a reply past max_body_bytes fails (Content-Length and chunked)",
               "; ".join(str(g["error"]) for g in got))

        good = fakes["good"]
        good.script([{"content": "over tls"}, {"content": "again", "keepalive": True},
                     {"content": "pooled"}])
        got = transport(srv, "https://localhost:%d/v1/chat/completions" % good.port, n=3)
        ports = [r["peer_port"] for r in good.requests()]
        report([g["status"] for g in got] == [200] * 3 and '"over tls"' in (got[0]["body"] or "")
               and ports[1] == ports[2],
               "TLS: a certificate from the trusted CA for the host name is accepted, and pooled",
               "%s; client ports %s" % ([g["status"] or g["error"] for g in got], ports))

        # nginx checks the name with X509_check_host, which knows no IP
        # addresses: an IP literal over TLS fails closed.
        got = transport(srv, "https://127.0.0.1:%d/v1/chat/completions" % good.port)[0]
        report(got["status"] is None and (got["error"] or "").startswith("TLS handshake with 127.0.0.1: "),
               "TLS: an IP literal is refused (nginx matches host names only)", got["error"])

        # OpenSSL's words for an unknown issuer: X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE (21).
        for name, want in (("wrongca", "unable to verify the first certificate"), ("wronghost", "host mismatch")):
            fake = fakes[name]
            fake.script([{"content": "must not be reached"}])
            host = "localhost"
            got = transport(srv, "https://%s:%d/v1/chat/completions" % (host, fake.port))[0]
            reqs = fake.requests()
            # The cause is in the message, or (lua-resty-core's assertion,
            # see the transport) in nginx's error log.
            err = got["error"] or ""
            report(got["status"] is None and reqs == [] and (
                       want in err or err.startswith("TLS handshake with localhost: failed (")),
                   "TLS: %s is refused before anything is sent" % (
                       "a certificate from another CA" if name == "wrongca" else "a certificate for another name"),
                   "%r; requests seen by the server: %d" % (got["error"], len(reqs)))

        good.script([
            {"content": "```repl\nn = sum(1 for l in context.splitlines() if 'ERROR' in l)\n"
                        "r = llm_query('say hi')\nFINAL(str(n) + ' ' + r)\n```", "usage": [100, 20]},
            {"status": 429, "headers": {"retry-after-ms": "100"}, "json": {"error": {"message": "slow down"}}},
            {"content": "hi", "usage": [5, 1], "chunked": True},
        ])
        srv.get("/transport_timer?key=tls_session&url=" + urllib.parse.quote(
            "https://localhost:%d/v1" % good.port, safe=""))
        got = wait_result(srv, "tls_session")
        models = [r["json"]["model"] for r in good.requests() if r.get("json")]
        report(got == "2 hi" and models == ["root-model", "sub-model", "sub-model"],
               "a session in the callback form (a timer, started from log_by_lua) reaches its models over TLS "
               "with the cosocket transport, waiting out a 429", "%r; models %s" % (got, models))
    finally:
        plain.stop()
        for fake in fakes.values():
            fake.stop()


def case_providers(srv):
    """rlm.llm.openai, rlm.llm.anthropic and rlm.llm.gemini over the cosocket
    transport, their root calls streamed: a session in the callback form answers, each
    provider's requests in its API's shape, the root model's text coming as
    root_delta events, a 429 waited out."""
    fake = Fake()
    try:
        for provider, base, path in (("openai", "http://127.0.0.1:%d/v1" % fake.port, "/v1/chat/completions"),
                                     ("anthropic", "http://127.0.0.1:%d" % fake.port, "/v1/messages"),
                                     ("gemini", "http://127.0.0.1:%d/v1beta" % fake.port,
                                      "/v1beta/models/root-model:streamGenerateContent?alt=sse")):
            code = "```repl\nr = llm_query('say hi')\nFINAL(r + ' from ' + context.split()[0])\n```"
            fake.script([
                {"content": code, "pieces": [code[:9], code[9:30], code[30:]], "usage": [100, 20],
                 "event_delay_ms": 20},
                {"status": 429, "headers": {"retry-after-ms": "100"}, "json": {"error": {"message": "slow down"}}},
                {"content": "hi", "usage": [5, 1]},
            ])
            key = "providers_" + provider
            srv.get("/transport_timer?key=%s&provider=%s&stream=1&url=%s" % (
                key, provider, urllib.parse.quote(base, safe="")))
            got = wait_result(srv, key)
            reqs = fake.requests()
            paths = [r["path"] for r in reqs]
            report(got == "hi from ERROR deltas=3" and len(reqs) == 3 and paths[0] == path,
                   "rlm.llm.%s over the cosocket transport: a session answers, its root call streamed "
                   "as root_delta events, a 429 waited out" % provider, "%r; paths %s" % (got, paths))
    finally:
        fake.stop()


def main():
    for path in (os.path.join(RESTY, "usr/lib/nginx/modules/ngx_http_lua_module.so"),
                 os.path.join(BUILD, "5.1/rlm/core.so")):
        if not os.path.exists(path):
            report(False, "setup", "%s is missing (run spec/hosts/deps nginx and make)" % path)
            return 1
    print("# nginx workers run as " + WORKER_USER.split()[0], flush=True)
    certs = tempfile.mkdtemp(prefix="rlm-certs.")
    make_certs(certs)
    srv = Server()
    print("# the worker's LuaJIT: " + srv.get("/luajit")[1].strip(), flush=True)
    try:
        for case in (case_session, case_concurrent, case_tools, case_phases, case_abort, case_unread_body, case_cancel,
                     case_transport, case_providers, case_reload):
            try:
                case(srv)
            except Exception as e:  # a case that broke is a failure, the others still run
                report(False, case.__name__, "%s: %s" % (type(e).__name__, e))
    finally:
        rc = srv.stop()
        leftover = os.listdir(srv.tmpdir)
        alive = state(srv.proc.pid) not in (None, "Z")
        report(rc == 0 and not leftover and not alive, "nginx stops cleanly and leaves no workdir",
               "exit %s, workdirs %s" % (rc, leftover or "none"))
        log = srv.log()
        sleeps = log.count("without delayed events patch")
        report(sleeps == 0, "no ngx.sleep(0) warnings in error.log", "%d lines" % sleeps)
        bad = [l for l in log.splitlines() if "[alert]" in l or "[emerg]" in l or "[crit]" in l]
        if bad or report.failed:
            print("# error.log (alerts and the last lines), kept in " + srv.prefix)
            for line in (bad + log.splitlines()[-30:])[:60]:
                print("#   " + line)
        else:
            subprocess.run(["rm", "-rf", srv.prefix])
    subprocess.run(["rm", "-rf", certs])
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
