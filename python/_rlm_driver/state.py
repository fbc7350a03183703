"""The driver's one session: the settings the host configured and the REPL's
namespace. Every module reads them through `current`."""

import sys

DEFAULT_STDOUT_LIMIT = 2000
DEFAULT_MESSAGE_LIMIT = 16 << 20
DEFAULT_VALUE_LIMIT = (16 << 20) // 256


class State:
    def __init__(self):
        self.stdout_limit = DEFAULT_STDOUT_LIMIT
        self.message_limit = DEFAULT_MESSAGE_LIMIT
        self.value_limit = DEFAULT_VALUE_LIMIT
        self.guardrails = True
        self.int_bits = 64  # the host's Lua: 64 (5.3+) or 53 (5.1, LuaJIT: doubles)
        self.extra_modules = frozenset()
        self.steps = 0
        self.final = None
        self.in_step = False  # calls to the host are taken only during a step
        self.executing = False  # the REPL's code runs (SIGINT may raise in it)
        self.main_busy = 0  # the main thread is inside a call to the host
        self.interrupt_pending = False  # SIGINT came while it could not raise
        self.interrupt_raised = False  # this step's interrupt was raised
        self.originals = None  # the REPL's own names' values (step.restore_names)
        self.lost_names = set()  # names only rolled-back blocks bound (prose.reads_as_code)
        self.paid = []  # this step's llm_query answers: (prompt, model, text)
        self.kept = {}  # answers of rolled-back steps, (prompt, model) -> [text, ...] (api.kept_answer)
        self.kept_count = self.kept_chars = 0
        self.context_data = None  # the context's descriptor (4), until load_context
        # The REPL's namespace is a module of its own, registered as
        # __main__: typing and dataclasses look up the globals of a class's
        # module in sys.modules, and must find these, not the driver's.
        self.module = type(sys)("__main__")  # types.ModuleType
        self.namespace = vars(self.module)


def dirname(path):
    """os.path.dirname (posixpath's), without importing os: the driver's
    start does not need os (and the _collections_abc, stat and posixpath
    it imports)."""
    head = path[:path.rfind("/") + 1]
    if head and head != "/" * len(head):
        head = head.rstrip("/")
    return head


current = State()
# The entry script (python/repl_driver.py) ran as __main__; it is the
# driver's too, and from here only this reference reaches it.
ENTRY_MODULE = sys.modules.get("__main__")
sys.modules["__main__"] = current.module
# The package's own modules, filled in by main once all are loaded: the
# guard never evaluates a string in their namespaces.
driver_modules = []
