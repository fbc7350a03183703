"""The guardrails at run time: the guarded import, read-only views of the
modules the REPL may import, and the builtins REPL code sees."""

import builtins
import sys

from . import shield, state
from .screen import ALLOWED_DUNDERS, IO_NAMES, SAFE_BUILTIN_NAMES, SAFE_MODULES

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
                                  f"(allowed_modules), but the sandbox's Python does not have it. "
                                  f"{WHAT_IS_BOUND}", name=parts[0]) from None
    shield.shield_modules()
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
    return (f" A host enables another module with Session.new's allowed_modules option (e.g. "
            f"allowed_modules = {{\"{top}\"}}). {WHAT_IS_BOUND} Here, do without it "
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
    shield.shield_modules()
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
    if name.startswith("_") or any(value is shadow for shadow in shield.SHADOW_FUNCTIONS):
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
    """The one table of guarded builtins (made at first use: shield and this
    module import each other)."""
    if not _builtins_table:
        _builtins_table.append(guarded_builtins())
    return _builtins_table[0]
