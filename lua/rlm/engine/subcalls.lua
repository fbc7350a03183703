-- The code's llm_query calls: budgets, the in-flight cap over the tree of
-- sessions, requests handed out through poll() and the answers back.
local core = require("rlm.core")
local textlib = require("rlm.base.text")
local util = require("rlm.base.util")

local M = {}

-- How much of a failed callback's message the code is shown.
local MAX_CAUSE_CHARS = 500

-- Hands a request to the outside world (through poll) and returns it.
-- Sub-calls count against max_concurrent_sub_calls over the whole tree of
-- sessions, whoever drives it.
function M:_request(req)
  self.next_request_id = self.next_request_id + 1
  req.id = self.next_request_id
  if req.type == "llm_query" and not self.tree:admit(self, req) then
    return req -- held until one in flight answers
  end
  self:_hand_out(req)
  return req
end

function M:_hand_out(req)
  req.t0 = core.now_ms()
  self.pending[req.id] = req
  self.outbox[#self.outbox + 1] = req
end

-- A counted sub-call is over: the next held one, of any session of the
-- tree, goes out.
function M:_release()
  local session, req = self.tree:release()
  if session then
    session:_hand_out(req)
  end
end

-- Forgets the sub-calls this session has held back (an exec ended with
-- calls still out).
function M:_drop_held()
  self.tree:drop_held(self)
end

-- Forgets every request this session has out or held (its run ended), so
-- that they stop counting.
function M:_drop_requests()
  self:_drop_held()
  for _, req in pairs(self.pending) do
    if req.counted then
      req.counted = nil
      self:_release()
    end
  end
  self.outbox, self.pending, self.routes = {}, {}, {}
end

-- Checks what a model callback gave back: text, and optionally a usage
-- table. Then the deadline, which a callback that blocked may have passed.
function M:_model_result(who, reply)
  if reply.failed then
    return self:_error("callback_error", who .. " raised: " .. tostring(reply.message))
  end
  if type(reply.text) ~= "string" then
    return self:_error("callback_error", who .. " returned " .. type(reply.text) .. ", not a string")
  end
  local ok, err = self:_add_usage(who, reply.usage)
  if not ok then
    return nil, err
  end
  ok, err = self:_deadline_check()
  if not ok then
    return nil, err
  end
  return reply.text, reply.usage
end

-- The calls one message of the code asks for: { {prompt=, context=,
-- format=} or a prompt string, ... }, whether it is a batch, and whether they are nested
-- sessions. Past max_depth a nested session is one sub-model call that reads
-- the prompt and the context.
function M:_calls_of(msg)
  local calls, batch = { msg }, msg.type == "llm_batch" or msg.type == "rlm_batch"
  if msg.type == "llm_batch" then
    calls = msg.prompts -- strings: made calls one at a time, as they go out
  elseif msg.type == "rlm_batch" then
    calls = msg.queries
  end
  local nested = msg.type == "rlm_query" or msg.type == "rlm_batch"
  if nested and self.depth + 1 >= self.opts.max_depth then
    for i, c in ipairs(calls) do
      calls[i] = { prompt = c.context and (c.prompt .. "\n\n" .. c.context) or c.prompt }
    end
    nested = false
  end
  return calls, batch, nested
end

-- Why a prompt may not go out, or nil. `slot` is its place in a batch.
function M:_prompt_problem(p, slot)
  local limit = self.opts.max_sub_prompt_chars
  local chars = limit and textlib.utf8_len(p)
  if not limit or chars <= limit then
    return nil
  end
  if slot then
    return ("prompt %d is %d characters; the limit is %d (max_sub_prompt_chars): split it")
      :format(slot, chars, limit)
  end
  return ("llm_query prompt is %d characters; the limit is %d (max_sub_prompt_chars): split it "
    .. "into smaller pieces"):format(chars, limit)
end

-- The code's llm_query, llm_query_batched, rlm_query or rlm_query_batched.
-- Every call that fits the budgets goes out at once (up to
-- max_concurrent_sub_calls in flight over the tree); the answers go back as
-- they come. In a batch, a call that does not fit gets its error in its
-- slot; a lone call past max_sub_calls ends the session.
function M:_sub_query(msg)
  if msg.type == "tool_call" then
    return self:_tool_call(msg) -- rlm.tools
  end
  local o, tree = self.opts, self.tree
  -- The driver waits for each call's answers before the next: so at most
  -- one message's worth of prompts is ever held here.
  if self.open_slots > 0 then
    return self:_error("protocol_error", "the driver made a call before its last one was answered")
  end
  if self.interrupted then
    -- Past step_timeout_ms: a call the code makes now is not run.
    return self:_send({ type = "llm_result", id = msg.id, interrupted = true })
  end
  local calls, batch, nested = self:_calls_of(msg)
  local ok, err, batch_id
  self.open_slots, self.open_call, self.open_tool = #calls, msg.id, nil
  if batch then
    ok, err = self:_check_budget()
    if not ok then
      return nil, err
    end
    batch_id = tree:count_batch()
  end
  for i, c in ipairs(calls) do
    if type(c) == "string" then
      c = { prompt = c }
    end
    local slot = batch and i or nil
    if batch and tree:sub_calls_spent() then
      -- The rest of the batch is past the budget: one error for all of its
      -- slots, so what the host does stays bounded by the sub-calls left.
      self.open_slots = self.open_slots - (#calls - i)
      return self:_send_result({ driver_id = msg.id, batch_index = slot, count = #calls - i + 1 }, nil,
        ("not sent: the session's max_sub_calls (%d) are spent"):format(o.max_sub_calls))
    end
    local problem = self:_prompt_problem(c.prompt, slot)
    if not problem and tree:sub_calls_spent() then
      return self:_error("sub_call_budget", ("the code asked for sub-call %d; max_sub_calls is %d")
        :format(tree.sub_calls + 1, o.max_sub_calls), { sub_calls = tree.sub_calls, max_sub_calls = o.max_sub_calls })
    end
    if not problem and not batch then
      ok, err = self:_check_budget()
      if not ok then
        return nil, err
      end
    end
    if problem then
      ok, err = self:_send_result({ driver_id = msg.id, batch_index = slot }, nil, problem)
      if not ok then
        return nil, err
      end
    else
      local call = { prompt = c.prompt, depth = self.depth, driver_id = msg.id, exec_id = self.next_exec_id,
        index = tree:count_sub_call(), batch_index = slot, batch_size = batch and #calls or nil,
        batch_id = batch_id, model = msg.model }
      if nested then
        call.context, call.format = c.context, c.format
        ok, err = self:_queue_child(call)
        if not ok then
          return nil, err
        end
      elseif not batch and self.inline then
        call.type = "llm_query"
        return self:_call_now(call)
      else
        call.type = "llm_query"
        self:_request(call)
      end
    end
  end
  return true
end

-- A lone llm_query with no model= hint, as rlm.core decoded it (d:poll's
-- "query", prompt, id, busy), under run() or step(): what _sub_query,
-- _call_now and _sub_answer do with { type = "llm_query", id =, prompt = }
-- when the callback answers with text, in one go: no message, request or
-- reply table, and the line made by rlm.core. Whatever is not that usual
-- case (a call refused or held back, more from the driver or a timer due
-- first, an interrupt, a limit on prompts, on_event, another loop than run()
-- or step(), a failed callback or a usage) takes their path.
function M:_quick_query(prompt, id, busy)
  local o, tree = self.opts, self.tree
  if busy or not self.inline or self.open_slots > 0 or self.interrupted or o.max_sub_prompt_chars
      or o.on_event or tree:sub_calls_spent() or not tree:has_room() then
    return self:_sub_query({ type = "llm_query", id = id, prompt = prompt })
  end
  if o.max_wall_ms or o.max_total_tokens or o.max_total_cost_usd then
    local ok, err = self:_check_budget()
    if not ok then
      return nil, err
    end
  end
  local index = tree:count_sub_call()
  self.open_slots, self.open_call, self.open_tool = 1, id, nil
  self.next_request_id = self.next_request_id + 1
  tree:take_room()
  local exec_id = self.next_exec_id
  local answered, text, usage = util.call_now(o.llm_query, prompt, { depth = self.depth })
  self:_release()
  if self.closed then
    return self:_cancelled()
  end
  if not answered or type(text) ~= "string" or usage ~= nil or exec_id ~= self.next_exec_id
      or self.interrupted then
    local req = { type = "llm_query", prompt = prompt, depth = self.depth, driver_id = id, exec_id = exec_id,
      index = index, id = self.next_request_id }
    if not answered then
      return self:_sub_answer({ request = req, failed = true, message = text })
    end
    return self:_sub_answer({ request = req, text = text, usage = usage })
  end
  local ok, err = self:_deadline_check()
  if not ok then
    return nil, err
  end
  self.open_slots = 0
  return self:_send_text(id, text)
end

-- Under run() and step() (self.inline: rlm.blocking), a lone llm_query is
-- answered in this resume of the engine: the callback runs at once, as the
-- loop would run it once poll() handed the request out, and its answer goes
-- back through _sub_answer, without the trip through the outbox, pending
-- and the inbox. It goes the usual way when the in-flight cap holds it
-- back, or when the driver's descriptor or a timer wants a look first (a
-- line read with this one: a hostile driver's second call before its
-- answer is the usual protocol_error).
function M:_call_now(call)
  local tree, drv = self.tree, self.driver
  if not tree:has_room() or drv:timeout() == 0 then
    self:_request(call)
    return true
  end
  self.next_request_id = self.next_request_id + 1
  call.id, call.t0 = self.next_request_id, core.now_ms()
  tree:take_room()
  local reply = self.inline(self, call)
  self:_release()
  if self.closed then
    return self:_cancelled()
  end
  return self:_sub_answer(reply)
end

-- What the code receives for a call: text, or the error for its slot (a
-- batch) or to raise (a lone call).
function M:_send_result(call, text, problem)
  self.open_slots = self.open_slots - 1
  if text and not problem and not call.batch_index then
    -- A lone call's answer, the usual case: its line made by rlm.core (the
    -- same JSON the table would make, without building the table).
    return self:_send_text(call.driver_id, text)
  end
  return self:_send({ type = "llm_result", id = call.driver_id, text = text, error = problem,
    index = call.batch_index and call.batch_index - 1 or nil, count = call.count }, true)
end

-- The answer to one of the code's llm_query calls: back to the driver.
function M:_sub_answer(reply)
  local req = reply.request
  if req.type == "tool_call" then
    return self:_tool_answer(reply) -- rlm.tools
  end
  if req.exec_id ~= self.next_exec_id or self.interrupted then
    return true -- the exec it belonged to is over, or was interrupted
  end
  local text, usage, slot_error
  if reply.failed or type(reply.text) ~= "string" then
    -- A failed call is the model's to handle: in its slot in a batch, an
    -- exception (RuntimeError) the code can catch for a lone call. Only the
    -- budgets end the run.
    slot_error = reply.failed and ("llm_query failed: " .. textlib.cut(textlib.error_line(reply.message),
      MAX_CAUSE_CHARS, false))
      or ("llm_query failed: the callback returned " .. type(reply.text) .. ", not a string")
  else
    text, usage = self:_model_result("llm_query", reply)
    if not text then
      return nil, usage
    end
  end
  if self.opts.on_event then -- the event is built only for someone to see it
    local ok, err = self:_emit({ type = "sub_query", step = self.iterations, prompt = req.prompt,
      response = text, error = slot_error, latency_ms = core.now_ms() - req.t0, index = req.index,
      batch_index = req.batch_index, batch_size = req.batch_size, batch_id = req.batch_id, usage = usage })
    if not ok then
      return nil, err
    end
  end
  return self:_send_result(req, text, slot_error)
end

-- Nested sessions. A child runs as an engine inside this one's: this
-- session pumps it while its exec waits, passes its requests (root_llm,
-- llm_query) out through its own poll() with the child's depth, and routes
return M
