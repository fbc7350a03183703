-- A session's sub-call scheduler, its collaborator (rlm.engine.session
-- creates it): the requests it hands out through poll() and the replies
-- that come back through reply(), the ids, the in-flight cap over the tree
-- (its Budgets), the requests passed on from its nested sessions, and the
-- driver's open call (the answers its code still waits for). The code's
-- llm_query, llm_query_batched, rlm_query and rlm_query_batched (budgets,
-- requests, and the answers back to the driver) are its methods from
-- rlm.engine.calls. What it needs of its session (failing, events, the
-- driver, nested sessions) it asks through the session's methods.
local core = require("rlm.core")

---@class Scheduler
---@field session Session the session it schedules for
---@field tree Budgets the tree's budgets (the session's)
---@field opts table the session's options
---@field outbox table requests and events not yet handed out by poll()
---@field inbox table replies not yet taken by the engine
---@field pending table id -> request handed out and not yet answered
---@field routes table id -> { child =, id = } for a request passed on from a child
---@field next_request_id integer the last request's id
---@field open_slots integer answers the driver still waits for, for its current call
---@field open_call integer|nil the id of the driver's current call
---@field open_tool boolean|nil that call is a tool's
local Scheduler = {}
Scheduler.__index = Scheduler

local M = {}

function M.new(session)
  return setmetatable({
    session = session,
    tree = session.tree,
    opts = session.opts,
    outbox = {},
    inbox = {},
    pending = {},
    routes = {},
    next_request_id = 0,
    open_slots = 0,
  }, Scheduler)
end

-- The queues ---------------------------------------------------------------

