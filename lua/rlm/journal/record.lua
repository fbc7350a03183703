-- The journal's records (docs/durability.md, "What is recorded"): what a
-- resume needs, as entries of one session's keys:
--
--   <id>.lease        the lease (rlm.journal.lease)
--   <id>.head         where the run is: its sequence number, the steps
--                     done, the budgets spent and the counts, where its
--                     sandbox is; rewritten at every step boundary
--   <id>.step.<n>     step n, done: the messages it added to the
--                     conversation and the answers its code received, in
--                     order; written once, at its end
--   <id>.call.<n>.<k> the k-th answer (a root reply, a sub-call's, a tool
--                     call's) received in step n while it is in flight,
--                     written as it arrives; step n's entry holds them all
--                     once it is written, and they are deleted then
--
-- Each entry is a JSON object (rlm.base.json: numbers exact) with v, the
-- version of this layout, kind ("head", "step", "call") and seq: every
-- write of a session's journal carries the next number, so that a resume
-- can tell the latest of what it reads.
local json = require("rlm.base.json")
local store = require("rlm.journal.store")

local M = {}

M.VERSION = 1

function M.head_key(id)
  return id .. ".head"
end

function M.step_key(id, n)
  return ("%s.step.%d"):format(id, n)
end

function M.call_key(id, n, k)
  return ("%s.call.%d.%d"):format(id, n, k)
end

-- Every kind's fields: name = the Lua type it must be ("table" for an
-- object or a list; "string?" may be absent). encode and decode both hold
-- a record to it, so that what one writes the other reads.
M.FIELDS = {
  head = {
    id = "string", seq = "number", steps = "number", created = "number", updated = "number",
    -- the tree's spending and the session's counts: iterations, sub_calls,
    -- batches, tool_calls, cache_hits, compactions, tokens = { input,
    -- output, total }, cost_usd, wall_ms
    counts = "table",
    -- where the REPL lives, once it stands at this head's step boundary
    -- (SUBFIELDS.head.sandbox), or absent: a resume replays then
    sandbox = "table?",
    -- the options a resume must find the same (a digest of them)
    options = "string?",
    -- the driver's seeds: { hash = its PYTHONHASHSEED, random = what its
    -- `random` is seeded with }, so that a replay's driver gets the same
    seeds = "table?",
  },
  step = {
    seq = "number", n = "number",
    -- the messages the step added to the conversation, in order: { role =,
    -- content = }
    messages = "table",
    -- the answers the step's code received, in the order they came: { k =,
    -- via = "llm" | "tool" | "root", call = (a SHA-256 of what was asked,
    -- so that a replay can tell it asks the same), text = | error = }
    calls = "table",
    final = "table?",
    -- a SHA-256 of what the step's code printed (its output and error): a
    -- replay that prints otherwise is told by it
    digest = "string?",
  },
  call = {
    seq = "number", n = "number", k = "number", via = "string", call = "string",
    text = "string?", error = "string?",
    -- the callback's usage, so that the tokens a resume counts are the run's
    usage = "table?",
  },
}

-- The fields of a record's table fields, held to them as the record's
-- own are: kind = { field = { name = type } }.
M.SUBFIELDS = {
  head = {
    -- A keeper that lingers (the exec backend's `sandbox.linger_ms`;
    -- docs/protocol.md, "Lingering"), its REPL at this head's step
    -- boundary: the backend ("exec"), the keeper's linger id, the token
    -- that lets an attach in, the fence it took last, the keeper's lines
    -- the host had taken then (`seen`: an attach's replay starts there),
    -- the driver lines the host had sent (`sent`: an attach's `taken`
    -- past it says how many of the step in flight's arrived) and the last
    -- exec's id (the step in flight's results carry the next)
    sandbox = { backend = "string", id = "string", token = "string", fence = "number", seen = "number",
      sent = "number", exec = "number" },
  },
}

local function check_fields(fields, t, what, prefix)
  for name, want in pairs(fields) do
    local optional = want:sub(-1) == "?"
    local base = optional and want:sub(1, -2) or want
    local v = t[name]
    if not (v == nil and optional) and type(v) ~= base then
      return ("field %s%s must be a %s, not %s"):format(prefix, name, base, type(v))
    end
  end
  for name in pairs(t) do
    if not fields[name] and not (prefix == "" and (name == "v" or name == "kind")) then
      return ("no field %s%s in a %s"):format(prefix, tostring(name), what)
    end
  end
end

local function check(kind, t)
  local fields = M.FIELDS[kind]
  if not fields then
    return ("no record kind %s"):format(tostring(kind))
  end
  local why = check_fields(fields, t, kind .. " record", "")
  if why then
    return why
  end
  for name, sub in pairs(M.SUBFIELDS[kind] or {}) do
    if t[name] ~= nil then
      why = check_fields(sub, t[name], kind .. " record", name .. ".")
      if why then
        return why
      end
    end
  end
end

-- The text of record t of kind: misuse (a field missing or unknown)
-- raises, naming it.
function M.encode(kind, t)
  local why = check(kind, t)
  if why then
    error("rlm.journal: record: " .. why, 2)
  end
  local out = { v = M.VERSION, kind = kind }
  for k, v in pairs(t) do
    out[k] = v
  end
  return json.encode(out)
end

-- The record of kind in text, or nil, err (journal_error: not JSON, of
-- another version or kind, or with a field missing or wrong).
function M.decode(kind, text)
  local ok, t = pcall(json.decode, text)
  if not ok or type(t) ~= "table" then
    return nil, store.error("journal_error", ("a %s record that is not a JSON object"):format(kind))
  end
  if t.v ~= M.VERSION then
    return nil, store.error("journal_error", ("a %s record of version %s: this rlm reads version %d"):format(kind,
      tostring(t.v), M.VERSION), { version = t.v })
  end
  if t.kind ~= kind then
    return nil, store.error("journal_error", ("a %s record where a %s was expected"):format(tostring(t.kind), kind))
  end
  t.v, t.kind = nil, nil
  local why = check(kind, t)
  if why then
    return nil, store.error("journal_error", "a " .. kind .. " record: " .. why)
  end
  return t
end

return M
