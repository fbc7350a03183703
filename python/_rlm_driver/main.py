"""The driver's message loop: configure, self_test, load_context, then one
exec after another (docs/protocol.md). The entry script has said hello."""

import sys
import time

from . import api, codec, protocol, selftest, state, tools
from .protocol import fatal, field, send, string_list


def first_step_modules():
    """step and the modules only a step needs (loader.LATER): read from the
    zip at the start, loaded here, in the driver's first idle spell (while
    the host checks the sandbox after ready, or while a pooled sandbox
    waits) or at the first exec. Then the guard knows every module of the
    package, before any model code runs."""
    step = sys.modules.get(__package__ + ".step")
    if step is None:
        from . import step
        know_driver_modules()
    return step


def know_driver_modules():
    """The package's modules loaded by now, for the guard: it never evaluates
    a string in their namespaces."""
    state.driver_modules[:] = [module for name, module in list(sys.modules.items())
                               if name == __package__ or name.startswith(__package__ + ".")]


def configure(message):
    """The pool-level part: what a sandbox needs whatever session takes it."""
    session = state.current
    session.message_limit = field(message, "max_message_bytes", int, state.DEFAULT_MESSAGE_LIMIT)
    session.value_limit = field(message, "max_message_values", int, state.DEFAULT_VALUE_LIMIT)
    session.guardrails = field(message, "guardrails", bool, True)
    session.int_bits = field(message, "int_bits", int, 64)
    session.extra_modules = frozenset(string_list(message, "allowed_modules", []))
    sys_path = string_list(message, "sys_path")
    if sys_path is not None:
        sys.path[:] = sys_path
    apply_rlimits(field(message, "rlimits", dict, {}))


def configure_session(message):
    """The session-level part, in load_context: the output cap, the tools,
    and the rlimits that depend on the session (RLIMIT_AS on the context's
    size, RLIMIT_CPU on its steps); a limit only ever goes down."""
    session = state.current
    session.stdout_limit = max(0, field(message, "stdout_limit", int,
                                        state.DEFAULT_STDOUT_LIMIT))
    apply_rlimits(field(message, "rlimits", dict, {}))
    tools.install(message)
    seed_random(field(message, "random_seed", int))


def seed_random(seed):
    """A journaled session's `random` seed (docs/durability.md): the
    module the code imports is this one, seeded alike in its replay."""
    if seed is not None:
        import random
        random.seed(seed)


def apply_rlimits(limits):
    """Soft and hard limits, before any model code runs; the host reads them
    back from /proc/<pid>/limits. -1 means unlimited. Without
    CAP_SYS_RESOURCE the code cannot raise them again."""
    import resource
    for name, value in limits.items():
        which = getattr(resource, name, None) if name.startswith("RLIMIT_") else None
        if which is None or not isinstance(value, int) or isinstance(value, bool):
            fatal(f"configure: bad rlimit {name!r}")
        _, hard = resource.getrlimit(which)
        value = resource.RLIM_INFINITY if value < 0 else value
        if hard != resource.RLIM_INFINITY and (value == resource.RLIM_INFINITY or value > hard):
            value = hard
        resource.setrlimit(which, (value, value))


# The seals a mapped context's memfd must carry: nobody can write, grow,
# shrink or unseal it under the mapping (F_SEAL_WRITE | GROW | SHRINK | SEAL).
F_GET_SEALS = 1034
SEALED = 1 | 2 | 4 | 8


# Up to this size the context is read, past it mapped (mmap and fcntl,
# imported then): a small one costs its copy less than the modules' loads.
READ_CONTEXT_BYTES = 1 << 20


def map_context(fd):
    """The context's memfd, written and sealed by the host by now (before the
    spawn, or when a session took this pooled sandbox; the host reads its
    seals back). Read at once, or mapped read-only once its seals are
    checked here too; then its descriptor goes (a mapping's own dup goes
    with the mapping)."""
    import posix as os  # os itself is not imported at the driver's start
    try:
        size = os.fstat(fd).st_size
        if size <= READ_CONTEXT_BYTES:
            data = os.pread(fd, size, 0)
            if len(data) != size:
                raise ValueError("the context's memfd was cut short")
            return data
        import fcntl
        import mmap
        if fcntl.fcntl(fd, F_GET_SEALS) & SEALED != SEALED:
            raise ValueError("the context's memfd is not sealed")
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


def decode_context(kind):
    session = state.current
    data, session.context_data = session.context_data, None  # taken once
    if data is None:
        raise ValueError("the host handed over no context")
    if isinstance(data, int):
        data = map_context(data)
    try:
        if kind == "text":
            # Lua strings are bytes: invalid UTF-8 survives as surrogates.
            context = str(data, "utf-8", "surrogateescape")
        elif kind == "json":
            context = codec.loads(data[:])  # json.loads
        else:
            raise ValueError(f"unknown context format {kind!r}")
    finally:
        if not isinstance(data, bytes):
            data.close()  # the mapping, its last reference: the memfd is freed
    session.namespace["context"] = context
    return context


def load_context(message):
    configure_session(message)
    kind = field(message, "format", str, "text")
    try:
        context = decode_context(kind)
    except Exception as exc:
        return {"type": "ready", "error": f"{type(exc).__name__}: {exc}"}
    length = len(context) if isinstance(context, (str, list, dict)) else None
    return {"type": "ready", "context_type": type(context).__name__, "context_len": length}


