"""The static half of the guardrails: what REPL code may not name, read
before it runs, and the rewrite that routes run-time format templates
through a check (see shield.guarded_attribute)."""

import _string

from . import tree as ast  # what the driver needs of ast, on _ast alone


class GuardrailError(Exception):
    """A construct the REPL guardrails refuse."""


GuardrailError.__module__ = "__main__"  # tracebacks say GuardrailError, as before


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


# What screen() and RouteFormatting look for, as text: every refused
# attribute is a dunder or has "_" in it, and the rest are these names.
SCREENED_WORDS = tuple(sorted(name for name in REFUSED_NAMES | FORMAT_METHODS | ROUTED_METHODS
                              | FRAME_ATTRIBUTES if "_" not in name))


def plain(code):
    """Whether REPL code is ASCII (its identifiers are then as written) with
    no "_" and none of SCREENED_WORDS anywhere in it: then screen() refuses
    nothing in it and RouteFormatting rewrites nothing, and it is compiled
    as it stands, without its tree (no node objects, walk or rewrite).
    Conservative: a word inside a string or a comment is enough to take
    the full path. A new kind of refusal in screen() must be added here
    too."""
    return code.isascii() and "_" not in code and not any(word in code for word in SCREENED_WORDS)


def screen(tree, runtime=False):
    """Raise GuardrailError at the first construct the guardrails refuse.
    runtime: the tree is a string an allowed module compiles while the code
    runs (see RUNTIME_DUNDERS). (plain() must know what this looks for.)"""
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
        # string.Formatter().parse(template), without importing string (and re)
        fields = [(name, spec) for _, name, spec, _ in _string.formatter_parser(template)]
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
