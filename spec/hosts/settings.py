#!/usr/bin/env python3
"""One set of settings, three hosts (issue 43's "Must show"): docs/llm.md's
"Settings" block run as a user runs it, with its local-server line

    export RLM_BASE_URL=http://127.0.0.1:PORT/v1 RLM_MODEL=... RLM_SUB_MODEL=... OPENAI_API_KEY=...
    rlm --context big.log "Which service failed?"       # the command line
    nvim big.log   # then :RlmAsk Which service failed?  # the Neovim plugin
    make openresty-example                              # then docs/adapters.md's curl

in one environment (a user's shell: none of make's or the runner's
variables), its models the stand-in server (spec/helpers/fake_openai.py).
Each host must answer from the file, with the root model and the sub-model
the variables name and the key in the header only; the same script of
replies is served to each. What the test adds to the environment, and
why: PATH starts with bin/ (what `make install` gives); nvim gets --clean,
the checkout on 'runtimepath' and build/5.1 on package.cpath (spec/hosts/run's
nvim-install case tests `make nvim`'s core; here, the settings);
XDG_STATE_HOME (the plugin's journal in a directory of the test's);
RLM_OPENRESTY_PORT and RLM_TMPDIR (a free port, not 8080, on a shared
machine; the workers' scratch directory). Prints one "ok - ..." or
"not ok - ..." line per case. Environment: RLM_ROOT (the checkout),
RLM_BUILD.
"""
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "nginx"))
from hostlib import Tally, free_port  # noqa: E402
from example import Make, user_env, request  # noqa: E402

ROOT = os.environ["RLM_ROOT"]
BUILD = os.environ.get("RLM_BUILD") or os.path.join(ROOT, "build")
SECRET = "sk-rlm-settings-%d" % os.getpid()
QUESTION = "Which service failed?"
LOG = "ERROR billing timeout\nok search\nERROR billing refused\n"
ANSWER = "billing 2 sub-ok"
RUN_TIMEOUT_S = 150

report = Tally("settings")


def script(fake_port):
    """The same replies for every host: the root model reads the file and
    asks the sub-model once."""
    c = http.client.HTTPConnection("127.0.0.1", fake_port, timeout=10)
    c.request("POST", "/_control/script", body=json.dumps({"replies": [
        {"content": "```repl\nn = sum(1 for l in context.splitlines() if l.startswith('ERROR billing'))\n"
                    "r = llm_query('which service?')\nFINAL('billing ' + str(n) + ' ' + r)\n```",
         "usage": [100, 20]},
        {"content": "sub-ok", "usage": [5, 1]},
    ]}))
    c.getresponse().read()
    c.close()


def requests(fake_port):
    c = http.client.HTTPConnection("127.0.0.1", fake_port, timeout=10)
    c.request("GET", "/_control/requests")
    reqs = json.loads(c.getresponse().read())
    c.close()
    models = [r["json"]["model"] for r in reqs if r.get("json")]
    key_ok = bool(reqs) and all(r["headers"].get("authorization") == "Bearer " + SECRET
                                and not r.get("argv_hits") for r in reqs)
    return models, key_ok


def check(name, fake_port, answer, detail):
    models, key_ok = requests(fake_port)
    report(answer == ANSWER and models == ["root-model", "sub-model"] and key_ok, name,
           "answer %r; models %s; key in the header only: %s%s" % (answer, models, key_ok,
                                                                    "; " + detail if detail else ""))


def case_cli(env, work, fake_port):
    script(fake_port)
    p = subprocess.run(["bash", "-c", 'rlm --context big.log "%s"' % QUESTION], cwd=work, env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    check('the command line: rlm --context big.log "%s"' % QUESTION, fake_port, p.stdout.strip(),
          "exit %d%s" % (p.returncode, "; stderr " + p.stderr.strip()[-300:] if p.returncode else ""))


def case_nvim(env, work, fake_port):
    script(fake_port)
    state = tempfile.mkdtemp(prefix="rlm-settings-state.")
    try:
        nenv = dict(env, XDG_STATE_HOME=state, RLM_ASK_QUESTION=QUESTION)
        p = subprocess.run(["nvim", "--headless", "--clean", "-i", "NONE", "-n",
                            "--cmd", "set rtp^=" + ROOT,
                            "--cmd", "lua package.cpath = %r .. package.cpath" % (BUILD + "/5.1/?.so;"),
                            "big.log", "-c", "luafile " + os.path.join(ROOT, "spec/hosts/nvim/ask_once.lua")],
                           cwd=work, env=nenv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)
        said = [l for l in (p.stdout + p.stderr).splitlines() if l.startswith(("answer: ", "error: "))]
        answer = said[0][len("answer: "):] if said and said[0].startswith("answer: ") else None
        check("the Neovim plugin: nvim big.log, then :RlmAsk %s" % QUESTION, fake_port, answer,
              "" if answer else "said %r; exit %d; %s" % (said, p.returncode, (p.stdout + p.stderr)[-300:]))
    finally:
        shutil.rmtree(state, ignore_errors=True)


def case_openresty(env, work, fake_port):
    script(fake_port)
    port = free_port()
    tmpdir = tempfile.mkdtemp(prefix="rlm-settings.")
    os.chmod(tmpdir, 0o777)  # the workers may run as nobody
    prefix = os.path.join(ROOT, "build", "openresty", str(port))
    m = Make(dict(env, RLM_OPENRESTY_PORT=str(port), RLM_TMPDIR=tmpdir))
    try:
        up = m.wait_up(port)[0]
        if not up:
            report(False, "make openresty-example, then curl", "not up, exit %s: %s" % (
                m.proc.poll(), m.output()[-1500:]))
            return
        # docs/adapters.md's curl, with the test's port
        p = subprocess.run(["bash", "-c", "curl -sS --data-binary @big.log "
                            "'http://127.0.0.1:%d/ask?q=Which+service+failed%%3F'" % port],
                           cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)
        try:
            answer = json.loads(p.stdout).get("answer")
        except ValueError:
            answer = None
        check("the OpenResty example: make openresty-example, then curl --data-binary @big.log .../ask", fake_port,
              answer, "" if answer else "curl said %r %r" % (p.stdout[-300:], p.stderr[-300:]))
    finally:
        _, left = m.interrupt()
        if left:
            report(False, "make openresty-example stops on Ctrl-C", "left running: %s" % left)
        shutil.rmtree(tmpdir, ignore_errors=True)
        shutil.rmtree(prefix, ignore_errors=True)


def main():
    fake = subprocess.Popen([sys.executable, os.path.join(ROOT, "spec/helpers/fake_openai.py")],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    work = tempfile.mkdtemp(prefix="rlm-settings-work.")
    try:
        fake_port = int(fake.stdout.readline().split()[0])
        with open(os.path.join(work, "big.log"), "w") as f:
            f.write(LOG)
        # The one exported set, as docs/llm.md gives it (the local-server line).
        env = user_env({"RLM_BASE_URL": "http://127.0.0.1:%d/v1" % fake_port, "RLM_MODEL": "root-model",
                        "RLM_SUB_MODEL": "sub-model", "OPENAI_API_KEY": SECRET})
        env["PATH"] = os.path.join(ROOT, "bin") + ":" + env.get("PATH", "/usr/bin:/bin")
        for case in (case_cli, case_nvim, case_openresty):
            try:
                case(env, work, fake_port)
            except Exception as e:  # a case that broke is a failure; the others still run
                report(False, case.__name__, "%s: %s" % (type(e).__name__, e))
    finally:
        fake.kill()
        fake.wait()
        shutil.rmtree(work, ignore_errors=True)
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
