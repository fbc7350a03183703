#!/usr/bin/env python3
"""examples/openresty's durable mode, started as a user starts it (`make
openresty-example` with RLM_REDIS), with 2 workers (RLM_OPENRESTY_WORKERS),
its journal in a redis-server of this test's own (a unix
socket in a directory the test made; never the system's service), its
models the stand-in server (spec/helpers/fake_openai.py).

Cases: a run left alone answers, and leaves nothing in Redis; the same run,
its worker killed with SIGKILL while a sub-call is out at the model server,
asked again with its session id: another worker resumes it and answers the
same, and the server saw no request twice whose answer had been recorded
(only the sub-call in flight at the kill is asked again); the dead worker's
lease is let go at once, not waited out (its 30 s). Prints one
"ok - ..." or "not ok - ..." line per case. Environment: RLM_ROOT.
"""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from example import Make, START_TIMEOUT_S, request, user_env
from hostlib import Tally, descendants, free_port, state

ROOT = os.environ["RLM_ROOT"]
RESUME_TIMEOUT_S = 120  # how long the client asks again while it gets 409
# The killed worker's lease is let go by the resuming worker (its owner
# names a pid of this machine that is gone), not waited out (its ttl, 30 s):
# the resume ends well within this, however loaded the machine.
RESUMED_WITHIN_S = 15
BODY = "ERROR a\nok\nERROR b\n"
QUERY = "/ask?q=How+many+errors%3F"

report = Tally("openresty-durable")


def root(code):
    return {"content": "```repl\n" + code + "\n```", "usage": [100, 20]}


def script(slow_ms):
    """Step 1 asks three sub-calls one after another, the third slow (the
    kill's moment); step 2 answers from them. With slow_ms, the third is
    asked twice: once before the kill, once by the resumed run."""
    third = [{"content": "C", "usage": [5, 1], "delay_ms": slow_ms}] if slow_ms else []
    return [root("n = sum(1 for l in context.splitlines() if 'ERROR' in l)\n"
                 "a = llm_query('first')\nb = llm_query('second')\nc = llm_query('third, slow')\nprint(a, b, c)"),
            {"content": "A", "usage": [5, 1]}, {"content": "B", "usage": [5, 1]}] + third + [
            {"content": "C", "usage": [5, 1]},
            root("FINAL(a + '-' + b + '-' + c + ' ' + str(n))")]


