"""One step: the exec of a block of REPL code, its stdout captured and
truncated, its error described and cut, a failed step's names rolled back,
and the answer dict read at its end."""

import _imp
import _signal
import _thread
import builtins
import io
import sys
from _collections import deque

from . import api, guard, prose, protocol, state, tree
from .screen import GuardrailError, RouteFormatting, plain, screen

PACKAGE_DIR = state.dirname(__file__)  # absolute: the zip's, or the entry script's directory's


def is_driver_file(filename):
    """Whether a traceback frame is the driver's own (the entry script or
    one of this package's modules): the model sees only its own frames."""
    entry = getattr(state.ENTRY_MODULE, "__file__", None)
    return filename == entry or state.dirname(filename) == PACKAGE_DIR


class CappedWriter(io.TextIOBase):
    """Text stream keeping the first two thirds of `limit` characters and the
    last third, and counting what falls between, so that memory stays bounded
    whatever the code prints and the model still sees how the output ended."""

    encoding = "utf-8"

    def __init__(self, limit):
        super().__init__()
        self.head_limit = limit - limit // 3
        self.tail_limit = limit // 3
        self.head = []
        self.head_len = 0
        self.tail = deque()
        self.tail_len = 0
        self.dropped = 0
        self.lock = _thread.allocate_lock()  # threading.Lock

    def writable(self):
        return True

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self.lock:  # the REPL's threads print too
            return self.add(text)

    def add(self, text):
        written = len(text)
        room = self.head_limit - self.head_len
        if room > 0:
            self.head.append(text[:room])
            self.head_len += min(room, len(text))
            text = text[room:]
        if len(text) > self.tail_limit:
            self.dropped += len(text) - self.tail_limit
            text = text[len(text) - self.tail_limit:] if self.tail_limit else ""
        if text:
            self.tail.append(text)
            self.tail_len += len(text)
            while self.tail_len > self.tail_limit:
                over = self.tail_len - self.tail_limit
                first = self.tail[0]
                cut = min(over, len(first))
                if cut == len(first):
                    self.tail.popleft()
                else:
                    self.tail[0] = first[cut:]
                self.tail_len -= cut
                self.dropped += cut
        return written

    def getvalue(self):
        with self.lock:
            return self.text()

    def text(self):
        head, tail = "".join(self.head), "".join(self.tail)
        if self.dropped:
            return f"{head}\n[truncated {self.dropped} chars]\n{tail}"
        return head + tail


# Each step's source, for the lines of tracebacks and warnings: linecache
# holds them once it is imported (it imports tokenize, re and more, so the
# driver imports it only to describe an error).
SOURCES = {}
seeded = [None]  # the linecache.cache that holds all of SOURCES


def remember_source(filename, code):
    entry = SOURCES[filename] = (len(code), None, code.splitlines(True), filename)
    linecache = sys.modules.get("linecache")
    if linecache is not None:  # imported by now (a warning, an error): kept up to date
        if seeded[0] is linecache.cache:
            linecache.cache[filename] = entry
        else:
            seed(linecache)


def seed(linecache):
    linecache.cache.update(SOURCES)
    seeded[0] = linecache.cache


def describe_error(exc):
    """The exception as Python prints it, without this driver's frames."""
    import linecache  # here: the first error pays for these, not every start
    import traceback
    seed(linecache)
    report = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    pending, seen = [report], set()
    while pending:
        part = pending.pop()
        if part is None or id(part) in seen:
            continue
        seen.add(id(part))
        part.stack = traceback.StackSummary.from_list(
            [frame for frame in part.stack if not is_driver_file(frame.filename)])
        pending += [part.__cause__, part.__context__]
        pending += getattr(part, "exceptions", None) or []  # an exception group's members
    return "".join(report.format())


def keep_end(text, limit):
    """Cut a traceback to `limit` characters, keeping its end, where the error is."""
    if len(text) <= limit:
        return text
    return f"[truncated {len(text) - limit} chars]\n{text[len(text) - limit:]}"


