"""codec_check.py DRIVER_DIR: the driver's codec (python/_rlm_driver/codec.py)
against the json package, value by value: the same text, the same values,
the same exceptions (type and message). Prints one line per difference and
"ok N" at the end; exits 1 on a difference. Loaded by path, without the
package (whose protocol module takes over stdin and stdout)."""
import importlib.util
import json
import math
import os
import sys

spec = importlib.util.spec_from_file_location(
    "codec", os.path.join(sys.argv[1], "_rlm_driver", "codec.py"))
codec = importlib.util.module_from_spec(spec)
spec.loader.exec_module(codec)
assert codec.make_encoder is not None, "the C accelerator is missing"


class Str(str):
    pass


class Int(int):
    pass


class Float(float):
    pass


cycle = []
cycle.append(cycle)
VALUES = [
    None, True, False, 0, -1, 2 ** 63, -2 ** 63 - 1, 2 ** 200, 1.0, 3.0, -0.0, 0.1, 1e300, 1e-300,
    5e-324, 1.152921504606847e+18, float("nan"), float("inf"), float("-inf"), "", "plain",
    "é\u2028\u2029\x00\x1f\"\\/", "\ud800 lone", "\U0001f600", Str("sub"), Int(7), Float(2.5),
    [], {}, [1, [2, [3, {}]]], {"a": 1, "b": [None, True]}, {1: "a", 2.5: "b", None: 1, True: 2,
                                                              False: 3}, {(1, 2): 3}, (1, 2),
    {"x": {1, 2}}, object(), b"bytes", cycle, {"k": cycle}, [float("nan")], {"f": float("inf")},
    {"__class__": 1}, ["x" * 100000], list(range(1000)),
]
TEXTS = [
    '{"type": "exec", "id": 7, "code": "print(1)"}', '  [1, 2.5, "x", null, true]  \n', "1",
    "-0", "1e999", "-1e999", "NaN", "Infinity", "-Infinity", "1.5e3", "123456789012345678901234567890",
    '"\\ud800"', '"\\u00e9"', "", " ", "[", "[1,]", "{}x", "{} {}", '{"a" 1}', "\ufeff[1]", "\t\n\r 7 \t",
    "[" * 100 + "]" * 100, '"' + "x" * 70000 + '"', "nul", "tru", '{"a":1,"a":2}', "\x00", "[1]\x00",
    " " * 200000 + "3" + " " * 200000, '"\x01"', "01", "1.", ".5", "[1 2]",
]
RAW = [b'{"type":"hello"}', b"\xef\xbb\xbf[1]", "[1]".encode("utf-16"), "[1]".encode("utf-16-le"),
       "[1]".encode("utf-16-be"), "[1]".encode("utf-32"), "[1]".encode("utf-32-le"),
       "[1]".encode("utf-32-be"), "7".encode("utf-16-le"), "7".encode("utf-16-be"), b"\xff",
       b'"\xed\xa0\x80"', b"", bytearray(b"[2]"), b'{"a": "\xc3\xa9"}', 7, None, ["x"]]


def outcome(call, *args):
    try:
        result = call(*args)
    except BaseException as exc:
        return ("raise", type(exc).__name__, str(exc))
    return ("value", repr(result))


def same(a, b):
    return a == b or (a[0] == b[0] == "value" and "nan" in a[1] and a[1] == b[1])


bad = n = 0
for value in VALUES:
    n += 1
    mine = outcome(codec.dumps, value)
    theirs = outcome(lambda v: json.dumps(v, ensure_ascii=False, allow_nan=False), value)
    if not same(mine, theirs):
        bad += 1
        print(f"dumps({value!r:.60}): {mine!r:.200} != {theirs!r:.200}")
for text in TEXTS + RAW + [t.encode("utf-8", "surrogatepass") for t in TEXTS]:
    n += 1
    mine, theirs = outcome(codec.loads, text), outcome(json.loads, text)
    if not same(mine, theirs):
        bad += 1
        print(f"loads({text!r:.60}): {mine!r:.200} != {theirs!r:.200}")
# Values parse back the same (floats by their text: nan != nan).
for value in VALUES[:40]:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        continue
    n += 1
    if repr(codec.loads(text)) != repr(json.loads(text)):
        bad += 1
        print(f"round trip of {value!r:.60} differs")
print(f"ok {n}" if not bad else f"{bad} of {n} differ")
sys.exit(1 if bad else 0)
