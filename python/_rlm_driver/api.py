"""The names the REPL's code is given: FINAL, FINAL_VAR, the sub-calls
(llm_query, llm_query_batched, rlm_query, rlm_query_batched) and
SubCallError. Each sub-call is one call back to the host (protocol.call)."""

from . import codec, protocol, state
from .protocol import SubCallError


class FinalSignal(BaseException):
    """Unwinds a step after FINAL/FINAL_VAR. A BaseException, so that user
    code's `except Exception:` lets it through."""


# The deepest a line may nest, lists and dicts: the host's decoder
# (lua-cjson's decode_max_depth in lua/rlm/base/json.lua) refuses more, and that
# ends the session. A message and its field take two of them.
LINE_DEPTH = 200
VALUE_DEPTH = LINE_DEPTH - 2


def shape(value, limit, depth_limit):
    """(JSON values, lists and dicts nested) in `value` as the host counts
    them (csrc/jsonscan.c: an empty list or dict counts 2; a tuple is the
    list json.dumps writes), stopping past either limit: a level at a time."""
    count, depth, level = 0, 0, [value]
    while level and count <= limit and depth <= depth_limit:
        below, containers = [], 0
        for v in level:
            if isinstance(v, dict):
                containers += 1
                count += 0 if v else 1
                below.extend(v.values())
            elif isinstance(v, (list, tuple)):
                containers += 1
                count += 0 if v else 1
                below.extend(v)
        count += len(level)
        depth += 1 if containers else 0
        level = below
    return count, depth


NO_VALUE = object()


def final_problem(final, value=NO_VALUE):
    """Why the host would refuse this final answer, or None. One check for
    FINAL, FINAL_VAR and the answer dict: what the host refuses ends the
    session, so a refusal here is an error the model sees instead."""
    session = state.current
    # Room beside the step's output, as 4 bytes a character: the common
    # case; main.run_step checks the whole line again before it goes out.
    size = len(protocol.encode(final))
    room = session.message_limit - 4 * session.stdout_limit - 4096
    if size > room:
        return (f"the final answer is {size} bytes as JSON; the host accepts about "
                f"{max(room, 0)}: answer with something smaller")
    room = session.value_limit - 64
    values, depth = shape(final.get("value") if value is NO_VALUE else value, room, VALUE_DEPTH)
    if values > room:
        return (f"the final answer holds more than {room} JSON values (lists, dicts and their "
                f"items); answer with something smaller")
    if depth > VALUE_DEPTH:
        return (f"the final answer nests lists and dicts more than {VALUE_DEPTH} deep; the host "
                f"reads no deeper: answer with something flatter")
    return None


def finish(final, value=NO_VALUE):
    # The host ends the session on a line longer than its limit; an
    # exception here lets the model send something smaller instead.
    problem = final_problem(final, value)
    if problem is not None:
        raise ValueError(problem)
    if state.current.final is None:  # kept here too, in case a bare except swallows the signal
        state.current.final = final
    raise FinalSignal


def own_answer(value, what):
    """The REPL's own `answer` dict is no answer: its text would be
    "{'content': '', 'ready': False}" (a block that bound `answer` to the
    model's value and was rolled back leaves it)."""
    originals = state.current.originals
    if originals is not None and value is originals.get("answer"):
        raise ValueError(f"{what} was given the REPL's own `answer` dict ({safe_repr(value)}), not an answer: "
                         "answer with your own variable, or set answer['content'] and then "
                         "answer['ready'] = True")


def FINAL(value):
    own_answer(value, "FINAL")
    finish({"kind": "value", "value": str(value)})


