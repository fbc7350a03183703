"""The context-load floors, beside repl_driver.py's read_text. Each prints
one JSON line with the characters it got and RssAnon afterwards in kB, with
the str still alive.

    python3 context_floor.py decode PATH
        map a file and decode it into a str, the most direct way Python has
        (what read_text does, with nothing around it); also the ms it took.
    python3 context_floor.py sink
        the other way to hand a context over: as one JSON string line on
        stdin. Says hello, reads one line and json.loads it (driven by
        floor_pingpong send); its RssAnon is the peak of that path, with the
        line and the str both alive.
"""
import json
import mmap
import sys
import time


def rss_anon_kb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def decode(path):
    t0 = time.perf_counter()
    with open(path, "rb") as file, \
            mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
        text = str(mapping, "utf-8", "surrogateescape")
    ms = (time.perf_counter() - t0) * 1000
    print(json.dumps({"ms": ms, "rss_anon_kb": rss_anon_kb(), "chars": len(text)}))


def sink():
    out = sys.stdout.buffer
    out.write(b'{"type":"hello"}\n')
    out.flush()
    line = sys.stdin.buffer.readline()
    value = json.loads(line)  # the line is kept alive: this is the path's peak
    answer = {"chars": len(value), "rss_anon_kb": rss_anon_kb()}
    out.write(json.dumps(answer).encode() + b"\n")
    out.flush()


if sys.argv[1] == "decode":
    decode(sys.argv[2])
else:
    sink()
