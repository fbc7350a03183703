"""sandbox/image/seccomp.py IN OUT: the container engine's seccomp profile
IN (Podman's /usr/share/containers/seccomp.json, or Docker's default) with
the calls bubblewrap makes inside the container allowed outright, written
to OUT.

bubblewrap makes a user namespace first and the rest inside it: clone and
unshare with namespace flags, mount, umount2 and pivot_root for its root,
sethostname for --hostname. Engines allow these only with CAP_SYS_ADMIN
(Docker: all of them; Podman: sethostname and setdomainname), and the
filter is made from the container's capabilities, not from what a process
holds in a namespace of its own: bubblewrap's sethostname fails there even
though the kernel would allow it. Allowing them in the filter gives the
container nothing new: outside a user namespace of its own, each still
needs CAP_SYS_ADMIN, which the container does not have (--cap-drop=ALL);
the kernel is what decides. Everything else in IN is kept as it is.
"""
import json
import sys

NEEDED = ["clone", "unshare", "mount", "umount2", "pivot_root", "sethostname", "setdomainname"]


def unconditional_allow(rule):
    return (rule.get("action") == "SCMP_ACT_ALLOW" and not rule.get("args")
            and not rule.get("includes") and not rule.get("excludes"))


def widen(profile):
    if not isinstance(profile.get("syscalls"), list):
        raise ValueError("not a seccomp profile: no 'syscalls' list")
    kept, allowed = [], set()
    for rule in profile["syscalls"]:
        names = rule.get("names") or ([rule["name"]] if "name" in rule else [])
        if not unconditional_allow(rule):
            names = [n for n in names if n not in NEEDED]
            if not names:
                continue  # a rule about these calls alone
        else:
            allowed.update(names)
        rule = dict(rule)
        rule.pop("name", None)
        rule["names"] = names
        kept.append(rule)
    missing = [n for n in NEEDED if n not in allowed]
    if missing:
        kept.append({"names": missing, "action": "SCMP_ACT_ALLOW", "args": [],
                     "comment": "rlm: bubblewrap's namespaces inside the container (sandbox/image/seccomp.py)"})
    profile["syscalls"] = kept
    return profile


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: sandbox/image/seccomp.py IN OUT")
    with open(sys.argv[1], encoding="utf-8") as f:
        profile = json.load(f)
    try:
        widen(profile)
    except ValueError as e:
        sys.exit("sandbox/image/seccomp.py: %s: %s" % (sys.argv[1], e))
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(profile, f, indent=1)
        f.write("\n")


main()
