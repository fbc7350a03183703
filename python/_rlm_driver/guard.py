"""The guardrails at run time: the guarded import, read-only views of the
modules the REPL may import, the builtins REPL code sees, and the shadows of
eval, exec, compile and getattr put in the modules it may reach (their
checks are shield's)."""

import builtins
import sys

from . import shield, state
from .screen import ALLOWED_DUNDERS, GuardrailError, IO_NAMES, SAFE_BUILTIN_NAMES, SAFE_MODULES

REAL_IMPORT = builtins.__import__


def allowed_modules():
    return SAFE_MODULES | state.current.extra_modules


def allowed_name(name):
    parts = name.split(".")
    return parts[0] in allowed_modules() and not any(p.startswith("_") for p in parts)


def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level:
        raise ImportError("relative imports are refused by the REPL guardrails")
    if type(fromlist) is list and level == 0:
        return import_for_c(name)
    allowed = allowed_modules()
    parts = name.split(".")
    if parts[0] not in allowed:
        raise ImportError(f"import of {name!r} is refused by the REPL guardrails; "
                          f"allowed modules: {', '.join(sorted(allowed))}.{refusal_hint(parts[0])}")
    if any(part.startswith("_") for part in parts):
        raise ImportError(f"import of private module {name!r} is refused by the REPL guardrails")
    try:
        module = REAL_IMPORT(name, None, None, fromlist, 0)
    except ModuleNotFoundError as missing:
        if missing.name != parts[0]:
            raise
        raise ModuleNotFoundError(f"No module named {parts[0]!r}: the host allows it "
                                  f"(sandbox.allowed_modules), but the sandbox's Python does not have it. "
                                  f"{WHAT_IS_BOUND}", name=parts[0]) from None
    shield_modules()
    # Checked here: for a missing attribute, `from m import x` would fall
    # back to sys.modules["m.x"] and hand out the raw module.
    for item in fromlist or ():
        if item != "*" and not exposes(module, item):
            raise ImportError(f"cannot import name {item!r} from {name!r} "
                              "(missing, or hidden by the REPL guardrails)")
    return view_of(module)


# Modules that do what the REPL does another way: the sub-calls block, and
# llm_query_batched runs prompts side by side.
CONCURRENCY = frozenset({"asyncio", "concurrent", "threading", "multiprocessing", "trio", "anyio"})
WHAT_IS_BOUND = ("The sandbox binds, read-only, the directories of that interpreter's sys.path "
                 "(its standard library and site-packages): a module must be installed there.")


def refusal_hint(top):
    """What a refused import's message adds: the way to do without it."""
    if top in CONCURRENCY:
        return (" The REPL runs no event loop, and needs none: llm_query() blocks and returns "
                "the answer (no await); for many prompts at once call "
                "llm_query_batched([prompt, ...]), which runs them concurrently and returns the "
                "answers in order.")
    return (f" A host enables another module with Session.new's sandbox.allowed_modules option (e.g. "
            f"sandbox = {{ allowed_modules = {{\"{top}\"}} }}). {WHAT_IS_BOUND} Here, do without it "
            "(plain Python, and the modules above).")


def import_for_c(name):
    """An import the C code of an allowed module makes while it runs for the
    REPL (datetime.strptime imports _strptime): PyImport_Import calls the
    __import__ of the calling frame's builtins, here the REPL's, with a
    list as fromlist, which the REPL's own import statements never pass
    (they give None or a tuple; the name __import__ itself is refused by the
    screen). The import is the module's, so it is not judged; the C caller
    takes the module from sys.modules, and the REPL only ever sees a view
    (private names hidden), never the module."""
    module = REAL_IMPORT(name, None, None, None, 0)
    shield_modules()
    return view_of(sys.modules.get(name, module))


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
            if isinstance(value, shield.ModuleType):
                return view_of(value)
            return shield.GUARDED_MEMBERS.get((module.__name__, name), value)
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
    if isinstance(value, shield.ModuleType):
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
    table["__rlm_attribute__"] = shield.guarded_attribute
    return table


