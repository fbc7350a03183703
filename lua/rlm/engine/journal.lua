-- A session's journal, its collaborator when option journal is given
-- (docs/durability.md): the root session's record of what a resume needs,
-- written ahead. Every answer the tree receives (a root reply, an
-- llm_query's, a tool's) is in the store before the engine hands it to the
-- conversation or the driver (took, from rlm.engine.loop's wait); each
-- step's end writes the step, the head and the lease's renewal (step_done).
-- A store's methods may yield, so the engine never calls them: each write
-- goes out of poll() as a `journal` request, run where the host runs
-- callbacks (start, from rlm.drive.dispatch), and the engine waits for its
-- reply before it goes on. A resumed session (load, then resumed) runs its
-- conversation again from the first turn in a fresh sandbox, every call
-- answered from the recorded ones (answer, from the scheduler's request)
-- until the recorded answers are spent; or, attached to the run's keeper
-- that lingers (rlm.engine.reattach), the step in flight alone.
local core = require("rlm.core")
local errors = require("rlm.base.errors")
local json = require("rlm.base.json")
local journal = require("rlm.journal")
local util = require("rlm.base.util")
local IDLE = require("rlm.engine.loop").IDLE
local renewal = require("rlm.engine.renewal")
local reattach = require("rlm.engine.reattach")
local seeds = require("rlm.engine.seeds")
local tapes = require("rlm.engine.tape")
local call_hash, run_error = tapes.call_hash, tapes.run_error

---@class Journal
---@field session Session the root session it records
---@field store table the host's store
---@field owner string who holds the lease (option journal.owner, or made here)
---@field lease_ttl integer the lease's seconds (option journal.lease_ttl)
---@field lease table|nil the lease (rlm.journal.lease), from the run's start or the resume
---@field id string the session's id in the journal
---@field digest string a SHA-256 of the query and the context: a resume must give the same
---@field seq integer the last write's sequence number
---@field steps integer the steps recorded done
---@field created number when the journal began (os.time)
---@field calls table the answers of the step in flight, in the order taken
---@field tape table|nil step n -> its recorded answers, for a resume's replay
---@field tape_steps integer the steps a resume runs again, recorded done
---@field digests table step n -> the SHA-256 of its output, as recorded
---@field ended boolean|nil its entries are deleted (the run gave its answer, or close())
---@field seeds table|nil the driver's { hash =, random = } seeds, chosen at its start, kept in the head
---@field renewal Renewal the lease's renewal on a timer (rlm.engine.renewal)
---@field writing boolean|nil a write's request is out (run): no renewal goes out meanwhile
---@field on_divergence string "error" or "continue" (option journal.on_divergence)
---@field diverged table|nil the first divergence a "continue" replay went past: { kind =, message =, step = }
---@field resumed string|nil how a resume went on: "attach" (in the keeper's REPL) or "replay" (in a fresh one)
local Journal = {}
Journal.__index = Journal

local M = {}

-- The answers recorded, by the request's type, and their `via`.
local VIA = { root_llm = "root", llm_query = "llm", tool_call = "tool" }

-- What a resume must give again: a SHA-256 of the query, the context's
-- format and the context as sent.
function M.digest(query, format, data)
  return core.sha256_hex(("%d:%s:%s:"):format(#(query or ""), query or "", format) .. data)
end

local function new(s, o, id, digest, resumed)
  return setmetatable({ session = s, store = o.store, owner = o.owner or ("rlm-" .. assert(util.random_hex(8))),
    lease_ttl = o.lease_ttl, id = id, digest = digest, seq = 0, steps = 0, created = os.time(), calls = {},
    tape_steps = 0, digests = {}, seeds = seeds.new(), renewal = renewal.new(),
    on_divergence = o.on_divergence or "error", resumed = resumed }, Journal)
end

-- A new session's journal: its id and its driver's seeds now, its lease
-- at the run's start.
function M.new(s, o, digest)
  return new(s, o, assert(util.random_hex(16)), digest)
end

-- What a resume reads, the lease taken first (rlm.engine.tape).
M.load = tapes.load

-- A resumed session's journal, from load's state; attached: its keeper's
-- REPL was reached (rlm.engine.reattach), and only the step in flight is
-- answered from the tape.
function M.resumed(s, o, state, attached)
  local j = new(s, o, state.id, state.head.options, attached and "attach" or "replay")
  j.owner, j.lease, j.seq = state.owner, state.lease, state.seq
  j.steps, j.created, j.tape, j.tape_steps, j.digests = state.head.steps, state.head.created, state.tape,
    state.head.steps, state.digests
  j.seeds = state.head.seeds -- the run's, or none (a journal of before them)
  j.renewal:renewed(j)
  if attached then
    j.tape, j.tape_steps = { [j.steps + 1] = state.tape[j.steps + 1] }, 0
  end
  return j
end

-- The store's calls, where the host runs callbacks ------------------------

-- Runs fn (store calls, which may yield) out of poll() and waits for it:
-- true, or nil, err when the session ended with the store's error (soft:
-- the error is returned, the session goes on).
function Journal:run(fn, soft)
  local s = self.session
  local settled, serr = self.renewal:settle(self)
  if not settled then
    return nil, serr
  end
  local req = { type = "journal", depth = 0 }
  -- The request holds its outcome: a host's own loop calls run() and
  -- replies, as for a cache_set.
  req.run = function()
    local ok, err = fn()
    req.box = { ok, err }
    return true
  end
  s.scheduler:request(req)
  self.writing = true
  while not req.done do
    if s.failed or s.closed then
      self.writing = nil
      return nil, s.failed
    end
    coroutine.yield(IDLE)
  end
  self.writing = nil
  local box = req.box
  if type(box) ~= "table" or not box[1] then
    local err = run_error(type(box) == "table" and box[2] or box)
    if soft then
      return nil, err
    end
    return s:_fail(err)
  end
  return true
end

-- rlm.drive.dispatch: a journal request ev of session s, run the host's
-- way (start: at once, or in a coroutine of its own under an adapter).
function M.start(s, ev, start)
  start(ev.run, nil, function(ok, why)
    if not ok then
      ev.box = { nil, why } -- it raised
    end
    s:reply(ev.id, "")
  end)
end

function Journal:next_seq()
  self.seq = self.seq + 1
  return self.seq
end

function Journal:head_text()
  local s = self.session
  local tree, tokens = s.tree, s.tree.tokens
  return journal.encode("head", { id = self.id, seq = self:next_seq(), steps = self.steps, created = self.created,
    updated = os.time(), options = self.digest, sandbox = reattach.record(s),
    counts = { iterations = s.conversation.iterations, sub_calls = tree.sub_calls, batches = tree.batches,
      tool_calls = tree.tool_calls, tokens = { input = tokens.input, output = tokens.output, total = tokens.total } },
    seeds = self.seeds })
end

-- The run's start: the lease, then the head (a resumed session holds its
-- lease already).
function Journal:begin()
  if self.lease and not self.renewal.suspended then
    return true -- a resumed session's, or this run's (taken again after a resumable error)
  end
  local head = self:head_text()
  return self:run(function()
    local lease, err = journal.lease(self.store, self.id, self.owner, { ttl = self.lease_ttl })
    if not lease then
      return nil, err
    end
    self.lease = lease
    self.renewal:renewed(self)
    return lease:write(journal.head_key(self.id), head)
  end)
end

-- The step a call made or answered now belongs to: the root's turn in
-- flight (a run's first, whose call goes out as the sandbox starts, before
-- the turn counts itself).
function Journal:step_now()
  local s = self.session
  return s.starting and s.conversation.iterations + 1 or math.max(s.conversation.iterations, 1)
end

-- An answer the engine takes (reply r, of a session of the tree): in the
-- store before anyone reads it. true, or nil, err (the session ended).
function Journal:took(r)
  local req = r.request
  local via = VIA[req.type]
  if not via or self.ended or not self.lease or not tapes.is_answer(r) then
    return true
  end
  local rec = { k = #self.calls + 1, via = via, call = req.journal_call or call_hash(req) }
  if r.failed then
    rec.error = tostring(r.message)
  elseif via == "tool" then
    local ok, text = pcall(json.encode, { r.text })
    if ok then
      rec.text = text
    else
      rec.error = "the tool's value could not be recorded: " .. tostring(text)
    end
  elseif type(r.text) == "string" then
    rec.text = r.text
  else
    rec.error = "returned " .. type(r.text)
  end
  rec.usage = type(r.usage) == "table" and r.usage or nil
  self.calls[#self.calls + 1] = rec
  if r.replayed or self:replaying(self:step_now()) then
    return true -- recorded already; or a call past a divergence, which a replayed step's record has no room for
  end
  local n = self:step_now()
  local entry = { seq = self:next_seq(), n = n, k = rec.k, via = via, call = rec.call, text = rec.text,
    error = rec.error, usage = rec.usage }
  local ok, text = pcall(journal.encode, "call", entry)
  if not ok then
    return self.session:_fail(errors.new("journal_error", tostring(text)))
  end
  return self:run(function()
    return self.lease:write(journal.call_key(self.id, n, rec.k), text)
  end)
end

-- Whether step n is one a resume runs again (its events are not given
-- again, and step() does not stop at its end).
function Journal:replaying(n)
  return n >= 1 and n <= self.tape_steps
end

-- A request of a session of the tree, s, answered from the tape: the
-- reply, or nil (it goes out), or nil, err (a replayed step asked what
-- its record does not hold: the run ends, naming the step).
function Journal:answer(req)
  local via = VIA[req.type]
  if not via or self.ended then
    return nil
  end
  local hash = call_hash(req)
  req.journal_call = hash -- what was asked, before the conversation grows
  local tape = self.tape
  if not tape then
    return nil
  end
  local n = self:step_now()
  local calls = tape[n]
  for i, rec in ipairs(calls or {}) do
    if rec and rec.via == via and rec.call == hash then
      calls[i] = false -- used
      local r = { request = req, text = rec.text, usage = rec.usage, replayed = true, at = core.now_ms(), k = rec.k }
      if rec.error then
        r.failed, r.message, r.text = true, rec.error, nil
      elseif via == "tool" then
        local ok, v = pcall(json.decode, rec.text)
        r.text = ok and type(v) == "table" and v[1] or nil
      end
      return r
    end
  end
  if self:replaying(n) then
    return nil, select(2, self:diverge(n, ("the resume's replay of step %d asked a %s call that step's "
      .. "record does not hold: the code did not run as it did"):format(n, via)))
  end
  return nil
end

-- A replayed step n ran otherwise than its record (message says how):
-- nil, err (replay_diverged) to end the run naming it; or, with
-- on_divergence = "continue", true: the run goes on from the REPL the
-- replay made (a call the record does not hold goes out, unrecorded), and
-- its answer is marked partial (rlm.engine.turn's main).
function Journal:diverge(n, message)
  if self.on_divergence == "continue" then
    self.diverged = self.diverged or { kind = "replay_diverged", message = message, step = n }
    return true
  end
  return nil, errors.new("replay_diverged", message, { step = n })
end

-- Step n (the conversation's turn just done, entry its history entry)
-- ends: recorded, or (replayed) checked against its record. before: the
-- conversation's length before it. true, or nil, err.
function Journal:step_done(conversation, entry, before)
  local n = conversation.iterations
  local digest = core.sha256_hex((entry.stdout or "") .. "\0" .. tostring(entry.error or ""))
  local calls = self.calls
  self.calls = {}
  if self:replaying(n) then
    if self.digests[n] and self.digests[n] ~= digest then
      local ok, err = self:diverge(n, ("the resume's replay of step %d printed another output than the "
        .. "recorded run did (their SHA-256 differ)"):format(n))
      if not ok then
        return self.session:_fail(err)
      end
    end
    if n == self.tape_steps then
      self.tape[n] = nil
    end
    return true
  end
  if self.tape then
    self.tape = nil -- the answers recorded are spent: the run goes on live
  end
  if self.session.sandbox.skip_lines then
    return reattach.diverged(self.session, n)
  end
  if self.ended or not self.lease then
    return true
  end
  local added, messages = {}, conversation.messages
  for i = math.min(before, #messages) + 1, #messages do
    added[#added + 1] = { role = messages[i].role, content = messages[i].content }
  end
  self.steps = n
  local step = journal.encode("step", { seq = self:next_seq(), n = n, messages = added, calls = calls,
    digest = digest, final = entry.final and { answer = entry.final.answer, kind = entry.final.kind } or nil })
  local head = self:head_text()
  return self:run(function()
    local lease = self.lease
    local ok, err = lease:write(journal.step_key(self.id, n), step)
    if ok then
      ok, err = lease:write(journal.head_key(self.id), head)
    end
    for k = 1, #calls do
      if ok then
        ok, err = lease:delete(journal.call_key(self.id, n, k))
      end
    end
    if ok then
      ok, err = lease:renew()
    end
    if ok then
      self.renewal:renewed(self)
    end
    return ok, err
  end)
end

-- The head, now (rlm.engine.reattach: a sandbox that just started).
function Journal:write_head()
  local head = self:head_text()
  return self:run(function()
    return self.lease:write(journal.head_key(self.id), head)
  end)
end

-- Every entry of the session's, the lease's last.
function Journal:keys()
  local keys = { journal.head_key(self.id) }
  for n = 1, self.steps do
    keys[#keys + 1] = journal.step_key(self.id, n)
  end
  local n = self.steps + 1
  for k = 1, math.max(#self.calls, self.tape and self.tape[n] and #self.tape[n] or 0) do
    keys[#keys + 1] = journal.call_key(self.id, n, k)
  end
  return keys
end

-- The run gave its answer: the entries go (from the engine).
function Journal:finish()
  if self.ended or not self.lease then
    return true
  end
  self.ended = true
  local keys = self:keys()
  return self:run(function()
    return self.lease:drop(keys)
  end, true)
end

-- close(): the entries go now (where the host called it, which may yield
-- if the store does); a run that failed before it (a SIGINT too) or reported
-- a resumable error keeps them for a resume, its lease let go. Not from a
-- finalizer: a session dropped unclosed leaves both (the lease for its ttl).
function Journal:discard()
  if self.ended or not self.lease then
    return
  end
  self.ended = true
  local failed, released = self.session.failed, self.renewal.suspended
  util.call_protected(function()
    if failed and not released then
      self.lease:release()
    elseif not released then
      self.lease:drop(self:keys())
    end
  end)
end

return M
