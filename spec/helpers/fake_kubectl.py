#!/usr/bin/env python3
"""A stand-in for kubectl (kubectl is not ours; the cluster is not here):
the few commands rlm.sandbox.pods runs, over a directory of objects.

FAKE_KUBECTL_DIR holds one JSON file per object (kind.name.json) and
log (one line per call: the arguments, tab-separated). FAKE_KUBECTL_MODE:
  ok            every pod is Ready at once, at 10.9.0.N
  create-fails  create says an admission webhook denied the request (exit 1)
  never-ready   no pod ever gets Ready
A watch (get --watch) prints the pods and then runs until it is killed,
as kubectl's own.
"""
import json
import os
import sys
import time

state = os.environ["FAKE_KUBECTL_DIR"]
mode = os.environ.get("FAKE_KUBECTL_MODE", "ok")
args = sys.argv[1:]
with open(os.path.join(state, "log"), "a") as log:
    log.write("\t".join(args) + "\n")
if args[:1] == ["--namespace"]:
    args = args[2:]


def objects():
    out = []
    for f in sorted(os.listdir(state)):
        if f.endswith(".json"):
            with open(os.path.join(state, f)) as fh:
                out.append(json.load(fh))
    return out


def matches(obj, selector):
    labels = obj["metadata"].get("labels", {})
    for term in selector.split(","):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    return True


def flag(name):
    return args[args.index(name) + 1] if name in args else None


def path_of(kind, name):
    return os.path.join(state, "%s.%s.json" % (kind.lower(), name))


cmd = args[0]
if cmd == "create" and "--dry-run=client" in args:
    with open(flag("-f")) as fh:
        sys.stdout.write(fh.read())
elif cmd == "create":
    if mode == "create-fails":
        sys.stderr.write('Error from server: admission webhook "policy" denied the request\n')
        sys.exit(1)
    with open(flag("-f")) as fh:
        doc = json.load(fh)
    for item in doc["items"]:
        with open(path_of(item["kind"], item["metadata"]["name"]), "w") as fh:
            json.dump(item, fh)
        print("%s/%s" % (item["kind"].lower(), item["metadata"]["name"]))
elif cmd == "get" and "--watch" in args:
    pods = [o for o in objects() if o["kind"] == "Pod" and matches(o, flag("-l"))]
    for i, pod in enumerate(pods):
        ready = "False" if mode == "never-ready" else "True"
        print("%s 10.9.0.%d %s" % (pod["metadata"]["name"], i + 1, ready), flush=True)
    time.sleep(3600)
elif cmd == "get":
    for o in objects():
        if o["kind"] in ("Pod", "Secret") and matches(o, flag("-l")):
            print("%s %s" % (o["metadata"]["name"], o["metadata"]["labels"].get("rlm.sandbox/machine", "")))
elif cmd == "delete":
    if "-l" in args:
        for o in objects():
            if o["kind"] in ("Pod", "Secret") and matches(o, flag("-l")):
                os.remove(path_of(o["kind"], o["metadata"]["name"]))
    for a in args[1:]:
        if "/" in a:
            kind, name = a.split("/", 1)
            if os.path.exists(path_of(kind, name)):
                os.remove(path_of(kind, name))
else:
    sys.stderr.write("fake kubectl: no command %s\n" % cmd)
    sys.exit(2)
