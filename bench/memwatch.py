"""Watches the peak anonymous memory of a sandboxed driver: the python
process whose parent is bubblewrap, below the host process HOST_PID. Polls
/proc/PID/status every INTERVAL seconds; says "ready" once it polls, and
when the driver it found is gone (or STOP_FILE exists before it found one)
prints JSON: the peak RssAnon and the last VmHWM seen, in kB. VmHWM counts
file pages too, such as a mapped context file; RssAnon does not.

    python3 memwatch.py HOST_PID INTERVAL STOP_FILE
"""
import json
import os
import sys
import time


def read(path):
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return ""


def children(pid):
    # Every thread's: rlm.core starts each sandbox from a thread of its own.
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [int(p) for t in tasks for p in read(f"/proc/{pid}/task/{t}/children").split()]


def find_driver(host):
    pending = children(host)
    while pending:
        pid = pending.pop()
        kids = children(pid)
        if read(f"/proc/{pid}/comm").strip() == "bwrap":
            for kid in kids:
                if read(f"/proc/{kid}/comm").startswith("python"):
                    return kid
        pending += kids
    return None


def status_kb(text, key):
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def main(host, interval, stop_file):
    print("ready", flush=True)
    driver, peak, hwm = None, 0, 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if driver is None:
            driver = find_driver(host)
            if driver is None and os.path.exists(stop_file):
                break
        else:
            text = read(f"/proc/{driver}/status")
            anon = status_kb(text, "RssAnon")
            if anon is None:  # gone
                break
            peak, hwm = max(peak, anon), status_kb(text, "VmHWM") or hwm
        time.sleep(interval)
    print(json.dumps({"found": driver is not None, "peak_rss_anon_kb": peak, "vm_hwm_kb": hwm}))


main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3])