class Redis:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="rlm-redis-host.")
        os.chmod(self.dir, 0o755)  # the workers may run as nobody
        self.socket = os.path.join(self.dir, "redis.sock")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.socket, "--unixsocketperm", "777",
             "--dir", self.dir, "--save", "", "--appendonly", "no", "--logfile", os.path.join(self.dir, "log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while self.cli("PING") != "PONG":
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def cli(self, *args):
        r = subprocess.run(["redis-cli", "-s", self.socket] + list(args), capture_output=True, text=True)
        return r.stdout.strip()

    def keys(self):
        return [k for k in self.cli("--scan", "--pattern", "rlm:journal:*").splitlines() if k]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Fake:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "spec/helpers/fake_openai.py")],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, text=True)
        self.port = int(self.proc.stdout.readline().split()[0])

    def control(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request(method, path, body=json.dumps(body) if body is not None else None)
        reply = json.loads(c.getresponse().read())
        c.close()
        return reply

    def asked(self):
        """What each request asked: its last message's content."""
        out = []
        for r in self.control("GET", "/_control/requests"):
            msgs = (r.get("json") or {}).get("messages") or [{}]
            out.append(json.dumps(msgs[-1].get("content"))[:80] + " #%d" % len(msgs))
        return out

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def ask(port, session=None, timeout=90):
    """POST /ask; returns (status, headers, body as JSON or text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", QUERY + ("&session=" + session if session else ""), body=BODY)
        r = c.getresponse()
        headers = dict(r.getheaders())
        try:
            text = r.read().decode()
        except (http.client.IncompleteRead, OSError) as e:
            return r.status, headers, "(cut: %s)" % type(e).__name__
    finally:
        c.close()
    try:
        return r.status, headers, json.loads(text)
    except ValueError:
        return r.status, headers, text


def workers(make):
    return [p for p in descendants(make.proc.pid) if open("/proc/%d/cmdline" % p).read().startswith("nginx: worker")]


def run_cases(port, fake, redis, make, tmpdir):
    fake.control("POST", "/_control/script", {"replies": script(0)})
    status, headers, got = ask(port)
    plain = got.get("answer") if isinstance(got, dict) else None
    report(status == 200 and plain == "A-B-C 2" and headers.get("X-Rlm-Session") == got.get("session")
           and not redis.keys(),
           "a journaled run answers, its id in X-Rlm-Session, and leaves nothing in Redis",
           "%s %r; session %s; keys left: %s" % (status, got, headers.get("X-Rlm-Session"), redis.keys() or "none"))

    fake.control("POST", "/_control/script", {"replies": script(60000)})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=90)
    c.request("POST", QUERY, body=BODY)
    r = c.getresponse()  # the headers come as the run starts
    session, worker = r.getheader("X-Rlm-Session"), int(r.getheader("X-Rlm-Worker") or 0)
    deadline = time.time() + 60
    while len(fake.asked()) < 4 and time.time() < deadline:
        time.sleep(0.05)
    before = fake.asked()
    if r.status != 200 or worker <= 0 or not session:
        report(False, "a journaled run killed mid-sub-call is resumed by another worker",
               "the run did not start: %s %s" % (r.status, r.read()[:300]))
        return
    sandbox = descendants(worker)
    n_workers = len(workers(make))
    os.kill(worker, signal.SIGKILL)
    t_kill = time.time()
    try:
        r.read()
    except (http.client.IncompleteRead, OSError):
        pass
    c.close()
    status, got, tries = None, None, 0
    while time.time() - t_kill < RESUME_TIMEOUT_S:
        tries += 1
        status, headers, got = ask(port, session)
        if status != 409:
            break
        time.sleep(min(5, max(1, int(headers.get("Retry-After", "1")))))
    took = time.time() - t_kill
    resumed_by = int(headers.get("X-Rlm-Worker") or 0)
    after = fake.asked()[len(before):]
    recorded = before[:3]  # the root call and the two sub-calls answered before the kill
    twice = [a for a in after if a in recorded]
    answer = got.get("answer") if isinstance(got, dict) else None
    report(len(before) == 4 and status == 200 and answer == plain and resumed_by not in (0, worker)
           and n_workers == 2,
           "a worker killed (SIGKILL) while a sub-call is out: asked again with the session id, another worker "
           "resumes the run through Redis and answers the same",
           "%d workers; killed %d after %d requests, resumed by %d after %.1f s and %d asks: %s %r" % (
               n_workers, worker, len(before), resumed_by, took, tries, status, got))
    report(status == 200 and tries == 1 and took < RESUMED_WITHIN_S,
           "the dead worker's lease is let go at once: the first ask again resumes, within %d s of the kill "
           "(not after its 30 s ttl)" % RESUMED_WITHIN_S,
           "%d asks, the answer %.1f s after the kill" % (tries, took))
    report(len(before) == 4 and after and not twice and after[0] == before[3],
           "no request whose answer had been recorded is made again (only the sub-call in flight at the kill)",
           "before the kill %s; after %s" % (before, after))
    status, _, again = ask(port, session)
    report(status == 502 and isinstance(again, dict) and again.get("error") == "journal_error",
           "asked again after it finished, the run is gone: 502 journal_error", "%s %r" % (status, again))
    left = [p for p in sandbox if state(p) not in (None, "Z")]
    report(sandbox and not left and not redis.keys(),
           "the killed worker's sandbox is gone, and the finished run's journal is deleted",
           "%d sandbox processes, left %s; keys left %s" % (len(sandbox), left or "none", redis.keys() or "none"))


def main():
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        print("not ok - openresty-durable: redis-server is not installed (make deps)")
        return 1
    redis, fake, make = Redis(), Fake(), None
    tmpdir = tempfile.mkdtemp(prefix="rlm-durable.")
    os.chmod(tmpdir, 0o777)  # the workers may run as nobody
    port = free_port()
    try:
        make = Make(user_env({"RLM_OPENRESTY_PORT": str(port), "RLM_MODEL": "root-model",
                              "RLM_SUB_MODEL": "sub-model", "RLM_BASE_URL": "http://127.0.0.1:%d/v1" % fake.port,
                              "OPENAI_API_KEY": "sk-durable", "RLM_TMPDIR": tmpdir,
                              "RLM_REDIS": "unix:" + redis.socket, "RLM_OPENRESTY_WORKERS": "2"}))
        t0, up = time.time(), False
        while time.time() - t0 < START_TIMEOUT_S and make.proc.poll() is None and not up:
            try:
                up = request(port, "/ping", timeout=5)[1].strip() == "pong"
            except OSError:
                time.sleep(0.2)
        if not up:
            report(False, "make openresty-example with RLM_REDIS serves /ask", make.output()[-2000:])
        else:
            run_cases(port, fake, redis, make, tmpdir)
    except Exception as e:  # a case that broke is a failure
        report(False, "durable mode", "%s: %s" % (type(e).__name__, e))
    finally:
        if make:
            make.interrupt()
            if report.failed:
                print("# make openresty-example's output:")
                for line in make.output().splitlines()[-40:]:
                    print("#   " + line)
        fake.stop()
        redis.stop()
        shutil.rmtree(tmpdir, ignore_errors=True)  # the killed worker's work directory too
        shutil.rmtree(os.path.join(ROOT, "build", "openresty", str(port)), ignore_errors=True)
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
