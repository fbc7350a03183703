"""The line-delimited JSON protocol of docs/protocol.md, on the driver's side.

The real channels stay private to this module: sys.stdin reads end of file
and sys.stdout is stderr, so that a stray print() or input() never touches
the protocol. Calls back to the host (call, call_batch) may come from any
thread of the REPL's code: they are serialised by one lock, so the host sees
one call at a time, and each reply is matched to its request by id.
"""

import _thread
import io
import posix  # os's _exit: os itself is not imported at the driver's start
import sys

from . import codec, state

PROTOCOL_IN = sys.stdin.buffer
PROTOCOL_OUT = sys.stdout.buffer
sys.stdin = io.StringIO()  # input() sees end of file, never a protocol line
sys.stdout = sys.stderr  # a stray print() must not corrupt the protocol

# Held by one call from its request to its last reply, and by the message
# loop while it answers a step, so no two readers or writers ever share the
# pipes (see call and main.run_step).
CHANNEL = _thread.RLock()  # threading.RLock, without importing threading
last_request_id = 0  # numbered under CHANNEL (itertools.count, without itertools)
# The driver's main thread (this module is imported on it): threading's
# main_thread(), without importing threading.
MAIN_THREAD = _thread.get_ident()


def on_main_thread():
    return _thread.get_ident() == MAIN_THREAD


def encode(message, plain=False):
    text = codec.dumps_plain(message) if plain else codec.dumps(message)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (from surrogateescape) are not UTF-8: send U+FFFD.
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return text.encode("utf-8")


def send(message, data=None, flush=True):
    """Writes a message; flush=False leaves it in the buffer for the next
    send's flush (main's start-up replies, when the next message is there)."""
    if data is None:
        data = encode(message)
    with CHANNEL:
        try:
            PROTOCOL_OUT.write(data + b"\n")
            if flush:
                PROTOCOL_OUT.flush()
        except OSError:  # the host has gone away
            posix._exit(0)


def receive():
    """The next message from the host, or None at end of input; anything
    but a message is fatal. Bytes that are not UTF-8 (a callback's answer
    may hold any) read as U+FFFD."""
    line = PROTOCOL_IN.readline()
    if not line:
        return None
    try:
        message = codec.loads(line.decode("utf-8", "replace"))
    except ValueError as exc:
        fatal(f"host sent a line that is not JSON: {exc}")
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        fatal("host sent a message that is not an object with a string 'type'")
    return message


def fatal(reason):
    # os._exit, not sys.exit: this may run inside user code, which could
    # catch SystemExit.
    print(f"repl_driver: fatal: {reason}", file=sys.__stderr__, flush=True)
    send({"type": "fatal", "message": reason})
    posix._exit(2)