def FINAL_VAR(name):
    namespace = state.current.namespace
    if not isinstance(name, str) or name not in namespace:
        name = name_of_value(namespace, name)
    value = namespace[name]
    own_answer(value, f"FINAL_VAR({name!r})")
    try:
        # Its JSON text now, so the value is frozen and surely serialisable.
        # It travels once: the host decodes it (keeping ints ints) and makes
        # its text answer from it.
        text = codec.dumps(value)
    except Exception:
        finish({"kind": "var", "name": name, "value": safe_repr(value), "json": False})
    int_bits = state.current.int_bits
    try:
        held = host_ints(value, int_bits)
    except RecursionError:
        raise ValueError(f"FINAL_VAR({name!r}): the final answer nests lists and dicts more than "
                         f"{VALUE_DEPTH} deep; the host reads no deeper: answer with something flatter") from None
    problem, numbers = exactness_problem(held, int_bits)
    if problem is not None:
        raise ValueError(f"FINAL_VAR({name!r}): {problem}")
    final = {"kind": "var", "name": name, "json": True}
    if held is not value:
        # An int the host's number cannot hold exactly travels as its
        # decimal string, and the answer is the value's JSON text, digits
        # exact (without spaces, as the host writes it).
        final["answer"] = codec.dumps_plain(codec.loads(text))
        text = codec.dumps(held)
    if numbers == "mixed" and int_bits >= 64:
        final["value_json"] = text  # ints and floats: the host decodes this text itself
    else:
        final["value"] = codec.loads(text)  # parsed back: frozen now
        if numbers:
            final["numbers"] = numbers
    finish(final, value)


def host_ints(value, int_bits):
    """`value` with each int that a Lua number of the host cannot hold
    exactly made what it can (docs/protocol.md, "Numbers"): on Lua 5.1 and
    LuaJIT (doubles) an int past 2**53 that a double holds exactly (2**62)
    becomes that float, and one it does not (2**53 + 1) its decimal str; on
    Lua 5.3+ an int past 64 bits its str. The value itself when none is;
    else a copy (lists for tuples, the dict keys as they were). `value`
    went through codec.dumps: JSON types only, no cycles."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
        return value
    if isinstance(value, int):
        if int_bits >= 64:
            if -2 ** 63 <= value < 2 ** 63:
                return value
            return int.__repr__(value)
        if -2 ** 53 <= value <= 2 ** 53:
            return value
        try:
            as_float = float(value)
        except OverflowError:
            return int.__repr__(value)
        return as_float if int(as_float) == value else int.__repr__(value)
    if isinstance(value, dict):
        items = {key: host_ints(item, int_bits) for key, item in value.items()}
        if all(items[key] is item for key, item in value.items()):
            return value
        return items
    if isinstance(value, (list, tuple)):
        items = [host_ints(item, int_bits) for item in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return items
    return value


def json_key(key):
    """The object key json.dumps writes for a dict key."""
    if isinstance(key, str):
        return key
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, float):
        return float.__repr__(key)
    return int.__repr__(key)


def exactness_problem(value, int_bits, where=None):
    """(why the host would not get `value` exactly, or None; what numbers it
    holds). The why (docs/protocol.md, "Numbers"): an int past what a Lua
    number holds (64 bits on Lua 5.3+, 2^53 on 5.1 and LuaJIT), or dict keys
    that JSON makes one ({1: 'a', '1': 'b'}). The numbers, a hint for the
    host's decoder: None (no number), "ints" (ints within 2^53 only),
    "floats" (floats only), or "mixed". The value has been through
    codec.dumps (json.dumps), or shape() bounded it: no cycles. `where`
    names the host's limit in the message, when int_bits alone does not."""
    limit = 2 ** 63 if int_bits >= 64 else 2 ** 53
    ints = floats = big = False
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            floats = True
        elif isinstance(v, int) and not isinstance(v, bool):
            ints = True
            big = big or not -2 ** 53 <= v <= 2 ** 53
            fits = -limit <= v < limit if int_bits >= 64 else -limit <= v <= limit
            if not fits:
                where = where or ("64-bit integer" if int_bits >= 64 else "Lua 5.1/LuaJIT number (2**53)")
                return (f"the int {v if v.bit_length() < 200 else 'of ' + str(v.bit_length()) + ' bits'} "
                        f"does not fit a {where}: the host could not hold it exactly; "
                        "send it as a str (or a float, if rounding is fine)"), None
        elif isinstance(v, dict):
            seen = {}
            for key, item in v.items():
                text = json_key(key)
                if text in seen:
                    return (f"the dict keys {seen[text]!r} and {key!r} are both {text!r} in JSON, so one "
                            "would be lost: give them distinct str keys"), None
                seen[text] = key
                stack.append(item)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    if not ints and not floats:
        return None, None
    if ints and not floats and not big:
        return None, "ints"
    return None, "floats" if not ints else "mixed"


