-- rlm: Recursive Language Model sessions for Lua. The root model writes
-- Python that runs in a sandboxed REPL holding `context`; see docs/api.md.
--
-- A session is an engine (a coroutine of ours, rlm.engine.loop) that never
-- calls a model itself: it hands out requests through poll() and takes the
-- answers back through reply(). run() and step() are small loops over
-- poll() (rlm.drive.blocking); the adapters in rlm.adapters drive the same
-- engine from an event loop. This file is the public API; the session and
-- its collaborators live in lua/rlm/engine/ (docs/architecture.md, "Who
-- owns what"), the loops in lua/rlm/drive/.
local core = require("rlm.core")
local dispatch = require("rlm.drive.dispatch")
local options = require("rlm.engine.options")
local prompt = require("rlm.engine.prompt")
local json = require("rlm.base.json")
local journal = require("rlm.engine.journal")
local reattach = require("rlm.engine.reattach")
local session = require("rlm.engine.session")
local Session, new_session = session.Session, session.new_session

local rlm = { _VERSION = "rlm " .. require("rlm.base.version"), null = json.null }
rlm.Session = Session
-- run() and step(): the loops over poll() on the calling thread.
for k, fn in pairs(require("rlm.drive.blocking")) do
  assert(Session[k] == nil, k)
  Session[k] = fn
end
local Pool = require("rlm.sandbox.pool")
rlm.Pool = Pool

-- rlm.Pool.new{ size = N, <sandbox options> } -> Pool. Raises on misuse,
-- naming the option; returns nil, err when the sandbox cannot be prepared.
function Pool.new(opts)
  local o, size = options.check_pool(opts, Pool.MAX_SIZE)
  return Pool.open(o, size)
end

-- The allocator keeps what the sessions freed (glibc: free chunks inside
-- its heaps, resident), until a trim gives the free pages back: rlm.core's
-- trim_token does when it is collected, after the sessions it stands for
-- (their teardowns trim too: csrc/keeper.c). Weak: the token pending, if
-- any. Where tables have finalizers (Lua 5.2 on), Session.__gc makes it,
-- so that it goes in the next collection, the one that frees what the
-- finalized sessions held; elsewhere (5.1, LuaJIT) the sessions made
-- meanwhile share one, which goes in the collection that frees the last.
local trim_pending = setmetatable({}, { __mode = "v" })
local TABLE_GC = _VERSION ~= "Lua 5.1"

local function trim_token()
  local token = trim_pending[1] or core.trim_token()
  trim_pending[1] = token
  return token
end

-- The context as it is sent: its text, its format and what the prompt
-- says it is.
local function context_of(o, where)
  if type(o.context) == "string" then
    return o.context, "text", prompt.describe(o.context)
  end
  local ok, encoded = pcall(json.encode, o.context)
  if not ok then
    error(where .. ": option 'context' cannot be sent as JSON: " .. tostring(encoded), 3)
  end
  return encoded, "json", prompt.describe(o.context)
end

local function made(s)
  if not TABLE_GC then
    s.trim_token = trim_token()
  end
  return s
end

function Session.new(opts)
  local o = options.check(opts)
  local data, format, description = context_of(o, "rlm.Session.new")
  local s = new_session(o, nil, data, format, description)
  if o.journal then
    s.journal = journal.new(s, o.journal, journal.digest(o.query, format, data))
  end
  return made(s)
end

-- rlm.Session.resume(id, opts): the session recorded under id in
-- opts.journal, to be driven on from where its run was (docs/durability.md);
-- opts as for new, the same query and context. nil, err (lease_held,
-- journal_error, context_mismatch) when it cannot be. Calls the store
-- itself: where the caller may yield, the store may.
function Session.resume(id, opts)
  if type(id) ~= "string" then
    error("rlm.Session.resume: id must be a string (session:journal_id()), not " .. type(id), 2)
  end
  local o = options.check(opts)
  if not o.journal then
    error("rlm.Session.resume: option 'journal' is required: the store the run was recorded in", 2)
  end
  local data, format, description = context_of(o, "rlm.Session.resume")
  local state, err = journal.load(o.journal, id, journal.digest(o.query, format, data))
  if not state then
    return nil, err
  end
  local s = new_session(o, nil, data, format, description)
  -- In the run's lingering sandbox when it can be reached, else a replay
  -- in a fresh one (docs/durability.md, "Resume").
  local attached = reattach.attach(s, state)
  s.journal = journal.resumed(s, o.journal, state, attached)
  return made(s)
end

-- The session's id in its journal, or nil without option journal.
function Session:journal_id()
  return self.journal and self.journal.id
end

-- How much of an earlier answer the summary of a follow-up shows.
local SUMMARY_ANSWER_CHARS = 1000

-- Turns a finished session toward a follow-up question: a new root
-- conversation in the same REPL, opened with a short summary of the earlier
-- ones. History, counters and budgets carry on. Raises on misuse.
function Session:follow_up(question)
  if type(question) ~= "string" or question == "" then
    error("rlm: ask(question) takes a non-empty string", 3)
  end
  if not (self.terminal and self.terminal.type == "done") then
    error("rlm: ask() follows a run that gave its answer (run() first)", 3)
  end
  self.conversation:next_question(question, SUMMARY_ANSWER_CHARS)
  self.terminal = nil
end

-- A follow-up question after run(): see follow_up. Returns what run() does.
function Session:ask(question)
  self:follow_up(question)
  return self:run()
end

-- Kills the sandbox (its /session goes with it). Safe to call more than
-- once. From a finalizer (collected) it starts no process: the pool is owed
-- the sandbox this session took, and its next take starts it (rlm.sandbox.pool).
local function close(self, collected)
  self.closed = true
  local sandbox = self.sandbox
  if sandbox.refill then
    sandbox:refill_pool(collected)
  end
  self.nested:end_all()
  self.scheduler:drop_all()
  sandbox:teardown()
  sandbox:sweep_pool()
  if self.journal and not collected then
    self.journal:discard() -- closed: its entries go (dropped unclosed, they wait for a resume)
  end
  -- A loop that watches fd() lets go of it first, then closes it.
  if not dispatch.closing(self) then
    self.engine:close_waitset()
  end
end

function Session:close()
  close(self, false)
end

-- A handle's usual name for it (vim.system's kill, resty.run's handle).
Session.cancel = Session.close

Session.__close = Session.close

function Session.__gc(self)
  close(self, true)
  trim_token() -- held by nothing: it goes in the next collection
end

return rlm
