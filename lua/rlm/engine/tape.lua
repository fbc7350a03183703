-- What a resume reads of a session's journal (rlm.engine.journal keeps
-- it): the lease taken first, the head, the steps' recorded answers (the
-- tape a replay answers from) and the answers of the step in flight; the
-- hash a recorded call is matched by; and a store's error as a run's.
local core = require("rlm.core")
local errors = require("rlm.base.errors")
local json = require("rlm.base.json")
local journal = require("rlm.journal")
local jstore = require("rlm.journal.store")
local util = require("rlm.base.util")

local M = {}

-- A run's error of the journal's kinds (lease_held, lease_lost,
-- journal_error) from a store error.
function M.run_error(e)
  if type(e) == "table" and errors.kinds[e.kind] then
    return errors.new(e.kind, e.message, { owner = e.owner, fence = e.fence })
  end
  return errors.new("journal_error", tostring(e))
end

-- What was asked, as a SHA-256: a replay tells by it that it asks the same.
function M.call_hash(req)
  if req.type == "root_llm" then
    local m = req.messages
    local last = m[#m]
    return core.sha256_hex(("root:%d:%s:"):format(#m, last and last.role or "") .. (last and last.content or ""))
  elseif req.type == "tool_call" then
    local keys, kw = {}, req.kwargs or {}
    for k in pairs(kw) do
      keys[#keys + 1] = k
    end
    table.sort(keys)
    local named = {}
    for i, k in ipairs(keys) do
      named[i] = { k, kw[k] }
    end
    local ok, text = pcall(json.encode, { req.positional or {}, named })
    return core.sha256_hex("tool:" .. req.name .. ":" .. (ok and text or "?"))
  end
  return core.sha256_hex(("llm:%d:%s:"):format(#(req.model or ""), req.model or "") .. req.prompt)
end

-- Whether reply r is an answer the journal records: any but a failed call
-- of the root session's own turn (not a compaction's), which is asked
-- again (a resumable error): a replay must get the answer that came then.
function M.is_answer(r)
  local req = r.request
  return not (req.type == "root_llm" and req.depth == 0 and not req.compaction
    and (r.failed or type(r.text) ~= "string"))
end

-- What a resume reads, with the lease taken first (Session.resume calls
-- the store itself: where its caller may yield, the store may). Returns
-- the state for resumed (done: step n -> its record, which a re-attach
-- rebuilds the conversation from), or nil, err (lease_held,
-- journal_error, context_mismatch).
function M.load(o, id, digest)
  local owner = o.owner or ("rlm-" .. assert(util.random_hex(8)))
  local lease, err = journal.lease(o.store, id, owner, { ttl = o.lease_ttl })
  if not lease then
    return nil, M.run_error(err)
  end
  local function fail(e)
    lease:release()
    return nil, e
  end
  local text
  text, err = jstore.call(o.store, "get", journal.head_key(id))
  if err then
    return fail(M.run_error(err))
  elseif text == nil then
    lease:drop({}) -- no session: no lease of it left behind either
    return nil, (errors.new("journal_error", ("no journal of session %s: expired, deleted (its run ended) or "
      .. "never written"):format(id)))
  end
  local head
  head, err = journal.decode("head", text)
  if not head then
    return fail(M.run_error(err))
  end
  if not require("rlm.engine.seeds").ok(head.seeds) then
    return fail(errors.new("journal_error", ("session %s's head holds seeds that are not two integers 1 to "
      .. "2^32 - 1"):format(id)))
  end
  if head.options ~= digest then
    return fail(errors.new("context_mismatch", ("session %s was recorded with another query or context "
      .. "(their SHA-256 differs): give the same ones to resume it"):format(id)))
  end
  local tape, digests, done, seq = {}, {}, {}, head.seq
  for n = 1, head.steps do
    text, err = jstore.call(o.store, "get", journal.step_key(id, n))
    local step = text and journal.decode("step", text)
    if not step then
      return fail(err and M.run_error(err) or errors.new("journal_error", ("session %s's step %d is missing or "
        .. "unreadable"):format(id, n), { step = n }))
    end
    tape[n], digests[n], done[n], seq = step.calls, step.digest, step, math.max(seq, step.seq)
  end
  local n, flight = head.steps + 1, {}
  while true do
    text, err = jstore.call(o.store, "get", journal.call_key(id, n, #flight + 1))
    if err then
      return fail(M.run_error(err))
    end
    local call = text and journal.decode("call", text)
    if not call then
      break
    end
    flight[#flight + 1], seq = call, math.max(seq, call.seq)
  end
  tape[n] = flight
  return { lease = lease, owner = owner, id = id, head = head, tape = tape, digests = digests, done = done, seq = seq }
end

return M