_builtins_table = []


def builtins_table():
    """The one table of guarded builtins (made at first use)."""
    if not _builtins_table:
        _builtins_table.append(guarded_builtins())
    return _builtins_table[0]


def runtime_namespace(namespace, is_globals):
    """The globals (or locals) a string from an allowed module runs in: the
    REPL's own namespace as it is; a module's namespace only when the REPL
    may import that module, as its view shows it; any other dict with the
    REPL's builtins."""
    if namespace is None or namespace is state.current.namespace:
        return namespace
    module = shield.module_of_namespace(namespace)
    if module is not None:
        visible = {}
        if not shield.is_driver_module(module) and allowed_name(module.__name__):
            for name in dir(module):
                value = getattr(module, name, None)
                if is_visible(module, name, value):
                    visible[name] = view_of(value) if isinstance(value, shield.ModuleType) else value
        if is_globals:
            visible["__builtins__"] = builtins_table()
        return visible
    if is_globals and isinstance(namespace, dict) \
            and namespace.get("__builtins__") in (None, builtins, vars(builtins)):
        namespace["__builtins__"] = builtins_table()  # where eval would put the real ones
    return namespace


def runtime_run(run, source, globals, locals, caller):
    if globals is None:
        globals = caller.f_globals
        if locals is None:
            locals = caller.f_locals
    if not state.current.guardrails:
        return run(source, globals, locals)
    if isinstance(source, shield.CodeType):
        if source not in shield.screened():
            raise GuardrailError("code not compiled under the REPL guardrails is refused")
        code = source
    else:
        code = shield.runtime_code(source, "<string>", "eval" if run is shield.REAL_EVAL else "exec")
    globals = runtime_namespace(globals, True)
    locals = globals if locals is None else runtime_namespace(locals, False)
    return run(code, globals, locals)


def shadow_eval(source, globals=None, locals=None):
    return runtime_run(shield.REAL_EVAL, source, globals, locals, sys._getframe(1))


def shadow_exec(source, globals=None, locals=None):
    return runtime_run(shield.REAL_EXEC, source, globals, locals, sys._getframe(1))


def shadow_compile(source, filename, mode, flags=0, dont_inherit=False, optimize=-1, **kwargs):
    if not state.current.guardrails:
        return shield.REAL_COMPILE(source, filename, mode, flags, dont_inherit, optimize, **kwargs)
    if kwargs:
        raise GuardrailError(f"compile() with {sorted(kwargs)} is refused by the REPL guardrails")
    return shield.runtime_code(source, filename, mode, flags, dont_inherit, optimize)


def shadow_getattr(obj, name, *default):
    if not state.current.guardrails:
        return getattr(obj, name, *default)
    try:
        return shield.guarded_attribute(obj, name)
    except AttributeError:
        if default:
            return default[0]
        raise


SHADOWS = {"eval": shadow_eval, "exec": shadow_exec, "compile": shadow_compile}
SHADOW_FUNCTIONS = (shadow_eval, shadow_exec, shadow_compile, shadow_getattr)
# getattr only where the names come from data and the module needs no dunder.
SHADOWED_GETATTR = frozenset({"string"})
# Evaluates typing's annotations from Python 3.14 on.
SHADOWED_HELPERS = frozenset({"annotationlib"})
# The names of sys.modules shield_modules has settled (shielded, or not the
# REPL's to reach): each call looks only at the names new since the last.
settled_modules = set()


def shield_modules():
    """Install the shadows in every loaded module the REPL can reach. A
    module that defines the name itself (re.compile) keeps its own. Runs at
    every step and import: only the names new to sys.modules cost it more
    than a set difference."""
    new = sys.modules.keys() - settled_modules
    if not new:
        return
    allowed = allowed_modules()
    for name in new:
        module = sys.modules.get(name)
        if not isinstance(module, shield.ModuleType):
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