-- Hands a request to the outside world (through poll) and returns it.
-- Sub-calls count against max_concurrent_sub_calls over the whole tree of
-- sessions, whoever drives it.
function Scheduler:request(req)
  self.next_request_id = self.next_request_id + 1
  req.id = self.next_request_id
  local j = self.session.root.journal
  if j then
    -- A resume's replay: answered from the journal, not asked again.
    local r, err = j:answer(req)
    if r then
      req.t0 = r.at
      -- In the order they were taken (a batch's, as they came): a
      -- re-attached step sends them as it did (rlm.engine.reattach).
      local inbox, i = self.inbox, #self.inbox
      while i > 0 and r.k and inbox[i].k and inbox[i].k > r.k do
        i = i - 1
      end
      table.insert(inbox, i + 1, r)
      return req
    elseif err then
      self.session.root:_fail(err)
      return req
    end
  end
  if req.type == "llm_query" and not self.tree:admit(self, req) then
    return req -- held until one in flight answers
  end
  self:hand_out(req)
  return req
end

function Scheduler:hand_out(req)
  req.t0 = core.now_ms()
  self.pending[req.id] = req
  self.outbox[#self.outbox + 1] = req
end

-- An event for poll() (a step's end, a resumable error).
function Scheduler:post(ev)
  self.outbox[#self.outbox + 1] = ev
end

-- An event next_out gave that is not for this loop: first again.
function Scheduler:put_back(ev)
  table.insert(self.outbox, 1, ev)
end

-- A driver takes the session (rlm.drive.dispatch's claim): a root call
-- that a poll() of no driver's handed out and nobody answered goes out
-- again, to this driver. The run's first call goes out at the first poll()
-- (rlm.engine.opening), and a poll() that only started the sandbox, then
-- run(), would otherwise wait on an answer nobody gives. (A driver answers
-- each root call before it lets go: only such a poll() leaves one out.)
function Scheduler:reclaim()
  for _, req in pairs(self.pending) do
    if req.type == "root_llm" then
      local queued = false
      for _, ev in ipairs(self.outbox) do
        queued = queued or ev == req
      end
      if not queued then
        table.insert(self.outbox, 1, req)
      end
    end
  end
end

-- Something waits in the outbox.
function Scheduler:has_out()
  return self.outbox[1] ~= nil
end

-- Something waits for poll() or for the engine.
function Scheduler:has_work()
  return self.outbox[1] ~= nil or self.inbox[1] ~= nil
end

-- The next reply for the engine, or nil.
function Scheduler:take_reply()
  return self.inbox[1] and table.remove(self.inbox, 1)
end

-- The reply to request req, taken out of the inbox wherever it is, or nil:
-- the start's wait for its sandbox claim (rlm.engine.claim), which the
-- reply to the root model's first call may come before.
function Scheduler:take_reply_to(req)
  for i, r in ipairs(self.inbox) do
    if r.request == req then
      return table.remove(self.inbox, i)
    end
  end
end

-- A request given up (a root call past root_timeout_ms): its late reply is
-- dropped.
function Scheduler:forget(id)
  self.pending[id] = nil
end

-- A counted sub-call is over: the next held one, of any session of the
-- tree, goes out.
function Scheduler:release()
  local scheduler, req = self.tree:release()
  if scheduler then
    scheduler:hand_out(req)
  end
end

-- Forgets the sub-calls this session has held back.
function Scheduler:drop_held()
  for _, h in ipairs(self.tree.held) do
    if h.scheduler == self then
      self:unflight(h.req)
    end
  end
  self.tree:drop_held(self)
end

-- Forgets every request this session has out or held (its run ended), so
-- that they stop counting.
function Scheduler:drop_all()
  self:drop_held()
  for _, req in pairs(self.pending) do
    if req.counted then
      req.counted = nil
      self:release()
    end
    self:unflight(req)
  end
  for _, r in ipairs(self.inbox) do
    -- Answered, but no longer taken: what waits on it goes on.
    self:unflight(r.request)
    local dropped = r.request.dropped
    if dropped then
      r.request.dropped = nil -- once: a second close() drops again
      dropped(r)
    end
  end
  self.outbox, self.pending, self.routes = {}, {}, {}
end

-- Whether request id is still wanted: not answered, and (passed on from a
-- child) the child has not ended.
function Scheduler:wants(id)
  local route = self.routes[id]
  return self.pending[id] ~= nil and (not route or route.child.scheduler:wants(route.id))
end

-- The session that asked for request id: this one, or (a request passed
-- on from a child) the child that asked, through the routes.
function Scheduler:origin(id)
  local scheduler = self
  local route = scheduler.routes[id]
  while route do
    scheduler, id = route.child.scheduler, route.id
    route = scheduler.routes[id]
  end
  return scheduler.session
end

-- The next event for the outside, leaving out the requests of children
-- that ended before they were handed out.
function Scheduler:next_out()
  local outbox = self.outbox
  while true do
    local ev = table.remove(outbox, 1)
    if not ev or not ev.id or self:wants(ev.id) then
      return ev
    end
    self.pending[ev.id], self.routes[ev.id] = nil, nil
  end
end

-- The rest of a batch whose first request poll() just handed out: the
-- requests of the same batch that are out now, in order (they sit together
-- in the outbox). rlm.dispatch gives them to llm_query_batch in one call.
function Scheduler:batch_rest(first)
  local rest, outbox = {}, self.outbox
  while outbox[1] and outbox[1].batch_id == first.batch_id and outbox[1].type == "llm_query" do
    local ev = self:next_out()
    if not ev then
      break
    end
    rest[#rest + 1] = ev
  end
  return rest
end

-- Hands a child's request out as this session's own, with a new id.
function Scheduler:forward(child, ev)
  local req = {}
  for k, v in pairs(ev) do
    req[k] = v
  end
  self.next_request_id = self.next_request_id + 1
  req.id, req.counted = self.next_request_id, nil
  self.routes[req.id] = { child = child, id = ev.id }
  self:hand_out(req)
end

-- The answer to a request poll() handed out (the session's reply()): true,
-- false when it is no longer wanted (the run ended, the session was
-- closed, the exec it belonged to is over, or it was answered already),
-- nil when poll() never handed it out.
function Scheduler:reply(id, text, usage)
  local req = self.pending[id]
  if not req then
    if type(id) == "number" and id >= 1 and id <= self.next_request_id and id == math.floor(id) then
      return false
    end
    return nil
  end
  self.pending[id] = nil
  if req.type == "journal" then
    req.done = true -- its outcome is in req.box (rlm.engine.journal's start)
    return true
  end
  local route = self.routes[id]
  if route then
    -- A child's request: the answer is the child's, unless it has ended.
    self.routes[id] = nil
    if route.child.scheduler.pending[route.id] ~= nil then
      route.child:reply(route.id, text, usage)
    end
    return true
  end
  if req.counted then
    req.counted = nil
    self:release()
  end
  local r = { request = req, text = text, usage = usage }
  if req.type == "root_llm" then
    -- Its latency (root_response): a first call's reply waits for the start.
    r.at = core.now_ms()
  end
  if text == nil and type(usage) == "string" then
    r.failed, r.message, r.usage = true, usage, nil
  end
  self.inbox[#self.inbox + 1] = r
  return true
end

-- The driver's open call ------------------------------------------------------

-- The driver waits for the answers of a call it made: it may not make another.
function Scheduler:busy()
  return self.open_slots > 0
end

-- The driver made a call that waits for `slots` answers (a tool's: `tool`).
function Scheduler:open(id, slots, tool)
  self.open_slots, self.open_call, self.open_tool = slots, id, tool
end

-- The call's answers are all sent (a tool's one, or the rest of a batch).
function Scheduler:close_open()
  self.open_slots = 0
end

-- An exec begins: no call is open.
function Scheduler:exec_started()
  self.open_call = nil
end

-- An exec ended (a hostile driver may end one with calls still out): no
-- call is open, and what it held back is dropped.
function Scheduler:exec_ended()
  self.open_slots = 0
  self:drop_held()
end

-- The step ran out of time: the open call, if any, as the message that
-- answers it with `interrupted` (the session sends it), or nil.
function Scheduler:interrupt_open()
  if self.open_slots > 0 and self.open_call then
    self.open_slots = 0
    return { type = self.open_tool and "tool_result" or "llm_result", id = self.open_call, interrupted = true }
  end
end

-- The code's calls (rlm.engine.calls): the one path of every sub-call.
for k, fn in pairs(require("rlm.engine.calls")) do
  assert(Scheduler[k] == nil, k)
  Scheduler[k] = fn
end

return M
