"""The minimal driver of the floors: says hello, then answers each line it
reads with that line. With the argument `json` it parses each line and
answers with a small JSON object instead, which is the least a driver that
speaks JSON must do. Only `sys` is imported, so it starts as fast as the
interpreter does."""
import sys


def main():
    read = sys.stdin.buffer.readline
    out = sys.stdout.buffer
    out.write(b'{"type":"hello","protocol":1}\n')
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
