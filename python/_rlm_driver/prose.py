"""Whether a prose FINAL(text) line's text is code (docs/prompt.md): the
model's text is its answer as written, unless it is unambiguously Python,
which the host then has run as FINAL((text)). Text that merely compiles
("2024-12-25", "3-1", "2^10", "Paris", "json") is text."""

import builtins

from . import state, tree

MISSING = object()
OWN_DATA = ("context", "answer")  # the REPL's own names that hold data, not functions


def is_data(value):
    """A value the model's code computed, not a module, function or class."""
    return not (isinstance(value, (type, type(tree), type(is_data), type(len)))
                or type(value).__name__ in ("method", "builtin_function_or_method", "functools.partial"))


def names_of(namespace, name):
    """What name is in the REPL: "data", "callable", "lost" (the model's
    code bound it, and the block was rolled back) or None (unknown)."""
    session = state.current
    value = namespace.get(name, MISSING)
    if value is MISSING:
        if name in session.lost_names:
            return "lost"
        return "callable" if callable(getattr(builtins, name, None)) else None
    originals = session.originals or {}
    if name in originals and value is originals[name]:
        return "data" if name in OWN_DATA else "callable"
    if name.startswith("__"):
        return None
    return "data" if is_data(value) else "callable"


def root_name(node):
    while isinstance(node, (tree.Attribute, tree.Subscript, tree.Call)):
        node = node.func if isinstance(node, tree.Call) else node.value
    return node


def final_code(text):
    """FINAL(text) as the model wrote it when that is one call of one
    argument (its traceback then shows the model's line); else FINAL((text)),
    which a tuple or a trailing comment needs."""
    try:
        body = compile(f"FINAL({text})", "<final>", "exec", tree.PyCF_ONLY_AST, dont_inherit=True).body
        call = body[0].value if len(body) == 1 and isinstance(body[0], tree.Expr) else None
        if isinstance(call, tree.Call) and len(call.args) == 1 and not call.keywords \
                and not isinstance(call.args[0], tree.Starred):
            return f"FINAL({text})"
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        pass
    return f"FINAL(({text}\n))"


def literal_value(text):
    """The value of a text that is one Python str literal ("Paris"), or None."""
    try:
        body = compile("(" + text + "\n)", "<final>", "eval", tree.PyCF_ONLY_AST, dont_inherit=True).body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return body.value if isinstance(body, tree.Constant) and isinstance(body.value, str) else None


def reads_as_code(text):
    """Whether the text of a prose FINAL line is code: an f-string with a field; str arithmetic; a call of something the REPL
    has (a builtin, the REPL's functions, the model's, a method); a name
    of the model's data (or context), or one the model's code bound and
    a rolled-back block took away (its NameError is the model's to see)."""
    try:
        body = compile("(" + text + "\n)", "<final>", "eval", tree.PyCF_ONLY_AST, dont_inherit=True).body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    if isinstance(body, tree.Constant):
        return False  # a number as written; a str literal is text too (literal_value)
    namespace = state.current.namespace
    local = set()
    nodes = list(tree.walk(body))
    for node in nodes:  # a comprehension's or a lambda's own names
        if isinstance(node, tree.Name) and not isinstance(node.ctx, tree.Load):
            local.add(node.id)
        elif isinstance(node, tree.arg):
            local.add(node.arg)
    for node in nodes:
        if isinstance(node, tree.JoinedStr) and any(isinstance(v, tree.FormattedValue) for v in node.values):
            return True
        if isinstance(node, tree.BinOp) and any(isinstance(side, tree.Constant) and isinstance(side.value, str)
                                                for side in (node.left, node.right)):
            return True
        if isinstance(node, tree.Call):
            root = root_name(node.func)
            if not isinstance(root, tree.Name) or root.id in local or names_of(namespace, root.id) is not None:
                return True
        if isinstance(node, tree.Name) and node.id not in local and names_of(namespace, node.id) in ("data", "lost"):
            return True
    return False
