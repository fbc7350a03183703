"""The checks behind the guardrails around the allowed modules' own string
evaluation and attribute walks.

Some allowed functions evaluate strings or fetch attributes named by data,
with the real builtins: typing.get_type_hints and ForwardRef (string
annotations), dataclasses (generated methods, in the globals of the class's
module), collections.namedtuple, string.Formatter.get_field, and
operator.attrgetter/methodcaller. Under the guardrails the module-level
names they use (eval, exec, compile, getattr) are replaced in those modules
(guard.shield_modules) by versions that screen the string as REPL code is
screened (runtime_code), run it with the REPL's builtins, and never in the
globals of a module the REPL may not import (the driver's own modules
included: is_driver_module); attrgetter and methodcaller are handed out as
checked versions. guard imports this module; it imports nothing of guard.
"""

import builtins
import sys

from . import state
from . import tree as ast  # what the driver needs of ast, on _ast alone
from .screen import (GuardrailError, ROUTED_METHODS, RouteFormatting, is_refused_attribute,
                     screen, walks_out)


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
    if isinstance(source, CodeType):
        return source
    tree = source if isinstance(source, ast.AST) else \
        REAL_COMPILE(source, filename, mode, flags | ast.PyCF_ONLY_AST, True, optimize)
    screen(tree, runtime=True)
    tree = ast.fix_missing_locations(RouteFormatting().visit(tree))
    if flags & ast.PyCF_ONLY_AST:
        return tree
    code = REAL_COMPILE(tree, filename, mode, flags, True, optimize)
    screened().add(code)
    return code


def is_driver_module(module):
    return module is state.ENTRY_MODULE or any(module is m for m in state.driver_modules)


def module_of_namespace(namespace):
    # The driver's modules first: the entry script is no longer in
    # sys.modules (the REPL's namespace took its name).
    for module in (state.ENTRY_MODULE,) + tuple(state.driver_modules):
        if module is not None and vars(module) is namespace:
            return module
    for module in list(sys.modules.values()):
        if getattr(module, "__dict__", None) is namespace:
            return module
    return None


REAL_EVAL, REAL_EXEC, REAL_COMPILE = builtins.eval, builtins.exec, builtins.compile
ModuleType = type(sys)  # types.ModuleType and CodeType, without importing types
CodeType = type(guarded_attribute.__code__)
screened_code = []  # a weakref.WeakSet, made at first use (weakref is not needed before)


def screened():
    """The code compiled under the guardrails (the set exec and eval take)."""
    if not screened_code:
        import weakref
        screened_code.append(weakref.WeakSet())
    return screened_code[0]
