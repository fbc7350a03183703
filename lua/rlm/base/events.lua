-- The events a session gives its on_event callback (docs/api.md, "Events";
-- docs/log.md): each type named once, with the fields it may carry. Every
-- emitter's event passes through check (rlm.engine.session's _emit, and
-- the one event emitted outside a run: rlm.engine.claim's), so that an
-- event of a type or with a field not listed here is a programming error,
-- raised where it is made; spec/events_spec.lua holds the emitters' code
-- and both documents to this list.
local M = {}

-- What every event has besides its own fields (Session:_emit sets them).
M.COMMON = { "depth", "session" }

-- In the order a run gives them (docs/api.md's table).
M.TYPES = {
  { "session_start", "query", "journal_id", "resumed" },
  { "sandbox_ready", "start", "backend", "mode", "detail", "not_promised", "container" },
  { "sandbox_release_failed", "message" },
  { "step_start", "step" },
  { "root_delta", "step", "text" },
  { "root_response", "step", "response", "latency_ms", "usage", "compaction", "fallback" },
  { "sub_query", "step", "index", "prompt", "response", "error", "latency_ms", "usage", "batch_id",
    "batch_index", "batch_size", "recursive", "iterations", "error_kind", "cached", "cache_hit" },
  { "exec_result", "step", "block", "code", "stdout", "error" },
  { "interrupt", "step", "timeout_ms", "grace_ms" },
  { "final", "step", "kind", "answer", "source", "partial", "reason" },
  { "tool_call", "step", "name", "args", "result", "error", "latency_ms", "index" },
  { "answer_rejected", "step", "answer", "reason" },
  { "compaction", "step", "index", "turns", "first_turn", "last_turn", "kept_turns", "bytes_before",
    "bytes_after", "tokens_before", "tokens_after", "at_tokens", "summary", "summary_error", "usage",
    "vars", "latency_ms" },
  { "run_end", "ok", "answer", "error_kind", "error_message", "iterations", "sub_calls", "tokens",
    "cache_hits", "compactions" },
}

-- type -> { field = true }, the common ones included.
M.FIELDS = {}
for _, row in ipairs(M.TYPES) do
  local fields = {}
  for i = 2, #row do
    fields[row[i]] = true
  end
  for _, name in ipairs(M.COMMON) do
    fields[name] = true
  end
  M.FIELDS[row[1]] = fields
end

-- ev, when its type is one of M.TYPES and its fields are that type's;
-- else raises, naming what is not.
function M.check(ev)
  local fields = M.FIELDS[ev.type]
  if not fields then
    error(("rlm.base.events: unknown event type %s"):format(tostring(ev.type)), 2)
  end
  for k in pairs(ev) do
    if k ~= "type" and not fields[k] then
      error(("rlm.base.events: a %s event has no field %s"):format(ev.type, tostring(k)), 2)
    end
  end
  return ev
end

return M
