"""The minimal driver of the floors: says hello, then answers each line it
reads with that line. With the argument `json` it parses each line and
answers with a small JSON object instead, which is the least a driver that
speaks JSON must do. Only `sys` and `time` (both built in) are imported, so
it starts as fast as the interpreter does; the hello carries the monotonic
time of its first line, for the start-up phases of bench/cold_start.lua."""
import time

STARTED = time.monotonic()

import sys  # noqa: E402


def main():
    read = sys.stdin.buffer.readline
    out = sys.stdout.buffer
    out.write(b'{"type":"hello","protocol":1,"t":[%.6f]}\n' % STARTED)
    out.flush()
    if sys.argv[1:] == ["json"]:
        import json
        while True:
            line = read()
            if not line:
                return
            message = json.loads(line)
            out.write(json.dumps({"type": "reply", "id": message.get("id")}).encode() + b"\n")
            out.flush()
    while True:
        line = read()
        if not line:
            return
        out.write(line)
        out.flush()


main()
