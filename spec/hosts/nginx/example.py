#!/usr/bin/env python3
"""`make openresty-example`, the command docs/adapters.md gives, run as a
user runs it: in the checkout, with the model settings in the environment
(docs/llm.md, "Settings"), its models the stand-in server
(spec/helpers/fake_openai.py), on a free port (RLM_OPENRESTY_PORT), then
stopped with Ctrl-C (SIGINT to its process group, as a terminal sends it).

Cases: without RLM_MODEL it stops before nginx starts, saying so in one
line; with the settings, POST /ask answers through rlm.llm.openai over the
cosocket transport (a 429 waited out, the kv_get tool over ngx.shared, the
key in the header only), and after Ctrl-C nothing it started is left
running and no work directory is left. Prints one "ok - ..." or
"not ok - ..." line per case. Environment: RLM_ROOT (the checkout).
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

from hostlib import Tally, comm, descendants, free_port, state

ROOT = os.environ["RLM_ROOT"]
SECRET = "sk-rlm-example-%d" % os.getpid()
START_TIMEOUT_S = 180  # make's steps, under a load of 12 on 2 cores
STOP_TIMEOUT_S = 30

report = Tally("openresty-example")


def user_env(extra):
    """The environment of a user's shell: none of make's own variables (this
    runs under make test-hosts), none of the test runner's, no model
    settings but those of the case."""
    drop = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "RLM_ROOT", "RLM_BUILD", "RLM_RESTY_ROOT",
            "RLM_HOSTS_TMPDIR", "RLM_PROVIDER", "RLM_BASE_URL", "RLM_MODEL", "RLM_SUB_MODEL", "RLM_API_KEY_ENV",
            "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "RLM_ROOT_MODEL", "RLM_API_KEY"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


def group_members(pgid):
    """The processes (not zombies) whose process group is pgid."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(name))
    return out