def run_step(message):
    """One exec. The REPL's threads may call the host only while it runs:
    the flag changes under the channel's lock, so a call from a thread is
    either answered before the exec_result goes out or refused."""
    code = field(message, "code", str)
    if code is None:
        fatal("exec: missing field 'code'")
    session = state.current
    text = field(message, "prose", str)
    if text is not None:
        # A prose FINAL line's text: run only when it is code, else the
        # host takes it as written (docs/prompt.md).
        prose = first_step_modules().prose
        if not prose.reads_as_code(text):
            reply = {"type": "exec_result", "id": message.get("id"), "stdout": "", "error": None, "final": None,
                     "literal": True}
            value = prose.literal_value(text)
            if value is not None:
                reply["value"] = value  # a str literal: its value is the text
            send(reply)
            return
        code = prose.final_code(text)
    with protocol.CHANNEL:
        session.in_step = True
    try:
        stdout, error, final, parsed = first_step_modules().run(code)
    finally:
        with protocol.CHANNEL:
            session.in_step = False
    reply = {"type": "exec_result", "id": message.get("id"),
             "stdout": stdout, "error": error, "final": final}
    if not parsed:
        reply["syntax_error"] = True  # the host's prose reading of a FINAL line (docs/prompt.md)
    data = protocol.encode(reply)
    if final is not None and len(data) > session.message_limit:
        # FINAL's own check counts the output it can foresee; what the step
        # printed or raised after it may still push the line past the host's
        # limit, which would end the session. Without the answer it fits
        # (the host's option check), and the model is told.
        refused = (f"ValueError: the final answer with this step's output and error is "
                   f"{len(data)} bytes as JSON; the host accepts {session.message_limit}: "
                   f"answer with something smaller, or print less")
        reply["final"] = session.final = None
        reply["error"] = refused if error is None else f"{error}\n{refused}"
        data = None
    send(reply, data)


def timed(reply, received):
    """The reply with when its message came and when it was done (seconds on
    CLOCK_MONOTONIC, the host's clock too): the start-up phases of bench/."""
    reply["t"] = [received, time.monotonic()]
    return reply


def waiting():
    """Whether a message from the host is there to be read, without waiting
    for one."""
    import posix
    posix.set_blocking(0, False)  # for the one read peek makes if nothing is buffered
    try:
        return bool(protocol.PROTOCOL_IN.peek(1))
    except OSError:
        return False
    finally:
        posix.set_blocking(0, True)


# How long the driver must have been idle, before its session, until it
# makes a slow part of its warm-up (step.warm_up), and how often it looks
# meanwhile: a message that comes is read at most IDLE_LOOK late. Far
# shorter than a pooled sandbox waits for its session.
IDLE_WARM = 0.02
IDLE_LOOK = 0.0001


def idle_for(seconds):
    """Whether no message from the host comes for `seconds`."""
    until = time.monotonic() + seconds
    while not waiting():
        if time.monotonic() >= until:
            return True
        time.sleep(IDLE_LOOK)
    return False


def main(context_data):
    """The message loop, after the entry script's hello."""
    session = state.current
    session.context_data = context_data
    session.namespace.update(api.names())
    know_driver_modules()
    warming, slow, loaded = [], [], False

    def warm_first_step():
        quick, slow_parts = first_step_modules().warm_up(state.current.guardrails)
        warming.extend(quick)
        # After a step, the slow parts too are made between messages.
        (warming if state.current.steps else slow).extend(slow_parts)
    while True:
        while warming and not waiting():
            # Idle, the self-test over: a pooled sandbox waiting for its
            # session, or a cold start's host checking the sandbox after
            # ready. The first step's own setup is made meanwhile, a part
            # at a time, until a message comes.
            warming.pop(0)()
        while slow and not warming and not loaded and idle_for(IDLE_WARM):
            # Idle a while with no session yet (a pooled sandbox): no
            # message is due soon. A cold start's context comes at once,
            # and its first exec is not waited for this way.
            slow.pop(0)()
        message = protocol.receive()
        if message is None:
            return
        kind = message["type"]
        received = time.monotonic()
        if kind == "configure":
            configure(message)
            # A cold start's host has sent every start-up message at once:
            # while the next is there, a reply waits in the buffer and goes
            # with the next one's (one wake-up of the host, not three).
            send(timed({"type": "configured"}, received), flush=not waiting())
        elif kind == "self_test":
            mode = field(message, "mode", str, "bubblewrap")
            checks = selftest.self_test(string_list(message, "absent", []),
                                        field(message, "canaries", dict, {}), mode)
            send(timed({"type": "self_test_result", "mode": mode, "checks": checks}, received),
                 flush=not waiting())
            warming[:], slow[:] = [warm_first_step], []
        elif kind == "load_context":
            send(timed(load_context(message), received))
            loaded = True
        elif kind == "list_vars":
            send(api.list_vars(message))
        elif kind == "exec":
            run_step(message)
            # After a step, the slow parts wait for no idle spell: the model
            # takes its turn now (made between messages, as the quick ones).
            warming[:], slow[:] = warming + slow, []
        else:
            fatal(f"unexpected message type {kind!r}")
