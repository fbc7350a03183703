-- Nested sessions (rlm_query): children pumped inside their parent.
local core = require("rlm.core")
local textlib = require("rlm.base.text")

local M = {}

-- Nested sessions. A child runs as an engine inside this one's: this
-- session pumps it while its exec waits, passes its requests (root_llm,
-- llm_query) out through its own poll() with the child's depth, and routes
-- the replies back. Its descriptors join the root's waitset.

function M:_queue_child(call)
  if #self.children >= self.opts.max_concurrent_sub_calls then
    self.queued[#self.queued + 1] = call
    return true
  end
  -- Past max_live_sandboxes the code gets an error for this call
  -- (rlm.engine.budgets), and the run goes on. (A queued call is never refused:
  -- the child whose room it takes has closed just before.)
  local refused = self.tree:child_refusal()
  if refused then
    return self.scheduler:send_result(call, nil, refused)
  end
  local child = self:_new_child(call)
  child.call = call
  -- Counted till it closes (rlm's Session:close), its sandbox with it.
  child.live_counted = true
  self.tree:child_made()
  call.t0 = core.now_ms()
  self:_root():_waitset() -- fd() covers its processes from now on
  self.children[#self.children + 1] = child
  self.clock:pause(self.driver)
  return true
end

function M:_root()
  local s = self
  while s.parent do
    s = s.parent
  end
  return s
end

-- Runs each child until it waits; returns the first that ended, and how.
function M:_pump_children()
  for i, child in ipairs(self.children) do
    while true do
      local ev = child:poll()
      if not ev then
        break
      elseif ev.type == "done" or ev.type == "error" then
        table.remove(self.children, i)
        return child, ev
      elseif ev.type == "root_llm" or ev.type == "llm_query" or ev.type == "tool_call" then
        self.scheduler:forward(child, ev)
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
function M:_child_done(child, ev)
  local call = child.call
  local next_call = table.remove(self.queued, 1)
  if next_call or not child.driver then
    child:close()
  else
    self:_root():_waitset():remove(child.driver:fd())
    self.finished[#self.finished + 1] = child
  end
  if next_call then
    self:_queue_child(next_call)
  end
  if not self.children[1] and self.driver then
    self.clock:resume(self.driver)
  end
  local text, problem
  if ev.type == "done" then
    text = ev.result.answer
  else
    problem = ("rlm_query failed (%s): %s"):format(ev.err.kind, textlib.error_line(ev.err.message))
  end
  local ok, err = self:_emit({ type = "sub_query", step = self.iterations, prompt = call.prompt,
    response = text, error = problem, latency_ms = core.now_ms() - call.t0, index = call.index,
    batch_index = call.batch_index, batch_size = call.batch_size, batch_id = call.batch_id,
    recursive = true, iterations = child.iterations, error_kind = ev.err and ev.err.kind })
  if not ok then
    return nil, err
  end
  ok, err = self.scheduler:send_result(call, text, problem)
  if not self.scheduler:busy() then
    self:_close_finished()
  end
  return ok, err
end

-- The sandboxes of the children that ended and wait for their call's last
-- answer (_child_done) go.
function M:_close_finished()
  local finished = self.finished
  self.finished = {}
  for _, child in ipairs(finished) do
    child:close()
  end
end

-- Closes the children and forgets the queued ones (an exec or the session
-- ended).
function M:_end_children()
  self:_close_finished()
  for _, child in ipairs(self.children) do
    child:close()
  end
  self.children, self.queued = {}, {}
  self.clock:drop_pause()
end
return M
