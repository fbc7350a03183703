-- A session's nested sessions (rlm_query), its collaborator
-- (rlm.engine.session creates it). A child runs as an engine inside its
-- parent's: the parent pumps it while its exec waits, passes its requests
-- (root_llm, llm_query, tool_call, cache_get, cache_set, sandbox_claim)
-- out through its own poll() with the child's depth (its scheduler's
-- forward), and routes the replies back. Its descriptors join the root's
-- waitset. Each child counts against max_concurrent_sub_calls (the tree's
-- Budgets) from its making to its close.
local core = require("rlm.core")
local textlib = require("rlm.base.text")

---@class Nested
---@field session Session the parent
---@field make_child function (parent, call) -> the nested session for an rlm_query call (rlm.engine.session)
---@field children table the nested sessions running for the current exec
---@field queued table calls for nested sessions asked for past max_concurrent_sub_calls
---@field finished table nested sessions that ended, their sandboxes kept till their call is answered
---@field started integer how many it started (their session_id)
---@field calls table child -> the rlm_query call it answers
---@field counted table child -> true while it counts in the tree's live children
local Nested = {}
Nested.__index = Nested

local M = {}

function M.new(session, make_child)
  return setmetatable({ session = session, make_child = make_child, children = {}, queued = {}, finished = {},
    started = 0, calls = {}, counted = {} }, Nested)
end

-- The session_id of the next child: "1.2" for the second one of "1".
function Nested:next_id()
  self.started = self.started + 1
  return self.session.session_id .. "." .. self.started
end

-- A child runs (its parent's exec waits on it).
function Nested:running()
  return self.children[1] ~= nil
end

-- Starts a nested session for call, or queues it past
-- max_concurrent_sub_calls.
function Nested:queue(call)
  local s = self.session
  if #self.children >= s.opts.max_concurrent_sub_calls then
    self.queued[#self.queued + 1] = call
    return true
  end
  -- Past max_concurrent_sub_calls nested sessions alive over the tree
  -- (grandchildren included), the code gets an error for this call
  -- (rlm.engine.budgets), and the run goes on. (A queued call is never
  -- refused: the child whose room it takes has closed just before.)
  local refused = s.tree:child_refusal()
  if refused then
    return s.scheduler:send_result(call, nil, refused)
  end
  local child = self.make_child(s, call)
  self.calls[child] = call
  -- Counted till it closes (close_child), its sandbox with it.
  self.counted[child] = true
  s.tree:child_made()
  call.t0 = core.now_ms()
  s.root.engine:watched() -- fd() covers its processes from now on
  self.children[#self.children + 1] = child
  s.clock:pause(s.sandbox.driver)
  return true
end

-- Closes a child; it no longer counts against the tree's nested sessions.
function Nested:close_child(child)
  if self.counted[child] then
    self.counted[child] = nil
    self.session.tree:child_closed()
  end
  child:close()
end

-- Runs each child until it waits; returns the first that ended, and how.
function Nested:pump()
  local scheduler = self.session.scheduler
  for i, child in ipairs(self.children) do
    while true do
      local ev = child:poll()
      if not ev then
        break
      elseif ev.type == "done" or ev.type == "error" then
        table.remove(self.children, i)
        return child, ev
      elseif ev.type == "root_llm" or ev.type == "llm_query" or ev.type == "tool_call" or ev.type == "cache_get"
        or ev.type == "cache_set" or ev.type == "sandbox_claim" then
        scheduler:forward(child, ev)
      end -- a child's "step" is its own business
    end
  end
end

-- A child ended: its answer (or why it failed) goes to the code that asked.
-- Its sandbox goes once every answer of that call has gone to the driver,
-- or at once when a queued nested session is to take its room: a
-- sandbox's teardown (its processes' exit) costs the CPUs about what its
-- session did, and the rest of a batch should not wait behind it. Till
-- then the root's loop no longer watches it, and nothing reads it.
function Nested:done(child, ev)
  local s = self.session
  local call = self.calls[child]
  self.calls[child] = nil
  local next_call = table.remove(self.queued, 1)
  if next_call or not child.sandbox.driver then
    self:close_child(child)
  else
    s.root.engine:watched():remove(child.sandbox.driver:fd())
    self.finished[#self.finished + 1] = child
  end
  if next_call then
    self:queue(next_call)
  end
  if not self.children[1] and s.sandbox.driver then
    s.clock:resume(s.sandbox.driver)
  end
  local text, problem
  if ev.type == "done" then
    text = ev.result.answer
  else
    problem = ("rlm_query failed (%s): %s"):format(ev.err.kind, textlib.error_line(ev.err.message))
  end
  local ok, err = s:_emit({ type = "sub_query", step = s.conversation.iterations, prompt = call.prompt,
    response = text, error = problem, latency_ms = core.now_ms() - call.t0, index = call.index,
    batch_index = call.batch_index, batch_size = call.batch_size, batch_id = call.batch_id,
    recursive = true, iterations = child.conversation.iterations, error_kind = ev.err and ev.err.kind })
  if not ok then
    return nil, err
  end
  ok, err = s.scheduler:send_result(call, text, problem)
  if not s.scheduler:busy() then
    self:close_finished()
  end
  return ok, err
end

-- The sandboxes of the children that ended and wait for their call's last
-- answer (done) go.
function Nested:close_finished()
  local finished = self.finished
  self.finished = {}
  for _, child in ipairs(finished) do
    self:close_child(child)
  end
end

-- Closes the children and forgets the queued ones (an exec or the session
-- ended).
function Nested:end_all()
  self:close_finished()
  for _, child in ipairs(self.children) do
    self.calls[child] = nil
    self:close_child(child)
  end
  self.children, self.queued = {}, {}
  self.session.clock:drop_pause()
end

-- The sooner of ms and every running child's timeout() (-1: none).
function Nested:timeout(ms)
  local children = self.children
  for i = 1, #children do
    local c = children[i]:timeout()
    if ms < 0 or (c >= 0 and c < ms) then
      ms = c
    end
  end
  return ms
end

return M