def answer_final(namespace):
    """The answer dict's final answer, or None; (None, why) when it is too
    big for the host."""
    answer = namespace.get("answer")
    try:
        if isinstance(answer, dict) and answer.get("ready"):
            final = {"kind": "answer", "value": str(answer.get("content"))}
            problem = api.final_problem(final)
            if problem is not None:
                answer["ready"] = False  # or every later step would end the same way
                return None, problem
            return final, None
    except Exception:  # an odd `ready` or `content` is not worth failing over
        pass
    return None, None


def on_interrupt(signum, frame):
    """SIGINT from the host: the step ran past step_timeout_ms. Raised in the
    REPL's code, once a step; inside a call to the host it waits for the
    call's end; in the driver's own work, or between steps, it is dropped
    (the host kills the sandbox if the step does not end)."""
    session = state.current
    if session.interrupt_raised or not session.executing:
        return
    if protocol.in_call():
        session.interrupt_pending = True
        return
    protocol.interrupt_now()


_signal.signal(_signal.SIGINT, on_interrupt)  # signal.signal, without its enums


# The REPL's own names: put back after every block that rebinds or deletes
# them, so that the data and the sub-model stay reachable for the rest of
# the session. `answer` is the model's to rebind (the reference's models
# write `answer = {...}`, its prompt `answer = llm_query(...)`): only its
# first value is kept, which FINAL refuses (api.own_answer).
PROTECTED = ("context", "llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched",
             "FINAL", "FINAL_VAR", "answer")


def restore_names(namespace):
    """Puts the REPL's own names back; returns a note for the model, or None."""
    session = state.current
    restored = []
    for name, value in session.originals.items():
        current = namespace.get(name, restore_names)
        if current is value or name == "answer":
            continue
        namespace[name] = value
        restored.append(name)
    if not restored:
        return None
    return (f"[note: {', '.join(restored)} {'is' if len(restored) == 1 else 'are'} the REPL's own "
            f"name{'' if len(restored) == 1 else 's'} and {'was' if len(restored) == 1 else 'were'} "
            "restored after this block; keep your values under other names]")


def run(code):
    """Run one step: (stdout, error, final, parsed); parsed is False when
    the code is not Python (it did not compile, so none of it ran)."""
    session = state.current
    namespace = session.namespace
    session.steps += 1
    if session.originals is None:  # the first step: the context is loaded by now
        session.originals = {name: namespace.get(name) for name in PROTECTED}
    filename = f"<repl-{session.steps}>"
    remember_source(filename, code)
    output = CappedWriter(session.stdout_limit)
    before = dict(namespace)  # shallow: names only, for the rollback
    session.final = None
    session.paid = []
    session.interrupt_pending = session.interrupt_raised = False
    error = raised = None
    parsed = True
    namespace["__builtins__"] = guard.builtins_table() if session.guardrails else builtins
    if session.guardrails:
        guard.shield_modules()
    saved = sys.stdout, sys.stderr
    try:
        try:
            compiled = compile_step(code, filename, session.guardrails)
        except (SyntaxError, ValueError):  # ValueError: a NUL byte
            parsed = False
            raise
        sys.stdout = sys.stderr = output
        try:
            session.executing = True
            compiled, echo = compiled
            exec(compiled, namespace)
            if echo is not None:  # a bare last expression: its repr, as a notebook shows it
                value = eval(echo, namespace)
                if value is not None:
                    output.write(f"{value!r}\n")
        finally:
            session.executing = False
            sys.stdout, sys.stderr = saved
    except api.FinalSignal:
        pass
    except GuardrailError as refusal:
        error = f"GuardrailError: {refusal}"
    except BaseException as exc:  # SystemExit too: the driver must live on
        error, raised = describe_error(exc) + syntax_hint(exc), exc
    # Again: the one interrupt a step may raise can land inside the finally.
    session.executing = False
    sys.stdout, sys.stderr = saved
    if error is not None:
        error = keep_end(error, session.stdout_limit)
        # An interrupt rolls back even inside FINAL(...): the step's time is up.
        kept = not isinstance(raised, KeyboardInterrupt) and failed_in_final(code, filename, raised)
        raised = None  # no frame cycle left
        if not kept:
            rolled = [name for name, value in namespace.items() if not name.startswith("__")
                      and (name not in before or before[name] is not value)]
            namespace.clear()
            namespace.update(before)
            session.lost_names.update(name for name in rolled if name not in before)
            error += rollback_note(rolled, api.keep_answers(session, session.paid))
    session.paid = []
    final = session.final
    if final is None:
        final, problem = answer_final(namespace)
        if problem is not None:
            refused = f"ValueError: answer['content']: {problem}"
            error = refused if error is None else f"{error}\n{refused}"
    note = restore_names(namespace)
    stdout = output.getvalue()
    if note is not None:
        stdout = f"{stdout}{'' if not stdout or stdout.endswith(chr(10)) else chr(10)}{note}\n"
    return stdout, error, final, parsed


