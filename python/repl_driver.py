"""The rlm driver: runs model-written Python for the Lua host, in the sandbox.

It speaks the line-delimited JSON protocol of docs/protocol.md on stdin and
stdout. The OS sandbox around this process is the security boundary; the
guardrails here only keep a confused model on the rails.
"""

import mmap
import os

# The context: a sealed memfd the host hands over at this descriptor. It is
# mapped read-only here (load_context decodes it later) and the descriptor
# goes with the others.
CONTEXT_FD = 4


def take_context():
    try:
        size = os.fstat(CONTEXT_FD).st_size
    except OSError:
        return None
    try:
        return mmap.mmap(CONTEXT_FD, 0, access=mmap.ACCESS_READ) if size else b""
    except (OSError, ValueError):
        return None


CONTEXT_DATA = take_context()

# First of all: no descriptor leaked by the host may reach untrusted code.
# SC_OPEN_MAX is the soft RLIMIT_NOFILE.
os.closerange(3, os.sysconf("SC_OPEN_MAX"))

import _string
import ast
import collections
import builtins
import io
import itertools
import json
import linecache
import socket
import string
import sys
import traceback
import types
import weakref

PROTOCOL_VERSION = 1
DEFAULT_STDOUT_LIMIT = 2000
DEFAULT_MESSAGE_LIMIT = 16 << 20
DEFAULT_VALUE_LIMIT = (16 << 20) // 256
DRIVER_FILE = __file__
REAL_IMPORT = builtins.__import__
# The driver's own module: once the REPL's namespace is sys.modules["__main__"]
# (see Session), this is the only reference to it.
DRIVER_MODULE = sys.modules[__name__]

# The real protocol channels stay private to the driver.
PROTOCOL_IN = sys.stdin.buffer
PROTOCOL_OUT = sys.stdout.buffer
sys.stdin = io.StringIO()  # input() sees end of file, never a protocol line
sys.stdout = sys.stderr  # a stray print() must not corrupt the protocol


# --- Protocol --------------------------------------------------------------