def user_names(namespace):
    reserved = names()
    return [k for k in namespace if not k.startswith("_") and k not in reserved]


def name_of_value(namespace, value):
    """FINAL_VAR(result) passes result's value, not its name: the variable
    that holds that very value, or a NameError that says how to fix the call."""
    for key in user_names(namespace):
        if namespace[key] is value:
            return key
    defined = user_names(namespace)
    listed = ", ".join(defined[:20]) + (", ..." if len(defined) > 20 else "") or "none yet"
    if isinstance(value, str) and value.isidentifier():
        import difflib  # here: only this error pays for it
        close = difflib.get_close_matches(value, defined, n=1)
        hint = f" Did you mean FINAL_VAR({close[0]!r})?" if close else ""
        raise NameError(f"FINAL_VAR: no variable named {value!r}.{hint} Your variables: {listed}. "
                        f"Set it first (e.g. {value} = ...), then call FINAL_VAR({value!r}).")
    raise NameError(f"FINAL_VAR takes the name of a variable, as a string: FINAL_VAR('result'). It was "
                    f"given a {type(value).__name__} value that no variable holds. Store the answer in "
                    f"a variable and call FINAL_VAR('that_name'), or answer with FINAL(value). "
                    f"Your variables: {listed}.")


def safe_repr(value):
    try:
        return repr(value)
    except Exception as exc:
        return f"<repr() failed: {exc!r}>"


def str_list(value, what):
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
        raise TypeError(f"{what} takes a list of str prompts")
    return list(value)


MAX_MODEL_CHARS = 200


def with_model(request, model, what):
    """The optional model= hint: a short str the host's callback may use to
    pick a sub-model (docs/api.md)."""
    if model is not None:
        if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_CHARS:
            raise TypeError(f"{what}: model= takes a str of 1 to {MAX_MODEL_CHARS} characters")
        request["model"] = model
    return request


def ask(prompt, model):
    """One llm_query call to the host: its answer."""
    if not isinstance(prompt, str):
        raise TypeError(f"llm_query() takes a str prompt, not {type(prompt).__name__}")
    request = with_model({"type": "llm_query", "prompt": prompt}, model, "llm_query()")
    return protocol.call(request, "the llm_query prompt")

# The answers a rolled-back block had received (step.run keeps them): the
# same call in a later block gets one back, once, instead of a sub-call.
MAX_KEPT, MAX_KEPT_CHARS = 1000, 16 << 20


def kept_answer(session, prompt, model):
    texts = session.kept.get((prompt, model)) if type(prompt) is str else None
    if not texts:
        return None
    text = texts.pop(0)
    session.kept_count -= 1
    session.kept_chars -= len(text)
    if not texts:
        del session.kept[(prompt, model)]
    return text


def keep_answers(session, paid):
    """A rolled-back step's answers, kept for the next steps (at most
    MAX_KEPT of MAX_KEPT_CHARS characters in all: past either the oldest
    go; the sandbox's memory is the run's). Returns how many."""
    for prompt, model, text in paid:
        session.kept.setdefault((prompt, model), []).append(text)
        session.kept_count += 1
        session.kept_chars += len(text)
    while session.kept_count > MAX_KEPT or session.kept_chars > MAX_KEPT_CHARS:
        key = next(iter(session.kept))
        kept_answer(session, *key)
    return len(paid)


def llm_query(prompt, model=None):
    session = state.current
    text = kept_answer(session, prompt, model) if session.kept else None
    if text is None:
        text = ask(prompt, model)
    session.paid.append((prompt, model, text))
    return text


