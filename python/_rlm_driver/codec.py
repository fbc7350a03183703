"""JSON for the driver, on the json package's own C accelerator (_json).

dumps and loads give exactly what json.dumps(value, ensure_ascii=False,
allow_nan=False) and json.loads(data) give (the same C scanner and encoder,
the same arguments), without importing the json package at start: it imports
re, which imports enum, functools and collections, a large part of the
driver's start-up. The json package is imported only on an error path (its
JSONDecodeError) or where _json lacks the accelerator; model code that
imports json gets the real package, as before.
"""

try:
    from _json import encode_basestring, make_encoder, make_scanner
except ImportError:  # an interpreter without the accelerator: the package itself
    encode_basestring = make_encoder = make_scanner = None

WHITESPACE = " \t\n\r"
CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


def refuse(value):
    """JSONEncoder.default: what is not JSON."""
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


class Decoding:
    """What the C scanner reads from json.JSONDecoder(): its defaults."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = CONSTANTS.__getitem__


def decode_error(message, text, at):
    from json import JSONDecodeError
    return JSONDecodeError(message, text, at)


def skip_whitespace(text, at):
    """The index of the first non-whitespace character from `at` (a chunk at
    a time: no copy of a large text)."""
    end = len(text)
    while at < end:
        chunk = text[at:at + 65536]
        rest = chunk.lstrip(WHITESPACE)
        at += len(chunk) - len(rest)
        if rest:
            break
    return at


def text_encoding(data):
    """The encoding json.loads reads bytes in: a BOM, or the NUL bytes of
    UTF-16 or UTF-32 in the first four bytes (RFC 4627); else UTF-8."""
    if data[:4] in (b"\x00\x00\xfe\xff", b"\xff\xfe\x00\x00"):
        return "utf-32"
    if data[:2] in (b"\xfe\xff", b"\xff\xfe"):
        return "utf-16"
    if data[:3] == b"\xef\xbb\xbf":
        return "utf-8-sig"
    if len(data) >= 4:
        if not data[0]:
            return "utf-16-be" if data[1] else "utf-32-be"
        if not data[1]:
            return "utf-16-le" if data[2] or data[3] else "utf-32-le"
    elif len(data) == 2:
        if not data[0]:
            return "utf-16-be"
        if not data[1]:
            return "utf-16-le"
    return "utf-8"


if make_encoder is not None and make_scanner is not None:
    scan_once = make_scanner(Decoding())

    def dumps(value):
        """json.dumps(value, ensure_ascii=False, allow_nan=False)."""
        if isinstance(value, str):
            return encode_basestring(value)
        # markers, default, encoder, indent, key and item separators,
        # sort_keys, skipkeys, allow_nan: what JSONEncoder passes.
        encode = make_encoder({}, refuse, encode_basestring, None, ": ", ", ",
                              False, False, False)
        return "".join(encode(value, 0))

    # A request the driver built (str, int, lists and dicts of them) is never
    # circular: its encoder is made once and keeps no markers.
    _plain = make_encoder(None, refuse, encode_basestring, None, ":", ",", False, False, False)

    def dumps_plain(value):
        """dumps(value) without spaces, for a value that cannot be circular."""
        return "".join(_plain(value, 0))

    def loads(data):
        """json.loads(data): str, bytes or bytearray."""
        if isinstance(data, str):
            if data.startswith("\ufeff"):
                raise decode_error("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)
            text = data
        elif isinstance(data, (bytes, bytearray)):
            text = data.decode(text_encoding(data), "surrogatepass")
        else:
            raise TypeError(f"the JSON object must be str, bytes or bytearray, "
                            f"not {data.__class__.__name__}")
        try:
            value, end = scan_once(text, skip_whitespace(text, 0))
        except StopIteration as stop:
            raise decode_error("Expecting value", text, stop.value) from None
        end = skip_whitespace(text, end)
        if end != len(text):
            raise decode_error("Extra data", text, end)
        return value
else:
    def dumps(value):
        import json
        return json.dumps(value, ensure_ascii=False, allow_nan=False)

    dumps_plain = dumps

    def loads(data):
        import json
        return json.loads(data)