FINAL_NAMES = ("FINAL", "FINAL_VAR")


def rollback_note(names, kept):
    """What the model is told of a rolled-back block: the names it lost,
    and the sub-call answers kept for its next try."""
    if not names and not kept:
        return ""
    note = "\n[note: the block raised, so it was rolled back"
    if names:
        # At most 20 names of 40 characters: the line has 8 KiB of room
        # beside the output and the traceback (options.LINE_OVERHEAD).
        shown = ", ".join(n if len(n) <= 40 else n[:37] + "..." for n in names[:20]) \
            + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        note += f": {shown} {'is' if len(names) == 1 else 'are'} as before the block"
    if kept:
        note += (f". Its {kept} llm_query answer{'' if kept == 1 else 's'} {'is' if kept == 1 else 'are'} "
                 "kept: the same llm_query (or llm_query_batched) call, same prompt and model, in your next "
                 f"block returns {'it' if kept == 1 else 'them'} at once, without a sub-call")
    return note + "]\n"


def syntax_hint(exc):
    """What a notebook habit's SyntaxError adds: top-level await (and async
    for/with) has no event loop here, and needs none."""
    message = getattr(exc, "msg", None)
    if not isinstance(exc, SyntaxError) or not isinstance(message, str) \
            or ("await" not in message and "async" not in message):
        return ""
    return ("Hint: the REPL runs no event loop, and needs none: llm_query() blocks and returns "
            "the answer, so write answer = llm_query(prompt) without await; for many prompts at "
            "once, llm_query_batched([prompt, ...]) runs them concurrently and returns the answers "
            "in order.\n")


STATEMENT_WORDS = frozenset({"import", "from", "def", "class", "if", "elif", "else", "for", "while",
                             "with", "try", "except", "finally", "return", "raise", "assert", "del",
                             "pass", "break", "continue", "global", "nonlocal", "async"})


def echo_candidate(code):
    """Whether the code's last line could end a bare expression: a cheap
    look, so that most steps (an assignment, a print, a statement last)
    need no syntax tree, and the first keeps its quick compile; the tree
    decides."""
    end = len(code.rstrip())
    line = code[code.rfind("\n", 0, end) + 1:end]
    if not line or line[0] in " \t#@" or line.startswith(("print(", "FINAL(", "FINAL_VAR(")):
        return False
    if line.split(None, 1)[0].rstrip(":") in STATEMENT_WORDS:
        return False
    depth, quote = 0, None
    for at, char in enumerate(line):  # an `=` outside brackets and quotes: an assignment
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "=" and depth <= 0 and line[at - 1:at] not in ("=", "!", "<", ">") \
                and line[at + 1:at + 2] != "=":
            return False
    return True


def split_echo(parsed, filename):
    """(the module without a bare last expression, that expression's code
    for eval, or None)."""
    echo = None
    if parsed.body and isinstance(parsed.body[-1], tree.Expr):
        echo = compile(tree.Expression(body=parsed.body.pop().value), filename, "eval", dont_inherit=True)
    return compile(parsed, filename, "exec", dont_inherit=True), echo