def llm_query_batched(prompts, model=None):
    prompts = str_list(prompts, "llm_query_batched()")
    session = state.current
    answers = [kept_answer(session, p, model) if session.kept else None for p in prompts]
    asked = [p for p, a in zip(prompts, answers) if a is None]
    request = with_model({"type": "llm_batch", "prompts": asked}, model, "llm_query_batched()")
    if asked:
        fresh = iter(protocol.call_batch(request, len(asked), "the llm_query_batched prompts together"))
        answers = [next(fresh) if a is None else a for a in answers]
    for prompt, answer in zip(prompts, answers):
        if isinstance(answer, str) and not isinstance(answer, SubCallError):
            session.paid.append((prompt, model, answer))
    return answers


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
            query["context"] = codec.dumps(context)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{what}: context must be a str or JSON-able (dict, list, ...): "
                            f"{exc}") from None
        problem, _ = exactness_problem(context, 1024)  # Python to Python: only the keys matter
        if problem is not None:
            raise ValueError(f"{what}: context: {problem}")
        query["format"] = "json"
    return query


def rlm_query(prompt, context=None):
    request = sub_session(prompt, context, "rlm_query()")
    request["type"] = "rlm_query"
    return protocol.call(request, "the rlm_query prompt and context")


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
    return protocol.call_batch({"type": "rlm_batch", "queries": queries}, len(queries),
                               "the rlm_query_batched prompts and contexts together")


# The listing of the REPL's variables (SHOW_VARS, and the host's list_vars
# at a compaction): at most LISTED_VARS of them, names and type names cut to
# LISTED_CHARS characters. Made without running any of the REPL's code: a
# type's name read by type's own getter (a metaclass may make __name__
# anything), a length only of the built-in containers themselves (a
# subclass's __len__ is the REPL's), text copied out of a str subclass.
LISTED_VARS = 100
LISTED_CHARS = 100
_type_name = type.__dict__["__name__"].__get__
_SIZED = frozenset(id(t) for t in (str, bytes, list, tuple, dict, set))


def _plain(text):
    return "".join((text,))[:LISTED_CHARS]  # an exact str, whatever subclass text is


def var_listing(namespace):
    """The REPL's variables as [name, type name, len or None] lists, in
    order, and how many more there are (past LISTED_VARS, or names that are
    not a str)."""
    reserved = names()
    listed, more = [], 0
    for key, value in list(namespace.items()):
        if type(key) is not str or key.startswith("_") or key in reserved:
            more += type(key) is not str
            continue
        if len(listed) == LISTED_VARS:
            more += 1
            continue
        kind = type(value)
        size = len(value) if id(kind) in _SIZED else None
        listed.append([_plain(key), _plain(_type_name(kind)), size])
    return listed, more


def list_vars(message):
    """The host's list_vars (a compaction's listing): fixed driver code, so
    the REPL's SHOW_VARS, rebound or not, is never what the host reads."""
    listed, more = var_listing(state.current.namespace)
    return {"type": "vars", "id": message.get("id"), "vars": listed, "more": more}


def SHOW_VARS():
    """Prints the REPL's variables, a line each: name, type and size (the
    reference's prompt advertises it)."""
    listed, more = var_listing(state.current.namespace)
    if not listed and not more:
        print("(no variables yet; the REPL's own names: context, llm_query, llm_query_batched, "
              "rlm_query, rlm_query_batched, FINAL, FINAL_VAR, answer)")
    for key, kind, size in listed:
        print(f"{key}: {kind}" + ("" if size is None else f", len {size}"))
    if more:
        print(f"(and {more} more)")


def names():
    """What a fresh REPL namespace holds."""
    return {
        "context": None,
        "answer": {"content": "", "ready": False},
        "FINAL": FINAL,
        "FINAL_VAR": FINAL_VAR,
        "llm_query": llm_query,
        "llm_query_batched": llm_query_batched,
        "rlm_query": rlm_query,
        "rlm_query_batched": rlm_query_batched,
        "SubCallError": SubCallError,
        "SHOW_VARS": SHOW_VARS,
    }
