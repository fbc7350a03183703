"""The floor of the context load: map a file and decode it into a str, the
most direct way Python has (what repl_driver.py's read_text does, with
nothing around it). Prints JSON: the milliseconds the decoding took, and
RssAnon afterwards in kB, with the str still alive.

    python3 decode_floor.py PATH
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


def main(path):
    t0 = time.perf_counter()
    with open(path, "rb") as file, \
            mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
        text = str(mapping, "utf-8", "surrogateescape")
    ms = (time.perf_counter() - t0) * 1000
    print(json.dumps({"ms": ms, "rss_anon_kb": rss_anon_kb(), "chars": len(text)}))


main(sys.argv[1])
