"""Host tools: the functions the host's configure message names become
Python functions in the REPL's namespace. Each call is one tool_call message
back to the host; its tool_result is the value (JSON), or an error raised
here as ToolError (docs/protocol.md)."""

from . import api, protocol, state
from .protocol import fatal


class ToolError(RuntimeError):
    """A host tool failed (it raised, returned an error, or the run's
    max_tool_calls are spent). The code may catch it."""


def call(name, args, kwargs):
    """One tool call: its value, or ToolError."""
    what = f"the arguments of {name}()"
    request = {"type": "tool_call", "name": name, "args": list(args)}
    if kwargs:
        request["kwargs"] = dict(kwargs)
    room = state.current.value_limit - 64
    # [args, kwargs] stands where the message does: each argument has
    # api.VALUE_DEPTH levels, as a final answer does.
    values, depth = api.shape([request["args"], request.get("kwargs")], room, api.LINE_DEPTH)
    if values > room:
        raise ValueError(f"{what} hold more than {room} JSON values; the host accepts no more "
                         "in one message: pass less")
    if depth > api.LINE_DEPTH:
        raise ValueError(f"{what} nest lists and dicts more than {api.VALUE_DEPTH} deep; the host "
                         "reads no deeper: pass something flatter")
    # lua-cjson reads every number as a double, on every Lua.
    problem, _ = api.exactness_problem([request["args"], request.get("kwargs")], 53,
                                       "number a tool gets exactly (2**53: the host reads doubles)")
    if problem is not None:
        raise ValueError(f"{what}: {problem}")
    with protocol.MainThreadBusy(), protocol.CHANNEL:
        try:
            request_id = protocol.begin_call(request, what)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ValueError) and "bytes as a message" in str(exc):
                raise
            raise TypeError(f"{what} must be JSON values (str, int, float, bool, None, list, "
                            f"dict with str keys): {exc}") from None
        reply = protocol.next_reply(request_id, "tool call", "tool_result")
    if reply.get("error") is not None:
        raise ToolError(f"{name}: {reply['error']}")
    if "value" not in reply:
        fatal(f"tool_result {request_id} has neither a 'value' nor an 'error'")
    return reply["value"]


def make(name, doc):
    def tool(*args, **kwargs):
        return call(name, args, kwargs)
    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = doc or None
    return tool


def install(message):
    """configure's `tools`: a list of {"name", "doc"}; each becomes a
    function of the namespace, with ToolError beside them."""
    specs = protocol.field(message, "tools", list, [])
    if not specs:
        return
    import keyword  # here: a session without tools does not pay for it
    namespace = state.current.namespace
    for spec in specs:
        name = spec.get("name") if isinstance(spec, dict) else None
        doc = spec.get("doc", "") if isinstance(spec, dict) else None
        if (not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name)
                or name.startswith("_") or name in namespace or not isinstance(doc, str)):
            fatal(f"configure: bad tool {spec!r:.100}")
        namespace[name] = make(name, doc)
    namespace["ToolError"] = ToolError
