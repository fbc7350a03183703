-- The code's calls, methods of the session's Scheduler
-- (rlm.engine.subcalls mixes them in: its queues are that file's job, the
-- calls this one's): llm_query, llm_query_batched, rlm_query and
-- rlm_query_batched, their checks against the budgets, how each goes out,
-- and the answers back to the driver, through the tree's sub-call cache
-- when there is one. (A tool_call: rlm.engine.tools.)
local cachelib = require("rlm.engine.cache")
local core = require("rlm.core")
local textlib = require("rlm.base.text")
local tools = require("rlm.engine.tools")

local M = {}

-- How much of a failed callback's message the code is shown.
local MAX_CAUSE_CHARS = 500

-- The calls one message of the code asks for: { {prompt=, context=,
-- format=} or a prompt string, ... }, whether it is a batch, and whether they are nested
-- sessions. Past max_depth a nested session is one sub-model call that reads
-- the prompt and the context (marked rlm: not cached, as rlm_query is not).
function M:calls_of(msg)
  local kind = msg.type
  local calls
  if kind == "llm_batch" then
    calls = msg.prompts -- strings: made calls one at a time, as they go out
  elseif kind == "llm_query" then
    calls = { msg.prompt }
  elseif kind == "rlm_batch" then
    calls = msg.queries
  else
    calls = { msg }
  end
  local batch, nested = kind == "llm_batch" or kind == "rlm_batch", kind == "rlm_query" or kind == "rlm_batch"
  if nested and self.session.depth + 1 >= self.opts.max_depth then
    for i, c in ipairs(calls) do
      calls[i] = { prompt = c.context and (c.prompt .. "\n\n" .. c.context) or c.prompt, rlm = true }
    end
    nested = false
  end
  return calls, batch, nested
end

-- Why a prompt may not go out, or nil. `slot` is its place in a batch.
function M:prompt_problem(p, slot)
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

-- The one path of every sub-call the code makes. Each call of a message
-- (query) goes through call: the checks, the count, then out as a request
-- for poll() or to a nested session. Each answer comes back through
-- settle, from the inbox (answer).

-- A call the driver may not make now (refused is true when open_slots > 0
-- or the step ran out of time): the session ends with a protocol_error
-- when its last call is unanswered; past step_timeout_ms the call is not
-- run, and gets `interrupted` back.
function M:refuse(id)
  local s = self.session
  -- The driver waits for each call's answers before the next: so at most
  -- one message's worth of prompts is ever held here.
  if self.open_slots > 0 then
    return s:_error("protocol_error", "the driver made a call before its last one was answered")
  end
  return s.sandbox:send({ type = "llm_result", id = id, interrupted = true })
end

-- The code's llm_query, llm_query_batched, rlm_query or rlm_query_batched
-- (a tool_call: rlm.engine.tools), as protocol.decode read it. Every call
-- that fits the budgets goes out at once (up to max_concurrent_sub_calls in
-- flight over the tree); the answers go back as they come. In a batch, a
-- call that does not fit gets its error in its slot; a lone call past
-- max_sub_calls ends the session.
function M:query(msg)
  local s = self.session
  local kind = msg.type
  if kind == "tool_call" then
    return tools.call(s, self, msg)
  elseif self.open_slots > 0 or s.conversation.interrupted then
    return self:refuse(msg.id)
  end
  local o, tree = self.opts, self.tree
  local calls, batch, nested = self:calls_of(msg)
  local ok, err, batch_id
  local n = #calls
  -- With the cache, each call of an llm_query_batched is looked up first
  -- and, when it misses, checked against the budgets on its own (call): a
  -- hit spends nothing, so a batch past a budget may still be answered.
  local cached = tree.cache ~= nil and kind == "llm_batch"
  self:open(msg.id, n, nil)
  if batch then
    if not cached then
      ok, err = s:_check_budget()
      if not ok then
        return nil, err
      end
    end
    batch_id = tree:count_batch()
  end
  for i, c in ipairs(calls) do
    local slot = batch and i or nil
    if batch and not cached and tree:sub_calls_spent() then
      -- The rest of the batch is past the budget: one error for all of its
      -- slots, so what the host does stays bounded by the sub-calls left.
      self.open_slots = self.open_slots - (n - i)
      return self:send_result({ driver_id = msg.id, batch_index = slot, count = n - i + 1 }, nil,
        ("not sent: the session's max_sub_calls (%d) are spent"):format(o.max_sub_calls))
    end
    -- The call, made once: it goes out as the request (or to the nested
    -- session), and the cache's lookups carry it.
    local call = { prompt = c, driver_id = msg.id, model = msg.model, batch_index = slot,
      batch_size = batch and n or nil, batch_id = batch_id }
    if type(c) == "table" then
      call.prompt, call.rlm = c.prompt, c.rlm
      if nested then
        call.context, call.format = c.context, c.format
      end
    end
    ok, err = self:call(call, nested)
    if not ok or not batch then
      return ok, err
    end
  end
  return true
end

-- One call of the code's, made by query: { prompt =, driver_id = (the
-- driver's id for the message), model = (its hint), batch_index =,
-- batch_size =, batch_id = (in a batch), rlm = (an rlm_query past
-- max_depth), context =, format = (a nested session's) }. It goes out as
-- a request for poll() (the same table) or to a nested session; or its
-- error goes back to the code. true, or nil, err when the session ended.
-- With the tree's cache, an llm_query's call is looked up first (its
-- cache_key: rlm.engine.cache), before any budget: a hit is answered at
-- once (hit), and the host's store answers through poll() first
-- (looked_up calls this again, the key set).
function M:call(call, nested)
  local s, tree, o = self.session, self.tree, self.opts
  local slot = call.batch_index
  local problem = o.max_sub_prompt_chars and self:prompt_problem(call.prompt, slot)
  if problem then
    return self:send_result(call, nil, problem)
  end
  local cache, key, t0 = tree.cache, call.cache_key, nil
  if cache and not key and not nested and not call.rlm then
    t0 = core.now_ms()
    key = cachelib.key(call.prompt, call.model, s.depth, cache.namespace)
    call.cache_key = key
    if cache.host then
      self:request({ type = "cache_get", key = key, depth = s.depth, exec_id = s.conversation.next_exec_id,
        call = call })
      return true
    end
    local text = cache:get(key)
    if text then
      return self:hit(text, call, t0)
    end
  end
  if tree.sub_calls >= o.max_sub_calls then -- tree:sub_calls_spent()
    if slot then -- a batch's call looked up in the cache (else query() answered the batch's rest at once)
      return self:send_result(call, nil, ("not sent: the session's max_sub_calls (%d) are spent")
        :format(o.max_sub_calls))
    end
    return s:_error("sub_call_budget", ("the code asked for sub-call %d; max_sub_calls is %d")
      :format(tree.sub_calls + 1, o.max_sub_calls), { sub_calls = tree.sub_calls, max_sub_calls = o.max_sub_calls })
  end
  if (not slot or key) and (tree.bounded or s.closed) then -- else _check_budget has nothing to check
    local ok, err = s:_check_budget()
    if not ok then
      return nil, err
    end
  end
  if key and cache:join(key, { type = "cache_wait", scheduler = self, key = key, exec_id = s.conversation.next_exec_id,
    t0 = t0 or core.now_ms(), call = call }) then
    return true -- the same call is out: its answer comes as this one's (landed)
  end
  call.depth, call.exec_id, call.index = s.depth, s.conversation.next_exec_id, tree:count_sub_call()
  if nested then
    return s.nested:queue(call)
  end
  call.type = "llm_query"
  self:request(call)
  return true
end

-- What the code receives for a call: text, or the error for its slot (a
-- batch) or to raise (a lone call). call.count: the slots it answers (the
-- rest of a batch past max_sub_calls), else one.
function M:send_result(call, text, problem)
  self.open_slots = self.open_slots - 1
  return self.session.sandbox:send({ type = "llm_result", id = call.driver_id, text = text, error = problem,
    index = call.batch_index and call.batch_index - 1 or nil, count = call.count }, true)
end

-- A reply the engine took from the inbox: back to the driver.
function M:answer(reply)
  local req = reply.request
  if req.type == "tool_call" then
    return tools.answer(self.session, self, reply)
  elseif req.type == "cache_get" or req.type == "cache_wait" then
    return self:looked_up(req, reply)
  elseif req.type == "cache_set" then
    return true -- kept, or not: the call was answered already
  elseif reply.failed then
    return self:settle(req, false, reply.message)
  end
  return self:settle(req, true, reply.text, reply.usage)
end

-- The answer to one of the code's calls, req: the callback gave ok, text
-- and usage, or failed (ok false: text is why). It goes back to the driver.
function M:settle(req, ok, text, usage)
  local s = self.session
  if req.cache_key then
    -- The calls that wait for this one's answer get it (or go out).
    self.tree.cache:land(req.cache_key, ok and type(text) == "string" and text or nil)
  end
  if req.exec_id ~= s.conversation.next_exec_id or s.conversation.interrupted then
    return true -- the exec it belonged to is over, or was interrupted
  end
  local slot_error
  if not ok or type(text) ~= "string" then
    -- A failed call is the model's to handle: in its slot in a batch, an
    -- exception (RuntimeError) the code can catch for a lone call. Only the
    -- budgets end the run.
    slot_error = not ok and ("llm_query failed: " .. textlib.cut(textlib.error_line(text), MAX_CAUSE_CHARS, false))
      or ("llm_query failed: the callback returned " .. type(text) .. ", not a string")
    text, usage = nil, nil
  else
    local err
    if usage ~= nil then
      ok, err = s:_add_usage("llm_query", usage)
      if not ok then
        return nil, err
      end
    end
    ok, err = s.sandbox:deadline_check()
    if not ok then
      return nil, err
    end
    if req.cache_key then
      self:remember(req.cache_key, text) -- only an answer: an error is never replayed as one
    end
  end
  if self.opts.on_event then -- the event is built only for someone to see it
    local emitted, err = s:_emit({ type = "sub_query", step = s.conversation.iterations, prompt = req.prompt,
      response = text, error = slot_error, latency_ms = core.now_ms() - req.t0, index = req.index,
      batch_index = req.batch_index, batch_size = req.batch_size, batch_id = req.batch_id, usage = usage })
    if not emitted then
      return nil, err
    end
  end
  return self:send_result(req, text, slot_error)
end

-- The sub-call cache ---------------------------------------------------------

-- A call answered from the cache: the same text, no sub-call, no tokens, no
-- budget; counted in the tree's cache hits, its event marked cached.
function M:hit(text, call, t0)
  local s = self.session
  local n = self.tree.cache:count_hit()
  if self.opts.on_event then
    local ok, err = s:_emit({ type = "sub_query", step = s.conversation.iterations, prompt = call.prompt,
      response = text, cached = true, cache_hit = n, latency_ms = core.now_ms() - t0, batch_index = call.batch_index,
      batch_size = call.batch_size, batch_id = call.batch_id })
    if not ok then
      return nil, err
    end
  end
  return self:send_result(call, text)
end

-- The host's store answered a cache_get, or the call out for the same key
-- ended (a cache_wait: Cache:land): a string is a hit; anything else (nil,
-- a failed or raising get, a failed call) a miss, and the call goes on its
-- way (joining the flight for its key first).
function M:looked_up(req, reply)
  local s = self.session
  if req.exec_id ~= s.conversation.next_exec_id or s.conversation.interrupted then
    return true -- the exec it belonged to is over, or was interrupted
  end
  if not reply.failed and type(reply.text) == "string" then
    return self:hit(reply.text, req.call, req.t0)
  end
  return self:call(req.call, false)
end

-- Keeps an answer under key: in the built-in store at once, in the host's
-- through poll() (a cache_set request; nothing waits for its reply). The
-- request is the tree root's: a nested session's own would be dropped with
-- its outbox when its run ends first (a FINAL right after the call), and
-- its sibling then paid for the same prompt again.
function M:remember(key, text)
  local cache = self.tree.cache
  if cache.host then
    self.session.root.scheduler:request({ type = "cache_set", key = key, value = text,
      depth = self.session.depth })
  else
    cache:set(key, text)
  end
end

-- The call this one waited on (waiter, a cache_wait request of this
-- scheduler's) ended with text, or nil: a reply for the engine, as the
-- host's get gives one.
function M:landed(waiter, text)
  local r = { request = waiter, text = text }
  if text == nil then
    r.failed, r.message = true, "the same call failed"
  end
  self.inbox[#self.inbox + 1] = r
end

-- A call out for key that will not be settled (its run ended, or the
-- driver's call it belonged to): the calls that wait for it go out.
function M:unflight(req)
  if req.cache_key and self.tree.cache then
    self.tree.cache:land(req.cache_key, nil)
  end
end

return M
