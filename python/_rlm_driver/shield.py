"""The guardrails around the allowed modules' own string evaluation and
attribute walks.

Some allowed functions evaluate strings or fetch attributes named by data,
with the real builtins: typing.get_type_hints and ForwardRef (string
annotations), dataclasses (generated methods, in the globals of the class's
module), collections.namedtuple, string.Formatter.get_field, and
operator.attrgetter/methodcaller. Under the guardrails the module-level
names they use (eval, exec, compile, getattr) are replaced in those modules
by versions that screen the string as REPL code is screened, run it with the
REPL's builtins, and never in the globals of a module the REPL may not
import (the driver's own modules included); attrgetter and methodcaller are
handed out as checked versions.
"""

import builtins
import sys

from . import guard, state
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


def runtime_namespace(namespace, is_globals):
    """The globals (or locals) a string from an allowed module runs in: the
    REPL's own namespace as it is; a module's namespace only when the REPL
    may import that module, as its view shows it; any other dict with the
    REPL's builtins."""
    if namespace is None or namespace is state.current.namespace:
        return namespace
    module = module_of_namespace(namespace)
    if module is not None:
        visible = {}
        if not is_driver_module(module) and guard.allowed_name(module.__name__):
            for name in dir(module):
                value = getattr(module, name, None)
                if guard.is_visible(module, name, value):
                    visible[name] = guard.view_of(value) if isinstance(value, ModuleType) else value
        if is_globals:
            visible["__builtins__"] = guard.builtins_table()
        return visible
    if is_globals and isinstance(namespace, dict) \
            and namespace.get("__builtins__") in (None, builtins, vars(builtins)):
        namespace["__builtins__"] = guard.builtins_table()  # where eval would put the real ones
    return namespace


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


def runtime_run(run, source, globals, locals, caller):
    if globals is None:
        globals = caller.f_globals
        if locals is None:
            locals = caller.f_locals
    if not state.current.guardrails:
        return run(source, globals, locals)
    if isinstance(source, CodeType):
        if source not in screened():
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
    if not state.current.guardrails:
        return REAL_COMPILE(source, filename, mode, flags, dont_inherit, optimize, **kwargs)
    if kwargs:
        raise GuardrailError(f"compile() with {sorted(kwargs)} is refused by the REPL guardrails")
    return runtime_code(source, filename, mode, flags, dont_inherit, optimize)


def shadow_getattr(obj, name, *default):
    if not state.current.guardrails:
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
# The names of sys.modules shield_modules has settled (shielded, or not the
# REPL's to reach): each call looks only at the names new since the last.
settled_modules = set()
ModuleType = type(sys)  # types.ModuleType and CodeType, without importing types
CodeType = type(shadow_eval.__code__)
screened_code = []  # a weakref.WeakSet, made at first use (weakref is not needed before)


def screened():
    """The code compiled under the guardrails (the set exec and eval take)."""
    if not screened_code:
        import weakref
        screened_code.append(weakref.WeakSet())
    return screened_code[0]


def shield_modules():
    """Install the shadows in every loaded module the REPL can reach. A
    module that defines the name itself (re.compile) keeps its own. Runs at
    every step and import: only the names new to sys.modules cost it more
    than a set difference."""
    new = sys.modules.keys() - settled_modules
    if not new:
        return
    allowed = guard.allowed_modules()
    for name in new:
        module = sys.modules.get(name)
        if not isinstance(module, ModuleType):
            continue  # a placeholder (None): looked at again next time
        settled_modules.add(name)
        top = name.split(".")[0]
        if top not in allowed and top not in SHADOWED_HELPERS:
            continue
        namespace = vars(module)
        shadows = dict(SHADOWS, getattr=shadow_getattr) if name in SHADOWED_GETATTR else SHADOWS
        for builtin_name, shadow in shadows.items():
            if builtin_name not in namespace:
                namespace[builtin_name] = shadow