def failed_in_final(code, filename, exc):
    """Whether exc came out of a FINAL(...) or FINAL_VAR(...) call statement
    (its argument or the call): a failed answer costs the model a turn,
    never the variables the block set, so the step is not rolled back."""
    tb, line = getattr(exc, "__traceback__", None), None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename and tb.tb_frame.f_code.co_name == "<module>":
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is None:
        return False
    try:
        parsed = compile(code, "<unknown>", "exec", tree.PyCF_ONLY_AST)  # ast.parse
    except (SyntaxError, ValueError):
        return False
    for node in tree.walk(parsed):
        if (isinstance(node, tree.Expr) and isinstance(node.value, tree.Call)
                and isinstance(node.value.func, tree.Name) and node.value.func.id in FINAL_NAMES
                and node.lineno <= line <= (node.end_lineno or node.lineno)):
            return True
    return False


def warm_up(guardrails):
    """What the first step makes at its start, in parts that main makes
    while the driver waits once the self-test is over: (quick, slow). The
    quick ones (the guarded builtins, the shields) are made whenever the
    driver is idle; the slow ones, the compiler's paths (the first
    compile() makes the ast module's classes, ~1.5 ms; then the screen's
    path, for code that is not plain), before the session's context only
    once it has been idle a while (main.IDLE_WARM: a pooled sandbox waiting
    for its session), then not until the first step is over (a cold
    start's first plain step needs no classes: quick_compile), and after it
    between messages, as the quick ones. Nothing of the REPL's state
    changes."""
    quick = [guard.builtins_table, guard.shield_modules] if guardrails else []
    return quick, [warm_compile, lambda: compile_step("_ = None", "<warm>", guardrails)]


def warm_compile():
    """compile()'s first call, which builds the ast module's classes."""
    compiled_once[0] = True
    compile("x = None", "<warm>", "exec", dont_inherit=True)


class Compiled(BaseException):
    """quick_compile's: out of the exec it aborted, before any of its code ran."""


# Whether a step's code has been compiled, or compile() has run (it builds
# the ast module's classes first): quick_compile is the first step's only,
# made before any code of the model's has run (that code could set this
# thread's trace function or replace the sys module's).
compiled_once = [False]


def quick_compile(code, filename):
    """Plain code (screen.plain) compiled as compile(code, filename, "exec",
    dont_inherit=True) does, without compile()'s first call's ~1.5 ms: every
    compile() asks whether its source is an ast object, which builds all of
    the ast module's classes once. exec of a string does not, so the code
    is compiled by exec in a namespace of its own, with no builtins, and a
    trace function of this thread's takes its code object at its frame's
    first event, before its first instruction, and aborts it; then its
    filename is set, as the import system sets a .pyc's. The code never
    runs here. None when anything is not as expected (a trace or profile
    function already set, a warning's Python frame first, a syntax error):
    the caller compiles as usual."""
    if sys.gettrace() is not None or sys.getprofile() is not None:
        return None
    isolated, taken = {"__builtins__": {}}, []

    def take(frame, event, arg):
        taken.append((frame.f_globals is isolated, event, frame.f_code))
        raise Compiled

    sys.settrace(take)
    try:
        exec(code, isolated)
    except Compiled:
        pass
    except BaseException:  # a syntax error: compile() says it with the filename
        return None
    finally:
        sys.settrace(None)
    if len(taken) != 1 or taken[0][:2] != (True, "call"):
        return None
    code_object = taken[0][2]
    if code_object.co_name != "<module>" or code_object.co_filename != "<string>":
        return None
    _imp._fix_co_filename(code_object, filename)
    return code_object


def compile_step(code, filename, guardrails):
    """(the step's code object, a bare last expression's code or None)."""
    is_plain = plain(code)
    if not guardrails or is_plain:
        if echo_candidate(code):
            compiled_once[0] = True
            return split_echo(compile(code, filename, "exec", tree.PyCF_ONLY_AST, dont_inherit=True), filename)
        code_object = quick_compile(code, filename) if is_plain and not compiled_once[0] else None
        compiled_once[0] = True
        if code_object is None:
            code_object = compile(code, filename, "exec", dont_inherit=True)
        return code_object, None
    compiled_once[0] = True
    parsed = compile(code, filename, "exec", tree.PyCF_ONLY_AST, dont_inherit=True)
    screen(parsed)
    parsed = tree.fix_missing_locations(RouteFormatting().visit(parsed))
    return split_echo(parsed, filename)