class Make:
    """make openresty-example in the checkout, in a process group of its own."""

    def __init__(self, env):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(["make", "openresty-example"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self):
        self.log.seek(0)
        return self.log.read()

    def wait_up(self, port):
        """Until the example answers /ping on port (or make ends, or
        START_TIMEOUT_S): whether it does, and the seconds it took."""
        t0 = time.time()
        while time.time() - t0 < START_TIMEOUT_S and self.proc.poll() is None:
            try:
                if request(port, "/ping", timeout=5)[1].strip() == "pong":
                    return True, time.time() - t0
            except OSError:
                pass
            time.sleep(0.2)
        return False, time.time() - t0

    def interrupt(self):
        """Ctrl-C: SIGINT to the process group; every process it had must go."""
        seen = set(descendants(self.proc.pid)) | set(group_members(self.proc.pid))
        self.names = sorted({comm(p) for p in seen} - {"?"})
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + STOP_TIMEOUT_S
        while time.time() < deadline:
            left = [p for p in seen | set(group_members(self.proc.pid)) if state(p) not in (None, "Z")]
            if not left and self.proc.poll() is not None:
                return seen, []
            time.sleep(0.1)
        left = [p for p in seen | set(group_members(self.proc.pid)) if state(p) not in (None, "Z")]
        for p in left:  # what is left is this test's own: do not leave it behind
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        self.proc.kill()
        self.proc.wait()
        return seen, left


def request(port, path, method="GET", body=None, headers=None, timeout=90):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def case_no_model():
    port = free_port()
    m = Make(user_env({"RLM_OPENRESTY_PORT": str(port)}))
    try:
        rc = m.proc.wait(START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        rc = None
    _, left = m.interrupt()
    out = m.output()
    line = "make openresty-example: no model: set RLM_MODEL"
    said = [l for l in out.splitlines() if "no model" in l]
    report(rc not in (0, None) and said == [line] and "traceback" not in out and not left
           and not os.path.exists(os.path.join(ROOT, "build", "openresty", str(port))),
           "without RLM_MODEL it stops before nginx starts, in one line",
           "exit %s; %r; left running: %s" % (rc, said, left or "nothing"))


def case_answers():
    fake = subprocess.Popen([sys.executable, os.path.join(ROOT, "spec/helpers/fake_openai.py")],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    tmpdir = tempfile.mkdtemp(prefix="rlm-example.")
    os.chmod(tmpdir, 0o777)  # the workers may run as nobody
    port = free_port()
    prefix = os.path.join(ROOT, "build", "openresty", str(port))
    m = None
    try:
        fake_port = int(fake.stdout.readline().split()[0])

        def control(method, path, body=None):
            c = http.client.HTTPConnection("127.0.0.1", fake_port, timeout=10)
            c.request(method, path, body=json.dumps(body) if body is not None else None)
            reply = json.loads(c.getresponse().read())
            c.close()
            return reply

        control("POST", "/_control/script", {"replies": [
            {"content": "```repl\nn = sum(1 for l in context.splitlines() if 'ERROR' in l)\n"
                        "r = llm_query('say hi')\nFINAL(str(n) + ' ' + r + ' ' + kv_get('owner'))\n```",
             "usage": [100, 20]},
            {"status": 429, "headers": {"retry-after-ms": "200"}, "json": {"error": {"message": "slow down"}}},
            {"content": "hi", "usage": [5, 1], "delay_ms": 200},
        ]})
        m = Make(user_env({"RLM_OPENRESTY_PORT": str(port), "RLM_MODEL": "root-model", "RLM_SUB_MODEL": "sub-model",
                           "RLM_BASE_URL": "http://127.0.0.1:%d/v1" % fake_port, "OPENAI_API_KEY": SECRET,
                           "RLM_TMPDIR": tmpdir}))
        up, started = m.wait_up(port)
        if not up:
            report(False, "make openresty-example serves /ask", "not up after %.0f s, exit %s: %s" % (
                started, m.proc.poll(), m.output()[-2000:]))
            return
        put = request(port, "/kv?key=owner", "PUT", "team-db")[0]
        status, body = request(port, "/ask?q=How+many+errors%3F", "POST", "ERROR a\nok\nERROR b\n",
                               {"Cookie": "session=client-secret"})
        try:
            got = json.loads(body)
        except ValueError:
            got = {"error": body}
        reqs = control("GET", "/_control/requests")
        models = [r["json"]["model"] for r in reqs if r.get("json")]
        auth_ok = bool(reqs) and all(r["headers"].get("authorization") == "Bearer " + SECRET for r in reqs)
        leaked = [r for r in reqs if "cookie" in r["headers"] or r.get("argv_hits")]
        report(put == 200 and status == 200 and got.get("answer") == "2 hi team-db"
               and models == ["root-model", "sub-model", "sub-model"] and auth_ok and not leaked
               and got.get("tokens", {}).get("total") == 126,
               "make openresty-example serves /ask: rlm.llm.openai over the cosocket transport, a 429 waited "
               "out, kv_get over ngx.shared",
               "up after %.1f s; %s %r; models %s; key in the header only: %s; tokens %s" % (
                   started, status, got.get("answer") or got, models, auth_ok and not leaked, got.get("tokens")))
        seen, left = m.interrupt()
        workdirs = os.listdir(tmpdir)
        names = m.names
        report(not left and not workdirs and "nginx" in names,
               "Ctrl-C stops it: nothing it started is left running, no work directory left",
               "%d processes before (%s), left: %s; workdirs: %s" % (
                   len(seen), ", ".join(names), left or "none", workdirs or "none"))
    finally:
        if m and m.proc.poll() is None:
            m.interrupt()
        fake.kill()
        fake.wait()
        shutil.rmtree(tmpdir, ignore_errors=True)
        if report.failed == 0:
            shutil.rmtree(prefix, ignore_errors=True)
        elif m:
            print("# make openresty-example's output:")
            for line in m.output().splitlines()[-40:]:
                print("#   " + line)


def main():
    for case in (case_no_model, case_answers):
        try:
            case()
        except Exception as e:  # a case that broke is a failure, the other still runs
            report(False, case.__name__, "%s: %s" % (type(e).__name__, e))
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