def encode(message):
    text = json.dumps(message, ensure_ascii=False, allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (from surrogateescape) are not UTF-8: send U+FFFD.
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return text.encode("utf-8")


def send(message, data=None):
    if data is None:
        data = encode(message)
    try:
        PROTOCOL_OUT.write(data + b"\n")
        PROTOCOL_OUT.flush()
    except OSError:  # the host has gone away
        os._exit(0)


def receive():
    """The next message from the host, or None at end of input."""
    line = PROTOCOL_IN.readline()
    if not line:
        return None
    try:
        message = json.loads(line)
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
    os._exit(2)


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


# --- Names the REPL code sees ----------------------------------------------

class FinalSignal(BaseException):
    """Unwinds a step after FINAL/FINAL_VAR. A BaseException, so that user
    code's `except Exception:` lets it through."""


def count_values(value, limit):
    """JSON values in `value` as the host counts them (csrc/framing.c:
    an empty list or dict counts 2), stopping past limit."""
    count, stack = 0, [value]
    while stack and count <= limit:
        v = stack.pop()
        count += 1
        if isinstance(v, dict):
            count += 0 if v else 1
            for k, item in v.items():
                stack.append(item)
        elif isinstance(v, list):
            count += 0 if v else 1
            stack.extend(v)
    return count


def final_problem(final):
    """Why the host would refuse this final answer, or None. One check for
    FINAL, FINAL_VAR and the answer dict: what the host refuses ends the
    session, so a refusal here is an error the model sees instead."""
    size = len(encode(final))
    room = session.message_limit - 4 * session.stdout_limit - 4096
    if size > room:
        return (f"the final answer is {size} bytes as JSON; the host accepts about "
                f"{max(room, 0)}: answer with something smaller")
    room = session.value_limit - 64
    values = count_values(final.get("value"), room)
    if values > room:
        return (f"the final answer holds more than {room} JSON values (lists, dicts and their "
                f"items); answer with something smaller")
    return None


def finish(final):
    # The host ends the session on a line longer than its limit; an
    # exception here lets the model send something smaller instead.
    problem = final_problem(final)
    if problem is not None:
        raise ValueError(problem)
    if session.final is None:  # kept here too, in case a bare except swallows the signal
        session.final = final
    raise FinalSignal


def FINAL(value):
    finish({"kind": "value", "value": str(value)})


def FINAL_VAR(name):
    namespace = session.namespace
    if not isinstance(name, str):
        raise NameError(f"FINAL_VAR takes a variable's name as a string, e.g. "
                        f"FINAL_VAR('result'), not a {type(name).__name__}")
    if name not in namespace:
        raise NameError(f"FINAL_VAR: name {name!r} is not defined")
    value = namespace[name]
    try:
        # Parsed back, so the value is frozen now and surely serialisable
        # later. It travels once: the host makes its text answer from it.
        value, is_json = json.loads(json.dumps(value, allow_nan=False)), True
    except Exception:
        value, is_json = safe_repr(value), False
    finish({"kind": "var", "name": name, "value": value, "json": is_json})


def safe_repr(value):
    try:
        return repr(value)
    except Exception as exc:
        return f"<repr() failed: {exc!r}>"


request_ids = itertools.count(1)


def send_request(request, what):
    """Sends one call to the host, unless the host would refuse its size."""
    data = encode(request)
    if len(data) > session.message_limit:
        raise ValueError(f"{what} is {len(data)} bytes as a message, more than the host accepts "
                         f"({session.message_limit} bytes): split it into smaller calls")
    send(request, data)


def call(request, what):
    """One call back to the host: its answer, or its error raised here."""
    request_id = request["id"] = next(request_ids)
    send_request(request, what)
    reply = receive()
    if reply is None:
        os._exit(0)  # the host asked us to leave
    if reply["type"] != "llm_result" or reply.get("id") != request_id:
        fatal(f"expected llm_result for request {request_id}, got {reply['type']} "
              f"for {reply.get('id')!r}")
    if reply.get("error") is not None:
        raise RuntimeError(str(reply["error"]))
    text = reply.get("text")
    if not isinstance(text, str):
        fatal(f"llm_result {request_id} has neither a string 'text' nor an 'error'")
    return text


class SubCallError(str):
    """A failed sub-call's slot in llm_query_batched: a str, so joining the
    answers works, that says "Error: ..." and can be told apart with
    isinstance(answer, SubCallError)."""


def call_batch(request, n, what):
    """One batch of calls: its answers arrive in any order and come back in the
    order of the calls."""
    if 4 * n + 64 > session.value_limit:
        raise ValueError(f"{what}: a batch of {n} calls is more than the host accepts in one "
                         f"message: split it")
    request_id = request["id"] = next(request_ids)
    send_request(request, what)
    answers = [None] * n
    missing = n
    while missing:
        reply = receive()
        if reply is None:
            os._exit(0)  # the host asked us to leave
        index = reply.get("index")
        count = reply.get("count", 1)  # an error may fill several slots
        if (reply["type"] != "llm_result" or reply.get("id") != request_id
                or not isinstance(index, int) or isinstance(index, bool)
                or not isinstance(count, int) or isinstance(count, bool) or count < 1
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
            fatal(f"llm_result {request_id}[{index}] has neither a string 'text' nor an 'error'")
        missing -= 1
    return answers


def str_list(value, what):
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
        raise TypeError(f"{what} takes a list of str prompts")
    return list(value)


def llm_query(prompt):
    if not isinstance(prompt, str):
        raise TypeError(f"llm_query() takes a str prompt, not {type(prompt).__name__}")
    return call({"type": "llm_query", "prompt": prompt}, "the llm_query prompt")


def llm_query_batched(prompts):
    prompts = str_list(prompts, "llm_query_batched()")
    if not prompts:
        return []
    return call_batch({"type": "llm_batch", "prompts": prompts}, len(prompts),
                      "the llm_query_batched prompts together")


def sub_session(prompt, context, what):
    """The fields of one nested session: its question and, when given, its
    context (a str, or anything json can write)."""
    if not isinstance(prompt, str):
        raise TypeError(f"{what} takes a str prompt, not {type(prompt).__name__}")
    query = {"prompt": prompt}
    if isinstance(context, str):
        query["context"], query["format"] = context, "text"
    elif context is not None:
        try:
            query["context"] = json.dumps(context, allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{what}: context must be a str or JSON-able (dict, list, ...): "
                            f"{exc}") from None
        query["format"] = "json"
    return query


def rlm_query(prompt, context=None):
    request = sub_session(prompt, context, "rlm_query()")
    request["type"] = "rlm_query"
    return call(request, "the rlm_query prompt and context")


def rlm_query_batched(prompts, contexts=None):
    prompts = str_list(prompts, "rlm_query_batched()")
    if contexts is None:
        contexts = [None] * len(prompts)
    elif not isinstance(contexts, (list, tuple)) or len(contexts) != len(prompts):
        raise TypeError("rlm_query_batched(prompts, contexts): contexts must be a list as long "
                        "as prompts")
    if not prompts:
        return []
    queries = [sub_session(p, c, "rlm_query_batched()") for p, c in zip(prompts, contexts)]
    return call_batch({"type": "rlm_batch", "queries": queries}, len(queries),
                      "the rlm_query_batched prompts and contexts together")


# --- Guardrails -------------------------------------------------------------

class GuardrailError(Exception):
    pass


SAFE_BUILTIN_NAMES = """
    bool int float complex str bytes bytearray list tuple dict set frozenset
    object slice range type super property staticmethod classmethod
    print len enumerate zip map filter sorted reversed min max sum abs round
    pow divmod all any iter next isinstance issubclass repr format hash chr
    ord hex oct bin callable hasattr id ascii dir Ellipsis NotImplemented
    __build_class__
""".split()

SAFE_MODULES = frozenset("""
    re json math collections itertools functools operator statistics string
    textwrap unicodedata datetime time heapq bisect difflib random copy typing
    dataclasses enum fractions decimal hashlib base64 csv pprint io
""".split())

# io is allowed for in-memory files only.
IO_NAMES = frozenset({"StringIO", "BytesIO", "UnsupportedOperation", "BlockingIOError"})

# What models write in ordinary code (super().__init__(), x.__class__.__name__);
# the walks out of an object (__bases__, __subclasses__, __globals__, ...)
# stay refused.
ALLOWED_DUNDERS = frozenset({"__name__", "__doc__", "__init__", "__class__", "__qualname__",
                             "__module__"})
FRAME_ATTRIBUTES = frozenset("""
    gi_frame gi_code cr_frame cr_code ag_frame ag_code f_globals f_locals
    f_builtins f_back f_code tb_frame tb_next co_code func_globals
""".split())
REFUSED_NAMES = frozenset("""
    eval exec compile open getattr setattr delattr vars globals locals
    __import__ __builtins__ breakpoint input __loader__ __spec__ __rlm_attribute__
""".split())
FORMAT_METHODS = frozenset({"format", "format_map", "vformat"})
# What the REPL's own code may call on a template it builds at run time:
# screened routes these through guarded_attribute.
ROUTED_METHODS = frozenset({"format", "format_map"})
# Strings the allowed modules compile at run time (typing's string
# annotations, dataclasses' generated methods) may also name these:
# dataclasses writes frozen fields through object.__setattr__ and calls
# __post_init__. Writes and a user method, no walk out of an object. Their
# names are parameters and fields (a namedtuple's field may be `locals`) and
# their builtins are the REPL's, so only these names are refused in them.
RUNTIME_DUNDERS = frozenset({"__setattr__", "__delattr__", "__post_init__"})
RUNTIME_REFUSED_NAMES = frozenset({"__builtins__", "__loader__", "__spec__", "__rlm_attribute__"})


def is_dunder(name):
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def is_refused_attribute(name, allowed=ALLOWED_DUNDERS):
    return (is_dunder(name) and name not in allowed) or name in FRAME_ATTRIBUTES


def screen(tree, runtime=False):
    """Raise GuardrailError at the first construct the guardrails refuse.
    runtime: the tree is a string an allowed module compiles while the code
    runs (see RUNTIME_DUNDERS)."""
    allowed = ALLOWED_DUNDERS | RUNTIME_DUNDERS if runtime else ALLOWED_DUNDERS
    names = RUNTIME_REFUSED_NAMES if runtime else REFUSED_NAMES
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if is_refused_attribute(node.attr, allowed):
                refuse(node, f"the attribute {node.attr!r}",
                       "dunder, frame and code attributes are off limits")
            # Python 3.8 and 3.9's dataclasses hand generated code the
            # builtins module as BUILTINS, for BUILTINS.object.
            if runtime and isinstance(node.value, ast.Name) and node.value.id == "BUILTINS" \
                    and node.attr != "object":
                refuse(node, f"BUILTINS.{node.attr}", "only BUILTINS.object is allowed")
        elif isinstance(node, ast.Name) and node.id in names:
            refuse(node, f"the name {node.id!r}",
                   "eval, exec, open, getattr and the like are off limits")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in FORMAT_METHODS:
            for template in [node.func.value] + node.args[:1]:
                if isinstance(template, ast.Constant) and isinstance(template.value, str) \
                        and walks_out(template.value):
                    refuse(node, f"the format string {template.value[:60]!r}",
                           "its fields walk into dunder or frame attributes")


class RouteFormatting(ast.NodeTransformer):
    """`x.format` and `x.format_map`, unless x is a literal the screen has
    read: str.format walks attributes named in a template built at run time,
    so the template is checked when the method is fetched."""

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if node.attr not in ROUTED_METHODS or not isinstance(node.ctx, ast.Load) \
                or (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node
        call = ast.Call(func=ast.Name(id="__rlm_attribute__", ctx=ast.Load()),
                        args=[node.value, ast.Constant(value=node.attr)], keywords=[])
        return ast.copy_location(call, node)


def walks_out(template):
    """Whether a format template's fields walk into dunder or frame attributes."""
    try:
        fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(template)]
    except ValueError:
        return False  # malformed: it fails at run time anyway
    for name, spec in fields:
        if name and ("__" in name or any(is_attr and is_refused_attribute(str(part))
                                         for is_attr, part in field_parts(name))):
            return True
        if spec and walks_out(spec):
            return True
    return False


def field_parts(name):
    try:
        return list(_string.formatter_field_name_split(name)[1])
    except ValueError:
        return []


def refuse(node, what, why):
    raise GuardrailError(f"line {node.lineno}: {what} is refused by the REPL guardrails ({why})")


def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level:
        raise ImportError("relative imports are refused by the REPL guardrails")
    allowed = session.allowed_modules()
    parts = name.split(".")
    if parts[0] not in allowed:
        raise ImportError(f"import of {name!r} is refused by the REPL guardrails; "
                          f"allowed modules: {', '.join(sorted(allowed))}")
    if any(part.startswith("_") for part in parts):
        raise ImportError(f"import of private module {name!r} is refused by the REPL guardrails")
    module = REAL_IMPORT(name, None, None, fromlist, 0)
    shield_modules()
    # Checked here: for a missing attribute, `from m import x` would fall
    # back to sys.modules["m.x"] and hand out the raw module.
    for item in fromlist or ():
        if item != "*" and not exposes(module, item):
            raise ImportError(f"cannot import name {item!r} from {name!r} "
                              "(missing, or hidden by the REPL guardrails)")
    return view_of(module)


class ModuleView:
    """Read-only view of a module: its public names, minus modules other than
    its own submodules, so that no attribute walk reaches os or sys."""

    __slots__ = ("_module",)

    def __init__(self, module):
        object.__setattr__(self, "_module", module)

    def __getattribute__(self, name):
        module = object.__getattribute__(self, "_module")
        if name in ALLOWED_DUNDERS:
            return getattr(module, name)
        if name == "__all__":  # for `from module import *`
            return visible_names(module)
        if not hasattr(module, name):
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        value = getattr(module, name)
        if is_visible(module, name, value):
            if isinstance(value, types.ModuleType):
                return view_of(value)
            return GUARDED_MEMBERS.get((module.__name__, name), value)
        raise AttributeError(f"module {module.__name__!r} attribute {name!r} "
                             "is hidden by the REPL guardrails")

    def __setattr__(self, name, value):
        ModuleView.__delattr__(self, name)

    def __delattr__(self, name):
        module = object.__getattribute__(self, "_module")
        raise AttributeError(f"module {module.__name__!r} is read-only under the REPL guardrails")

    def __dir__(self):
        return visible_names(object.__getattribute__(self, "_module"))

    def __repr__(self):
        module = object.__getattribute__(self, "_module")
        return f"<module {module.__name__!r} (read-only view)>"


module_views = {}


def view_of(module):
    view = module_views.get(module.__name__)
    if view is None:
        view = module_views[module.__name__] = ModuleView(module)
    return view


def is_visible(module, name, value):
    if name.startswith("_") or any(value is shadow for shadow in SHADOW_FUNCTIONS):
        return False
    if module.__name__ == "io" and name not in IO_NAMES:
        return False
    if isinstance(value, types.ModuleType):
        return sys.modules.get(f"{module.__name__}.{name}") is value
    return True


def visible_names(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = dir(module)
    return sorted(name for name in names if exposes(module, name))


def exposes(module, name):
    return hasattr(module, name) and is_visible(module, name, getattr(module, name))


def guarded_builtins():
    table = {name: getattr(builtins, name) for name in SAFE_BUILTIN_NAMES}
    # Exception subclasses only: no BaseException, SystemExit, KeyboardInterrupt
    # or GeneratorExit, so user code cannot easily catch what unwinds a step.
    table.update((name, value) for name, value in vars(builtins).items()
                 if isinstance(value, type) and issubclass(value, Exception))
    table["__import__"] = guarded_import
    table["__rlm_attribute__"] = guarded_attribute
    return table


# --- Guardrails: the allowed modules' own string evaluation and walks --------
#
# Some allowed functions evaluate strings or fetch attributes named by data,
# with the real builtins: typing.get_type_hints and ForwardRef (string
# annotations), dataclasses (generated methods, in the globals of the class's
# module), collections.namedtuple, string.Formatter.get_field, and
# operator.attrgetter/methodcaller. Under the guardrails the module-level
# names they use (eval, exec, compile, getattr) are replaced in those modules
# by versions that screen the string as REPL code is screened, run it with the
# REPL's builtins, and never in the globals of a module the REPL may not
# import; attrgetter and methodcaller are handed out as checked versions.

def guarded_attribute(obj, name):
    """getattr for names that come from data: the dunder and frame
    attributes the screen refuses stay refused, and str.format comes back
    as a version that checks its template."""
    if not isinstance(name, str):
        raise TypeError(f"attribute name must be a string, not {type(name).__name__}")
    if is_refused_attribute(name):
        raise GuardrailError(f"the attribute {name!r} is refused by the REPL guardrails "
                             "(dunder, frame and code attributes are off limits)")
    value = getattr(obj, name)
    if name in ROUTED_METHODS:
        if isinstance(obj, str):
            return checked_format(value, obj)
        if isinstance(obj, type) and issubclass(obj, str):
            return checked_format(value, None)
    return value


def checked_format(method, template):
    """str.format or str.format_map, refusing a template whose fields walk out;
    template None: the method is unbound and the template is its first argument."""
    def call(*args, **kwargs):
        text = template if template is not None else (args[0] if args else None)
        if isinstance(text, str) and walks_out(text):
            raise GuardrailError(f"the format string {text[:60]!r} is refused by the REPL "
                                 "guardrails (its fields walk into dunder or frame attributes)")
        return method(*args, **kwargs)
    return call


def checked_names(names, what):
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{what}: attribute name must be a string, not {type(name).__name__}")
        for part in name.split("."):
            if is_refused_attribute(part):
                raise GuardrailError(f"{what}: the attribute {part!r} is refused by the REPL "
                                     "guardrails (dunder, frame and code attributes are off limits)")


def attrgetter(attr, *attrs):
    """operator.attrgetter, fetching through guarded_attribute."""
    names = (attr,) + attrs
    checked_names(names, "attrgetter")

    def resolve(obj, name):
        for part in name.split("."):
            obj = guarded_attribute(obj, part)
        return obj

    if not attrs:
        return lambda obj: resolve(obj, attr)
    return lambda obj: tuple(resolve(obj, name) for name in names)


def methodcaller(name, *args, **kwargs):
    """operator.methodcaller, fetching the method through guarded_attribute."""
    checked_names((name,), "methodcaller")
    return lambda obj: guarded_attribute(obj, name)(*args, **kwargs)


GUARDED_MEMBERS = {("operator", "attrgetter"): attrgetter,
                   ("operator", "methodcaller"): methodcaller}


def runtime_code(source, filename, mode, flags=0, dont_inherit=False, optimize=-1):
    """compile() for a string an allowed module evaluates: screened first."""
    if isinstance(source, types.CodeType):
        return source
    tree = source if isinstance(source, ast.AST) else \
        REAL_COMPILE(source, filename, mode, flags | ast.PyCF_ONLY_AST, True, optimize)
    screen(tree, runtime=True)
    tree = ast.fix_missing_locations(RouteFormatting().visit(tree))
    if flags & ast.PyCF_ONLY_AST:
        return tree
    code = REAL_COMPILE(tree, filename, mode, flags, True, optimize)
    screened_code.add(code)
    return code


def runtime_namespace(namespace, is_globals):
    """The globals (or locals) a string from an allowed module runs in: the
    REPL's own namespace as it is; a module's namespace only when the REPL
    may import that module, as its view shows it; any other dict with the
    REPL's builtins."""
    if namespace is None or namespace is session.namespace:
        return namespace
    module = module_of_namespace(namespace)
    if module is not None:
        visible = {}
        if module is not DRIVER_MODULE and allowed_name(module.__name__):
            for name in dir(module):
                value = getattr(module, name, None)
                if is_visible(module, name, value):
                    visible[name] = view_of(value) if isinstance(value, types.ModuleType) else value
        if is_globals:
            visible["__builtins__"] = GUARDED_BUILTINS
        return visible
    if is_globals and isinstance(namespace, dict) \
            and namespace.get("__builtins__") in (None, builtins, vars(builtins)):
        namespace["__builtins__"] = GUARDED_BUILTINS  # where eval would put the real ones
    return namespace


def module_of_namespace(namespace):
    if namespace is vars(DRIVER_MODULE):
        return DRIVER_MODULE
    for module in list(sys.modules.values()):
        if getattr(module, "__dict__", None) is namespace:
            return module
    return None


def allowed_name(name):
    parts = name.split(".")
    return parts[0] in session.allowed_modules() and not any(p.startswith("_") for p in parts)


def runtime_run(run, source, globals, locals, caller):
    if globals is None:
        globals = caller.f_globals
        if locals is None:
            locals = caller.f_locals
    if not session.guardrails:
        return run(source, globals, locals)
    if isinstance(source, types.CodeType):
        if source not in screened_code:
            raise GuardrailError("code not compiled under the REPL guardrails is refused")
        code = source
    else:
        code = runtime_code(source, "<string>", "eval" if run is REAL_EVAL else "exec")
    globals = runtime_namespace(globals, True)
    locals = globals if locals is None else runtime_namespace(locals, False)
    return run(code, globals, locals)


def shadow_eval(source, globals=None, locals=None):
    return runtime_run(REAL_EVAL, source, globals, locals, sys._getframe(1))


def shadow_exec(source, globals=None, locals=None):
    return runtime_run(REAL_EXEC, source, globals, locals, sys._getframe(1))


def shadow_compile(source, filename, mode, flags=0, dont_inherit=False, optimize=-1, **kwargs):
    if not session.guardrails:
        return REAL_COMPILE(source, filename, mode, flags, dont_inherit, optimize, **kwargs)
    if kwargs:
        raise GuardrailError(f"compile() with {sorted(kwargs)} is refused by the REPL guardrails")
    return runtime_code(source, filename, mode, flags, dont_inherit, optimize)


def shadow_getattr(obj, name, *default):
    if not session.guardrails:
        return getattr(obj, name, *default)
    try:
        return guarded_attribute(obj, name)
    except AttributeError:
        if default:
            return default[0]
        raise


REAL_EVAL, REAL_EXEC, REAL_COMPILE = builtins.eval, builtins.exec, builtins.compile
SHADOWS = {"eval": shadow_eval, "exec": shadow_exec, "compile": shadow_compile}
SHADOW_FUNCTIONS = (shadow_eval, shadow_exec, shadow_compile, shadow_getattr)
# getattr only where the names come from data and the module needs no dunder.
SHADOWED_GETATTR = frozenset({"string"})
# Evaluates typing's annotations from Python 3.14 on.
SHADOWED_HELPERS = frozenset({"annotationlib"})
shielded_modules = set()
screened_code = weakref.WeakSet()


def shield_modules():
    """Install the shadows in every loaded module the REPL can reach. A
    module that defines the name itself (re.compile) keeps its own."""
    for name, module in list(sys.modules.items()):
        if name in shielded_modules or not isinstance(module, types.ModuleType):
            continue
        top = name.split(".")[0]
        if top not in session.allowed_modules() and top not in SHADOWED_HELPERS:
            continue
        shielded_modules.add(name)
        namespace = vars(module)
        shadows = dict(SHADOWS, getattr=shadow_getattr) if name in SHADOWED_GETATTR else SHADOWS
        for builtin_name, shadow in shadows.items():
            if builtin_name not in namespace:
                namespace[builtin_name] = shadow


GUARDED_BUILTINS = guarded_builtins()


# --- Steps ------------------------------------------------------------------

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
        self.tail = collections.deque()
        self.tail_len = 0
        self.dropped = 0

    def writable(self):
        return True

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
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
        head, tail = "".join(self.head), "".join(self.tail)
        if self.dropped:
            return f"{head}\n[truncated {self.dropped} chars]\n{tail}"
        return head + tail


def describe_error(exc):
    """The exception as Python prints it, without this driver's frames."""
    report = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    pending, seen = [report], set()
    while pending:
        part = pending.pop()
        if part is None or id(part) in seen:
            continue
        seen.add(id(part))
        part.stack = traceback.StackSummary.from_list(
            [frame for frame in part.stack if frame.filename != DRIVER_FILE])
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
            problem = final_problem(final)
            if problem is not None:
                answer["ready"] = False  # or every later step would end the same way
                return None, problem
            return final, None
    except Exception:  # an odd `ready` or `content` is not worth failing over
        pass
    return None, None


class Session:
    """The persistent REPL namespace and the settings that shape each step."""

    def __init__(self):
        self.stdout_limit = DEFAULT_STDOUT_LIMIT
        self.message_limit = DEFAULT_MESSAGE_LIMIT
        self.value_limit = DEFAULT_VALUE_LIMIT
        self.guardrails = True
        self.extra_modules = frozenset()
        self.safe_builtins = GUARDED_BUILTINS
        self.steps = 0
        self.final = None
        # The REPL's namespace is a module of its own, registered as
        # __main__: typing and dataclasses look up the globals of a class's
        # module in sys.modules, and must find these, not the driver's.
        self.module = types.ModuleType("__main__")
        sys.modules["__main__"] = self.module
        self.namespace = vars(self.module)
        self.namespace.update({
            "context": None,
            "answer": {"content": "", "ready": False},
            "FINAL": FINAL,
            "FINAL_VAR": FINAL_VAR,
            "llm_query": llm_query,
            "llm_query_batched": llm_query_batched,
            "rlm_query": rlm_query,
            "rlm_query_batched": rlm_query_batched,
            "SubCallError": SubCallError,
        })

    def allowed_modules(self):
        return SAFE_MODULES | self.extra_modules

    def configure(self, message):
        self.stdout_limit = max(0, field(message, "stdout_limit", int, DEFAULT_STDOUT_LIMIT))
        self.message_limit = field(message, "max_message_bytes", int, DEFAULT_MESSAGE_LIMIT)
        self.value_limit = field(message, "max_message_values", int, DEFAULT_VALUE_LIMIT)
        self.guardrails = field(message, "guardrails", bool, True)
        self.extra_modules = frozenset(string_list(message, "allowed_modules", []))
        sys_path = string_list(message, "sys_path")
        if sys_path is not None:
            sys.path[:] = sys_path
        apply_rlimits(field(message, "rlimits", dict, {}))

    def load_context(self, kind):
        global CONTEXT_DATA
        data, CONTEXT_DATA = CONTEXT_DATA, None  # taken once
        if data is None:
            raise ValueError("the host handed over no context")
        try:
            if kind == "text":
                # Lua strings are bytes: invalid UTF-8 survives as surrogates.
                context = str(data, "utf-8", "surrogateescape")
            elif kind == "json":
                context = json.loads(data[:])
            else:
                raise ValueError(f"unknown context format {kind!r}")
        finally:
            if isinstance(data, mmap.mmap):
                data.close()  # the last reference: the memfd is freed
        self.namespace["context"] = context
        return context

    def run(self, code):
        """Run one step: (stdout, error, final)."""
        self.steps += 1
        filename = f"<repl-{self.steps}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        output = CappedWriter(self.stdout_limit)
        before = dict(self.namespace)  # shallow: names only, for the rollback
        self.final = None
        error = None
        self.namespace["__builtins__"] = self.safe_builtins if self.guardrails else builtins
        if self.guardrails:
            shield_modules()
        try:
            compiled = self.compile_step(code, filename)
            saved = sys.stdout, sys.stderr
            sys.stdout = sys.stderr = output
            try:
                exec(compiled, self.namespace)
            finally:
                sys.stdout, sys.stderr = saved
        except FinalSignal:
            pass
        except GuardrailError as refusal:
            error = f"GuardrailError: {refusal}"
        except BaseException as exc:  # SystemExit too: the driver must live on
            error = describe_error(exc)
        if error is not None:
            error = keep_end(error, self.stdout_limit)
            self.namespace.clear()
            self.namespace.update(before)
        final = self.final
        if final is None:
            final, problem = answer_final(self.namespace)
            if problem is not None:
                refused = f"ValueError: answer['content']: {problem}"
                error = refused if error is None else f"{error}\n{refused}"
        return output.getvalue(), error, final

    def compile_step(self, code, filename):
        if not self.guardrails:
            return compile(code, filename, "exec", dont_inherit=True)
        tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
        screen(tree)
        tree = ast.fix_missing_locations(RouteFormatting().visit(tree))
        return compile(tree, filename, "exec", dont_inherit=True)


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


session = Session()


# --- Self-test: what the sandbox must forbid --------------------------------

HOST_PATHS = ("/etc/passwd", "/etc/shadow", "/etc/hostname", "/home", "/var",
              "/run", "/root/.ssh", "/tmp/.X11-unix")
# PWD too: bwrap --chdir sets it, whatever --clearenv said.
SANDBOX_ENVIRONMENT = frozenset({"PATH", "LANG", "LC_ALL", "PYTHONUTF8", "PYTHONIOENCODING",
                                 "HOME", "TZ", "PYTHONHASHSEED", "TMPDIR", "PWD"})
WORKDIR_PROBE = "/session/.rlm_self_test"


def self_test(absent, canaries):
    checks = {
        "network": check_network,
        "host_files": lambda: check_host_files(absent),
        "canaries": lambda: check_canaries(canaries),
        "seccomp": check_seccomp,
        "own_init": check_own_init,
        "pid_namespace": check_pid_namespace,
        "read_only_install": check_read_only_install,
        "workdir_writable": check_workdir_writable,
        "capabilities": check_capabilities,
        "descriptors": check_descriptors,
        "environment": check_environment,
        "host_sysctl": check_host_sysctl,
        "device_nodes": check_device_nodes,
        "workdir_mount": check_workdir_mount,
        "setuid_files": check_setuid_files,
        "proc_hidden": check_proc_hidden,
    }
    results = {}
    for name, check in checks.items():
        try:
            ok, detail = check()
        except Exception as exc:  # could not verify, so not ok
            ok, detail = False, f"check failed: {exc!r}"
        results[name] = {"ok": bool(ok), "detail": detail}
    return results


def check_network():
    with open("/proc/net/dev") as file:
        interfaces = {line.split(":")[0].strip() for line in file.readlines()[2:] if ":" in line}
    outcomes = [try_connect(host, port) for host, port in (("1.1.1.1", 53), ("10.0.0.1", 80))]
    ok = interfaces <= {"lo"} and not any(connected for connected, _ in outcomes)
    details = [f"interfaces: {', '.join(sorted(interfaces)) or 'none'}"] + [d for _, d in outcomes]
    return ok, "; ".join(details)


def try_connect(host, port):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True, f"{host}:{port} reachable"
    except Exception as exc:  # refused, unreachable, or no sockets at all
        return False, f"{host}:{port} blocked ({exc})"


def check_host_files(absent):
    present = [path for path in HOST_PATHS + tuple(absent) if path_present(path)]
    return not present, f"present: {', '.join(present)}" if present else "none present"


def path_present(path):
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:  # e.g. permission denied: something is there
        return True
    return True


def check_canaries(canaries):
    """What the host planted: a file in its home, listeners on 127.0.0.1, a
    path and an abstract unix socket, a descriptor it leaked, itself."""
    reached = []
    home_file = canaries.get("home_file")
    if isinstance(home_file, str) and home_file and path_present(home_file):
        reached.append("home file")
    port = canaries.get("tcp_port")
    if isinstance(port, int) and port > 0 and try_connect("127.0.0.1", port)[0]:
        reached.append(f"127.0.0.1:{port}")
    for key, prefix in (("unix_path", ""), ("abstract", "\0")):
        name = canaries.get(key)
        if isinstance(name, str) and name and unix_connects(prefix + name):
            reached.append(key)
    fd = canaries.get("leaked_fd")
    if isinstance(fd, int) and fd > 2 and descriptor_open(fd):
        reached.append(f"descriptor {fd}")
    host_pid = canaries.get("host_pid")
    if isinstance(host_pid, int) and host_pid > 4 and signals(host_pid):
        reached.append(f"host process {host_pid}")
    secret = canaries.get("secret")
    if isinstance(secret, str) and secret and secret in repr(dict(os.environ)):
        reached.append("secret in environment")
    if reached:
        return False, "reached: " + ", ".join(reached)
    return True, "none reached"


def unix_connects(address):
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            sock.connect(address)
            return True
    except Exception:  # refused, absent, or no sockets at all
        return False


def descriptor_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def signals(pid):
    try:
        os.kill(pid, 0)  # signal 0: only asks whether it could be signalled
        return True
    except OSError:
        return False


def check_seccomp():
    status = proc_status()
    return status.get("Seccomp") == "2", f"Seccomp={status.get('Seccomp')}"


def check_own_init():
    with open("/proc/1/cmdline", "rb") as file:
        argv0 = file.read().split(b"\0", 1)[0]
    return os.path.basename(argv0) == b"bwrap", f"pid 1 is {argv0.decode(errors='replace')}"


def proc_status():
    status = {}
    with open("/proc/self/status") as file:
        for line in file:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    return status


def check_pid_namespace():
    pid = os.getpid()
    processes = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    return pid <= 4 and len(processes) <= 4, f"pid {pid}, {len(processes)} processes visible"


def check_read_only_install():
    # ast is a plain source module, so its directory is the stdlib's.
    directories = [os.path.dirname(sys.executable), os.path.dirname(ast.__file__)]
    writable = [d for d in directories if can_create_file_in(d)]
    if writable:
        return False, f"writable: {', '.join(writable)}"
    return True, f"read-only: {', '.join(directories)}"


def can_create_file_in(directory):
    path = os.path.join(directory, f".rlm_probe_{os.getpid()}")
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return False
    os.close(descriptor)
    os.unlink(path)
    return True


def check_workdir_writable():
    payload = b"rlm self test\n"
    with open(WORKDIR_PROBE, "wb") as file:
        file.write(payload)
    try:
        with open(WORKDIR_PROBE, "rb") as file:
            same = file.read() == payload
    finally:
        os.unlink(WORKDIR_PROBE)
    return same, "created, wrote, read back and removed " + WORKDIR_PROBE


def check_capabilities():
    status = proc_status()
    keys = ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs")
    ok = all(int(status[key], 16) == 0 for key in keys[:3]) and status["NoNewPrivs"] == "1"
    return ok, ", ".join(f"{key}={status[key]}" for key in keys)


def check_descriptors():
    descriptors = sorted(int(entry) for entry in os.listdir("/proc/self/fd"))
    extra = [fd for fd in descriptors if fd > 2]
    # One extra is expected: the descriptor the listing itself used.
    return len(extra) <= 1, f"open: {descriptors}"


def check_environment():
    extra = sorted(set(os.environ) - SANDBOX_ENVIRONMENT)
    if extra:
        return False, f"unexpected: {', '.join(extra)}"
    return True, f"keys: {', '.join(sorted(os.environ))}"


SYSCTL_PROBE = "/proc/sys/kernel/printk_ratelimit"


def check_host_sysctl():
    """A host-global sysctl must not open for writing (nothing is written)."""
    try:
        descriptor = os.open(SYSCTL_PROBE, os.O_WRONLY)
    except OSError as exc:
        return True, f"{SYSCTL_PROBE}: {exc.strerror}"
    os.close(descriptor)
    return False, f"{SYSCTL_PROBE} opens for writing"


def check_device_nodes():
    """The host's device nodes are bound in: their mode must not change
    (set to what it is, so nothing changes even when it can)."""
    mode = os.stat("/dev/null").st_mode & 0o7777
    try:
        os.chmod("/dev/null", mode)
    except OSError as exc:
        return True, f"chmod /dev/null: {exc.strerror}"
    return False, "chmod /dev/null succeeded"


def check_workdir_mount():
    flags = os.statvfs("/session").f_flag
    ok = bool(flags & os.ST_NOSUID) and bool(flags & os.ST_NODEV)
    return ok, f"/session nosuid={bool(flags & os.ST_NOSUID)} nodev={bool(flags & os.ST_NODEV)}"


def check_setuid_files():
    path = "/session/.rlm_setuid_probe"
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o4755)
    except OSError as exc:
        return True, f"create mode 04755: {exc.strerror}"
    try:
        os.close(descriptor)
        os.chmod(path, 0o2755)
        return False, "a setgid file was made in /session"
    except OSError as exc:
        setuid = os.stat(path).st_mode & 0o6000
        return not setuid, f"chmod 02755: {exc.strerror}; mode bits {oct(setuid)}"
    finally:
        os.unlink(path)


HIDDEN_PROC = ("slabinfo", "kallsyms", "timer_list", "keys", "sched_debug", "kpageflags",
               "modules", "vmallocinfo", "iomem")


def check_proc_hidden():
    shown = []
    for name in HIDDEN_PROC:
        try:
            with open("/proc/" + name, "rb") as file:
                if file.read(1):
                    shown.append(name)
        except OSError:
            pass
    return not shown, f"readable: {', '.join(shown)}" if shown else "none readable"


# --- Main loop --------------------------------------------------------------

def main():
    send({"type": "hello", "protocol": PROTOCOL_VERSION,
          "python": "%d.%d.%d" % sys.version_info[:3]})
    while True:
        message = receive()
        if message is None:
            return
        kind = message["type"]
        if kind == "configure":
            session.configure(message)
            send({"type": "configured"})
        elif kind == "self_test":
            checks = self_test(string_list(message, "absent", []),
                               field(message, "canaries", dict, {}))
            send({"type": "self_test_result", "checks": checks})
        elif kind == "load_context":
            send(load_context(message))
        elif kind == "exec":
            code = field(message, "code", str)
            if code is None:
                fatal("exec: missing field 'code'")
            stdout, error, final = session.run(code)
            send({"type": "exec_result", "id": message.get("id"),
                  "stdout": stdout, "error": error, "final": final})
        else:
            fatal(f"unexpected message type {kind!r}")


def load_context(message):
    kind = field(message, "format", str, "text")
    try:
        context = session.load_context(kind)
    except Exception as exc:
        return {"type": "ready", "error": f"{type(exc).__name__}: {exc}"}
    length = len(context) if isinstance(context, (str, list, dict)) else None
    return {"type": "ready", "context_type": type(context).__name__, "context_len": length}


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # a driver bug: say so on the protocol, details on stderr
        traceback.print_exc()
        fatal(f"driver error: {exc!r}")
