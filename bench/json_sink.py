"""The other way to hand a context over: as one JSON string line on the
driver's stdin. Says hello, reads one line, json.loads it, and answers with
one JSON line: the length it got and RssAnon in kB while both the line and
the str are alive (the peak of this path).

    python3 json_sink.py   (driven by floor_pingpong send)
"""
import json
import sys


def rss_anon_kb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def main():
    out = sys.stdout.buffer
    out.write(b'{"type":"hello"}\n')
    out.flush()
    line = sys.stdin.buffer.readline()
    value = json.loads(line)
    answer = {"chars": len(value), "rss_anon_kb": rss_anon_kb()}
    out.write(json.dumps(answer).encode() + b"\n")
    out.flush()


main()
