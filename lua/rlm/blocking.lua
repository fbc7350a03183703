-- run() and step(): a loop over poll() that calls the callbacks itself.
local errors = require("rlm.errors")
local util = require("rlm.util")

local pack = util.pack

local function take(queue)
  return table.remove(queue, 1)
end

local M = {}

-- Calls the user callback a request names, on the protected path (a yield
-- passes through to whoever resumed run()), and replies.
function M:_answer(req)
  local fn = self.opts[req.type]
  local arg = req.type == "root_llm" and req.messages or req.prompt
  local res = pack(util.call_protected(fn, arg))
  if res[1] then
    self:reply(req.id, res[2], res[3])
  else
    self:reply(req.id, nil, tostring(res[2]))
  end
end

-- The rest of a batch that starts with req, taken out of the outbox, where
-- its requests sit in order, and answered by one llm_query_batch(prompts)
-- call: a list of answers in order. A slot that is not a string is that
-- sub-call's error; a raise fails every slot.
function M:_answer_batch(req)
  local batch, prompts = { req }, { req.prompt }
  while self.outbox[1] and self.outbox[1].batch_id == req.batch_id do
    local r = take(self.outbox)
    batch[#batch + 1], prompts[#prompts + 1] = r, r.prompt
  end
  local ok, answers = util.call_protected(self.opts.llm_query_batch, prompts)
  if ok and type(answers) ~= "table" then
    ok, answers = false, "llm_query_batch returned " .. type(answers) .. ", not a list"
  end
  for i, r in ipairs(batch) do
    if ok then
      self:reply(r.id, answers[i])
    else
      self:reply(r.id, nil, tostring(answers))
    end
  end
end

-- The blocking loop under run() and step(): pumps and answers until an
-- event of type `stop` (or the end).
function M:_drive(goal, stop)
  self.goal = goal
  self.blocking, self.tree.blocking = true, true
  while true do
    local ev = self:poll()
    if ev == nil then
      -- Only an adapter leaves requests unanswered; wait for the driver.
      ev = { type = "error", err = errors.new("protocol_error", "the session has requests outstanding "
        .. "that no one answers (run() mixed with an adapter?)") }
    end
    if ev.type == "llm_query" and ev.batch_id and self.opts.llm_query_batch then
      self:_answer_batch(ev)
    elseif ev.type == "root_llm" or ev.type == "llm_query" then
      self:_answer(ev)
    elseif ev.type == stop or ev.type == "done" or ev.type == "error" then
      self.blocking, self.tree.blocking = false, false
      return ev
    end
  end
end

-- A finished run may go on: step() after the final answer continues the
-- same conversation.
function M:_resume_after_done()
  if self.terminal and self.terminal.type == "done" then
    self.terminal = nil
  end
end

-- One root turn: ask the root model, run the code it wrote, show it the
-- output. Returns the history entry, or nil, err.
function M:step()
  if self.failed then
    return nil, self.failed
  end
  if self:_turns_spent() and not self.closed then
    return nil, errors.new("max_iterations", ("max_iterations (%d) root turns are spent")
      :format(self.opts.max_iterations), { history = self.history })
  end
  self:_resume_after_done()
  local ev = self:_drive("step", "step")
  if ev.type == "step" then
    return ev.entry
  elseif ev.type == "done" then
    return self.history[#self.history]
  end
  return nil, ev.err
end

-- Runs root turns until the code gives a final answer. Returns the result
-- table, or nil, err.
function M:run()
  local ev = self:_drive("run", nil)
  if ev.type == "done" then
    return ev.result
  end
  return nil, ev.err
end
return M