def field(message, name, kind, default=None):
    """message[name], which must be a `kind` (a bool is not an int here)."""
    if name not in message:
        return default
    value = message[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        fatal(f"{message['type']}: field {name!r} must be {kind.__name__}")
    return value


def string_list(message, name, default=None):
    values = field(message, name, list, default)
    if values is not None and not all(isinstance(v, str) for v in values):
        fatal(f"{message['type']}: field {name!r} must be a list of strings")
    return values


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


# The step ran past step_timeout_ms: the host interrupted it (SIGINT, or the
# answer to the call the code waited on). A KeyboardInterrupt, so that
# `except Exception:` lets it through and the block is rolled back.
INTERRUPT_MESSAGE = ("the step ran past step_timeout_ms: the host interrupted it "
                     "(this block's changes are rolled back)")


def interrupt_now():
    """Raise the step's interrupt here (once a step)."""
    session = state.current
    session.interrupt_pending = False
    session.interrupt_raised = True
    raise KeyboardInterrupt(INTERRUPT_MESSAGE)


class MainThreadBusy:
    """Marks the main thread as inside a call to the host: SIGINT's handler
    does not raise there (a protocol line half read or written would be
    lost); the interrupt is raised when the call is over."""

    def __enter__(self):
        if on_main_thread():
            state.current.main_busy += 1

    def __exit__(self, kind, value, traceback):
        if on_main_thread():
            state.current.main_busy -= 1
            if kind is None:
                raise_pending_interrupt()
        return False


def in_call():
    """Whether the main thread (where SIGINT's handler runs) is inside a call
    to the host: under BUSY, or holding the channel (a protocol line half
    written or read)."""
    return state.current.main_busy > 0 or CHANNEL._is_owned()


def raise_pending_interrupt():
    """The interrupt that came while the main thread was inside a call to the
    host, raised once the last such call is over."""
    session = state.current
    if (session.interrupt_pending and session.executing and not session.interrupt_raised
            and on_main_thread() and not in_call()):
        interrupt_now()


BUSY = MainThreadBusy()  # it holds no state: one for every call


class SubCallError(str):
    """A failed sub-call's slot in a batch: a str, so joining the answers
    works, that says "Error: ..." and can be told apart with
    isinstance(answer, SubCallError)."""


def begin_call(request, what, plain=False):
    """Numbers the request and sends it, unless the host would refuse its
    size; the caller holds CHANNEL. Outside a step the host takes no call.
    plain: the request holds only str, int, and lists and dicts of them (a
    sub-call's, built here), for the encoder made once."""
    if not state.current.in_step:
        raise RuntimeError(f"{what}: calls to the host are only possible while a step runs "
                           "(a thread that outlives its step cannot make them)")
    global last_request_id
    last_request_id += 1
    request_id = request["id"] = last_request_id
    data = encode(request, plain)
    check_size(len(data), what)
    send(request, data)
    return request_id


def check_size(size, what):
    """Raise unless a line of `size` bytes (without its newline) fits the
    host's limit."""
    limit = state.current.message_limit
    if size > limit:
        raise ValueError(f"{what} is {size} bytes as a message, more than the host accepts "
                         f"({limit} bytes): split it into smaller calls")


def next_reply(request_id, what, kind="llm_result"):
    """The next `kind` message for request_id; any other message is fatal
    (with CHANNEL held, no other request is in flight). An `interrupted`
    answer raises the step's interrupt."""
    reply = receive()
    if reply is None:
        posix._exit(0)  # the host asked us to leave
    if reply["type"] != kind or reply.get("id") != request_id:
        fatal(f"expected {kind} for {what} {request_id}, got {reply['type']} "
              f"for {reply.get('id')!r}")
    if reply.get("interrupted") is True:
        if on_main_thread():
            interrupt_now()
        raise KeyboardInterrupt(INTERRUPT_MESSAGE)
    return reply


def call(request, what):
    """One call back to the host: its answer, or its error raised here."""
    with BUSY, CHANNEL:
        request_id = begin_call(request, what, plain=True)
        reply = next_reply(request_id, "request")
    if reply.get("error") is not None:
        raise RuntimeError(str(reply["error"]))
    text = reply.get("text")
    if not isinstance(text, str):
        fatal(f"llm_result {request_id} has neither a string 'text' nor an 'error'")
    return text


def call_batch(request, n, what):
    """One batch of calls: its answers arrive in any order and come back in the
    order of the calls."""
    if 4 * n + 64 > state.current.value_limit:
        raise ValueError(f"{what}: a batch of {n} calls is more than the host accepts in one "
                         f"message: split it")
    answers = [None] * n
    missing = n
    with BUSY, CHANNEL:
        request_id = begin_call(request, what, plain=True)
        while missing:
            reply = next_reply(request_id, "batch")
            index = reply.get("index")
            count = reply.get("count", 1)  # an error may fill several slots
            if (not is_int(index) or not is_int(count) or count < 1
                    or not 0 <= index <= n - count
                    or any(a is not None for a in answers[index:index + count])
                    or (count > 1 and reply.get("error") is None)):
                fatal(f"expected llm_result for batch {request_id}, got {reply['type']} "
                      f"for {reply.get('id')!r} index {index!r}")
            if reply.get("error") is not None:
                error = SubCallError("Error: " + str(reply["error"]))
                answers[index:index + count] = [error] * count
                missing -= count - 1
            elif isinstance(reply.get("text"), str):
                answers[index] = reply["text"]
            else:
                fatal(f"llm_result {request_id}[{index}] has neither a string 'text' nor an "
                      "'error'")
            missing -= 1
    return answers
