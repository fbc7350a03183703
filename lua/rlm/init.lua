-- rlm: Recursive Language Model sessions for Lua. The root model writes
-- Python that runs in a sandboxed REPL holding `context`; see docs/api.md.
--
-- A session is an engine (a coroutine of ours) that never calls a model
-- itself: it hands out requests through poll() and takes the answers back
-- through reply(). run() and step() are small blocking loops over poll();
-- the adapters in rlm.adapters drive the same engine from an event loop.
local core = require("rlm.core")
local errors = require("rlm.errors")
local options = require("rlm.options")
local prompt = require("rlm.prompt")
local protocol = require("rlm.protocol")
local sandbox = require("rlm.sandbox")
local selftest = require("rlm.selftest")
local util = require("rlm.util")

local rlm = { _VERSION = "rlm 0.2.0", null = protocol.null }

local Session = {}
Session.__index = Session
rlm.Session = Session

-- A driver that has not said hello within this long is not going to.
local START_TIMEOUT_MS = 30000
-- Room for the driver's own "[truncated N chars]" marker before the host
-- cuts again.
local MARKER_SLACK = 64
-- What the engine yields when it has nothing to do until the driver or a
-- reply wakes it; any other yield comes from a user callback.
local IDLE = {}

local pack, unpack = util.pack, util.unpack

function Session.new(opts)
  local o = options.check(opts)
  local self = setmetatable({
    opts = o,
    depth = 0,
    history = {},
    iterations = 0,
    sub_calls = 0,
    tokens = { input = 0, output = 0, total = 0 },
    next_exec_id = 0,
    next_request_id = 0,
    outbox = {}, -- requests and events not yet handed out by poll()
    inbox = {}, -- replies not yet taken by the engine
    pending = {}, -- id -> request handed out and not yet answered
    held = {}, -- sub-calls past max_concurrent_sub_calls, not yet handed out
    in_flight = 0, -- sub-calls handed out and not yet answered
  }, Session)
  if type(o.context) == "string" then
    self.context_data, self.context_format = o.context, "text"
  else
    local ok, encoded = pcall(protocol.encode, o.context)
    if not ok then
      error("rlm.Session.new: option 'context' cannot be sent as JSON: " .. tostring(encoded), 2)
    end
    self.context_data, self.context_format = encoded, "json"
  end
  self.messages = {
    { role = "system", content = prompt.system(o) },
    { role = "user", content = prompt.first_user(o.query) },
  }
  return self
end

-- Ends the session with err: the sandbox is torn down, and every later
-- call returns the same err.
function Session:_fail(err)
  err.history = self.history
  self.failed = self.failed or err
  if self.driver then
    self.driver:close()
    self.driver = nil
  end
  return nil, self.failed
end

function Session:_error(kind, message, fields)
  return self:_fail(errors.new(kind, message, fields))
end

function Session:_emit(ev)
  local cb = self.opts.on_event
  if not cb then
    return true
  end
  ev.depth = ev.depth or self.depth
  local ok, e = util.call_protected(cb, ev)
  if not ok then
    return self:_error("callback_error", "on_event raised: " .. tostring(e))
  end
  return true
end

local function exit_message(status, signal, stderr)
  local how = signal ~= 0 and ("killed by signal " .. signal) or ("exit status " .. status)
  if signal == 0 and status > 128 and status < 128 + 65 then
    -- bubblewrap exits 128 + N when the process inside died of signal N.
    how = how .. (" (killed by signal %d)"):format(status - 128)
  end
  stderr = stderr and stderr:gsub("%s+$", "") or ""
  return how .. (stderr ~= "" and (": " .. stderr) or "")
end

-- The next thing the engine must handle: "reply", reply (when accept_replies)
-- or a driver event (kind, ...). Inside a blocking run() with nothing
-- outstanding it waits in C; otherwise it yields IDLE until poll() is called
-- again.
function Session:_wait(accept_replies)
  while true do
    if accept_replies and #self.inbox > 0 then
      return "reply", table.remove(self.inbox, 1)
    end
    local drv = self.driver
    if not drv then
      return "closed"
    end
    local blocking = self.blocking and next(self.pending) == nil and #self.outbox == 0
    local kind, a, b, c = drv:poll(blocking and -1 or 0)
    if kind then
      return kind, a, b, c
    end
    coroutine.yield(IDLE)
  end
end

-- The next event of a helper process the boot runs (the interpreter probe).
-- With no helper: one turn of waiting for another session's probe, true, or
-- false when this session blocks and cannot wait.
function Session:_wait_helper(helper)
  if not helper then
    if self.blocking then
      return false
    end
    coroutine.yield(IDLE)
    return true
  end
  if self.helper ~= helper then
    self.helper = helper
    self:_watch(helper)
  end
  while true do
    local kind, a, b, c = helper:poll(self.blocking and -1 or 0)
    if kind then
      self.helper = nil
      return kind, a, b, c
    end
    coroutine.yield(IDLE)
  end
end

-- Turns a driver event into the message it carries, when its type is one of
-- `allowed`, or into the error it means.
function Session:_driver_message(allowed, kind, a, b, c)
  if kind == "line" then
    local msg, why = protocol.decode(a, allowed)
    if not msg then
      return self:_error("protocol_error", "the driver sent " .. why)
    end
    if msg.type == "fatal" then
      return self:_error("protocol_error", "the driver gave up: " .. tostring(msg.message))
    end
    return msg
  elseif kind == "timeout" then
    return self:_error("step_timeout", ("the step ran past step_timeout_ms (%.0f ms); the sandbox was killed")
      :format(self.opts.step_timeout_ms), { timeout_ms = self.opts.step_timeout_ms })
  elseif kind == "memory" then
    return self:_error("memory_limit", ("the sandbox passed max_rss_bytes (%.0f bytes; peak seen %.0f bytes); "
      .. "the poll of its processes' memory killed it"):format(self.opts.max_rss_bytes, a),
      { limit = self.opts.max_rss_bytes, peak = a, mechanism = "poll" })
  elseif kind == "overflow" then
    return self:_error("protocol_error", ("the driver sent a line longer than max_message_bytes (%d)")
      :format(self.opts.max_message_bytes))
  elseif kind == "exit" then
    local drv = self.driver
    local kills, peak = drv:oom_kills()
    if kills > 0 then
      local how = drv:memory_mechanism()
      return self:_error("memory_limit", ("the sandbox passed max_rss_bytes (%.0f bytes; peak %.0f bytes); "
        .. "the kernel killed it in its %s memory cgroup"):format(self.opts.max_rss_bytes, peak, how),
        { limit = self.opts.max_rss_bytes, peak = peak, mechanism = how })
    end
    if not self.started then
      return self:_error("sandbox_unavailable", "the sandbox exited before the driver started: "
        .. exit_message(a, b, c))
    end
    return self:_error("driver_exited", "the driver exited: " .. exit_message(a, b, c),
      { status = a, signal = b, stderr = c })
  end
  return self:_error("driver_exited", "the driver is gone")
end

-- Waits for the next message of one of the `allowed` types.
function Session:_expect(allowed)
  return self:_driver_message(allowed, self:_wait(false))
end

function Session:_send(msg)
  local ok = self.driver:send(protocol.encode(msg))
  if not ok then
    return self:_expect({}) -- the reason it cannot take input is queued
  end
  return true
end

local function checks_failed(checks)
  local bad, n = {}, 0
  for name, c in pairs(checks) do
    n = n + 1
    if not c.ok then
      bad[#bad + 1] = name .. " (" .. tostring(c.detail) .. ")"
    end
  end
  table.sort(bad)
  if n == 0 then
    bad[1] = "no checks were reported"
  end
  return bad
end

function Session:_start()
  -- Planted before the spawn, so that the leaked descriptor is there to leak.
  local canaries = core.plant_canaries(os.getenv("HOME"), self.opts.tmpdir)
  local ok, err = self:_boot(canaries)
  canaries:remove()
  return ok, err
end

-- Spawns the sandbox and proves it before any model code can run: the
-- driver's hello, no foreign descriptor inside, the rlimits it set, its
-- self-test against the canaries; then the context.
function Session:_boot(canaries)
  local o = self.opts
  local context_bytes = #self.context_data
  local drv, info = sandbox.start(o, self.context_data, function(helper)
    return self:_wait_helper(helper)
  end, self)
  if not drv then
    return self:_fail(info)
  end
  self.driver = drv
  self:_watch(drv)
  self.context_data = nil
  drv:set_deadline(math.max(START_TIMEOUT_MS, o.step_timeout_ms))
  local canary_info = canaries:info()
  canaries:close_leaked() -- it only had to be there to leak into the spawn

  local hello, err = self:_expect({ hello = true, fatal = true })
  if not hello then
    return nil, err
  end
  if hello.protocol ~= protocol.VERSION then
    return self:_error("protocol_error", ("the driver speaks protocol %s, the host %d")
      :format(tostring(hello.protocol), protocol.VERSION))
  end
  self.started = true
  if not drv:adopt() then
    return self:_error("sandbox_violation", "a sandbox process could not be moved into its memory cgroup")
  end
  local foreign = drv:foreign_fds()
  if #foreign > 0 then
    return self:_error("sandbox_violation", "descriptors reach the sandbox: " .. table.concat(foreign, "; "))
  end
  local rlimits = selftest.rlimits(o, context_bytes)
  local ok
  ok, err = self:_send({ type = "configure", stdout_limit = o.stdout_truncate_chars,
    max_message_bytes = o.max_message_bytes, guardrails = o.guardrails,
    allowed_modules = #o.allowed_modules > 0 and o.allowed_modules or nil, -- {} would be an object
    sys_path = info.sys_path, rlimits = rlimits })
  if ok then
    ok, err = self:_send({ type = "self_test", absent = info.absent, canaries = canary_info })
  end
  if ok then
    ok, err = self:_send({ type = "load_context", path = "/session/context",
      format = self.context_format })
  end
  if not ok then
    return nil, err
  end
  local msg
  msg, err = self:_expect({ configured = true, fatal = true })
  if not msg then
    return nil, err
  end
  local tree = drv:tree()
  local problem = "the sandbox has no processes"
  if #tree > 0 then
    problem = selftest.check_rlimits(tree[#tree], rlimits)
  end
  if problem then
    return self:_error("sandbox_violation", "the driver's rlimits are not set: " .. problem)
  end
  msg, err = self:_expect({ self_test_result = true, fatal = true })
  if not msg then
    return nil, err
  end
  local bad = checks_failed(msg.checks)
  if #bad > 0 then
    return self:_error("sandbox_violation", "the sandbox self-test failed: " .. table.concat(bad, "; "),
      { checks = msg.checks })
  end
  msg, err = self:_expect({ ready = true, fatal = true })
  if not msg then
    return nil, err
  end
  if msg.error then
    return self:_error("protocol_error", "the driver could not load the context: " .. msg.error)
  end
  drv:set_deadline(0)
  return true
end

local function utf8_len(s)
  return select(2, core.utf8_prefix(s, 2 ^ 53))
end

-- Cuts s to about `limit` characters, as the driver should have (it is not
-- trusted to). Output keeps its first two thirds and its last third, so the
-- model sees how it ended; a traceback keeps its end, where the error is.
local function cut(s, limit, keep_end)
  if core.utf8_prefix(s, limit + MARKER_SLACK) >= #s then
    return s
  end
  local total = utf8_len(s)
  local tail = keep_end and limit or math.floor(limit / 3)
  local head = limit - tail
  local head_bytes = core.utf8_prefix(s, head)
  local tail_start = core.utf8_prefix(s, total - tail)
  local marker = ("[truncated %d chars]"):format(total - limit)
  if keep_end then
    return marker .. "\n" .. s:sub(tail_start + 1)
  end
  return s:sub(1, head_bytes) .. "\n" .. marker .. "\n" .. s:sub(tail_start + 1)
end

function Session:_deadline_check()
  if self.driver and self.driver:deadline_passed() then
    self.driver:kill()
    return self:_error("step_timeout", ("the step ran past step_timeout_ms (%.0f ms)")
      :format(self.opts.step_timeout_ms), { timeout_ms = self.opts.step_timeout_ms })
  end
  return true
end

-- Checked before each root turn and each sub-call.
function Session:_check_budget()
  local o = self.opts
  if o.max_total_tokens and self.tokens.total >= o.max_total_tokens then
    return self:_error("cost_budget", ("used %d tokens of max_total_tokens %d")
      :format(self.tokens.total, o.max_total_tokens),
      { tokens = self.tokens.total, max_total_tokens = o.max_total_tokens })
  end
  if not o.max_total_cost_usd then
    return true
  end
  local ok, spent = util.call_protected(o.cost_usd)
  if not ok then
    return self:_error("callback_error", "cost_usd raised: " .. tostring(spent))
  end
  if type(spent) ~= "number" then
    return self:_error("callback_error", "cost_usd returned " .. type(spent) .. ", not a number")
  end
  if spent >= o.max_total_cost_usd then
    return self:_error("cost_budget", ("spent %.4f USD of max_total_cost_usd %.4f")
      :format(spent, o.max_total_cost_usd), { spent_usd = spent, max_total_cost_usd = o.max_total_cost_usd })
  end
  return true
end

-- A callback's optional second result: { input_tokens =, output_tokens = }.
function Session:_add_usage(who, usage)
  if usage == nil then
    return true
  end
  local input, output = type(usage) == "table" and usage.input_tokens or nil,
    type(usage) == "table" and usage.output_tokens or nil
  if type(input) ~= "number" or type(output) ~= "number" or input < 0 or output < 0 then
    return self:_error("callback_error", who .. " returned a usage that is not "
      .. "{ input_tokens = n, output_tokens = n }")
  end
  local t = self.tokens
  t.input, t.output = t.input + input, t.output + output
  t.total = t.input + t.output
  return true
end

-- Hands a request to the outside world (through poll) and returns it.
function Session:_request(req)
  self.next_request_id = self.next_request_id + 1
  req.id = self.next_request_id
  if req.type == "llm_query" and not self.blocking and self.in_flight >= self.opts.max_concurrent_sub_calls then
    self.held[#self.held + 1] = req -- handed out when one in flight answers
    return req
  end
  self:_hand_out(req)
  return req
end

function Session:_hand_out(req)
  req.t0 = core.now_ms()
  self.pending[req.id] = req
  self.outbox[#self.outbox + 1] = req
  if req.type == "llm_query" then
    self.in_flight = self.in_flight + 1
  end
end

-- Checks what a model callback gave back: text, and optionally a usage
-- table. Then the deadline, which a callback that blocked may have passed.
function Session:_model_result(who, reply)
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

-- The code's llm_query_batched(prompts): every prompt that fits the budgets
-- is handed out at once (up to max_concurrent_sub_calls in flight); the
-- others get their error in their slot. Answers go back as they come.
function Session:_sub_batch(msg)
  local o = self.opts
  local ok, err = self:_check_budget()
  if not ok then
    return nil, err
  end
  local n = #msg.prompts
  for i, p in ipairs(msg.prompts) do
    local problem
    if o.max_sub_prompt_chars and utf8_len(p) > o.max_sub_prompt_chars then
      problem = ("prompt %d is %d characters; the limit is %d (max_sub_prompt_chars): split it")
        :format(i, utf8_len(p), o.max_sub_prompt_chars)
    elseif self.sub_calls >= o.max_sub_calls then
      problem = ("not sent: the session's max_sub_calls (%d) are spent"):format(o.max_sub_calls)
    end
    if problem then
      ok, err = self:_send({ type = "llm_result", id = msg.id, index = i - 1, error = problem })
      if not ok then
        return nil, err
      end
    else
      self.sub_calls = self.sub_calls + 1
      self:_request({ type = "llm_query", prompt = p, depth = self.depth, driver_id = msg.id,
        exec_id = self.next_exec_id, index = self.sub_calls, batch_index = i, batch_size = n })
    end
  end
  return true
end

function Session:_sub_query(msg)
  if msg.type == "llm_batch" then
    return self:_sub_batch(msg)
  end
  local o = self.opts
  if o.max_sub_prompt_chars then
    local chars = utf8_len(msg.prompt)
    if chars > o.max_sub_prompt_chars then
      return self:_send({ type = "llm_result", id = msg.id, error = ("llm_query prompt is %d "
        .. "characters; the limit is %d (max_sub_prompt_chars): split it into smaller pieces")
        :format(chars, o.max_sub_prompt_chars) })
    end
  end
  if self.sub_calls >= o.max_sub_calls then
    return self:_error("sub_call_budget", ("the code asked for llm_query call %d; max_sub_calls is %d")
      :format(self.sub_calls + 1, o.max_sub_calls), { sub_calls = self.sub_calls, max_sub_calls = o.max_sub_calls })
  end
  local ok, err = self:_check_budget()
  if not ok then
    return nil, err
  end
  self.sub_calls = self.sub_calls + 1
  self:_request({ type = "llm_query", prompt = msg.prompt, depth = self.depth,
    driver_id = msg.id, exec_id = self.next_exec_id, index = self.sub_calls })
  return true
end

-- The answer to one of the code's llm_query calls: back to the driver.
function Session:_sub_answer(reply)
  local req = reply.request
  self.in_flight = self.in_flight - 1
  local next_req = table.remove(self.held, 1)
  if next_req then
    self:_hand_out(next_req)
  end
  if req.exec_id ~= self.next_exec_id then
    return true -- the exec it belonged to is over
  end
  local text, usage, slot_error
  if req.batch_index and (reply.failed or type(reply.text) ~= "string") then
    -- In a batch, a failed call is the model's to handle, in its slot.
    slot_error = reply.failed and ("llm_query failed: " .. tostring(reply.message):match("^[^\n]*"))
      or ("llm_query returned " .. type(reply.text) .. ", not a string")
  else
    text, usage = self:_model_result("llm_query", reply)
    if not text then
      return nil, usage
    end
  end
  local ok, err = self:_emit({ type = "sub_query", step = self.iterations, prompt = req.prompt,
    response = text, error = slot_error, latency_ms = core.now_ms() - req.t0, index = req.index,
    batch_index = req.batch_index, batch_size = req.batch_size, usage = usage })
  if not ok then
    return nil, err
  end
  return self:_send({ type = "llm_result", id = req.driver_id, text = text, error = slot_error,
    index = req.batch_index and req.batch_index - 1 or nil })
end

local EXEC_REPLIES = { exec_result = true, llm_query = true, llm_batch = true, fatal = true }

-- Runs one block of code; answers the driver's calls back meanwhile.
function Session:_exec(code)
  self.next_exec_id = self.next_exec_id + 1
  local id = self.next_exec_id
  local ok, err = self:_send({ type = "exec", id = id, code = code })
  if not ok then
    return nil, err
  end
  while true do
    local kind, a, b, c = self:_wait(true)
    if kind == "reply" then
      ok, err = self:_sub_answer(a)
      if not ok then
        return nil, err
      end
    else
      local msg
      msg, err = self:_driver_message(EXEC_REPLIES, kind, a, b, c)
      if not msg then
        return nil, err
      end
      if msg.type == "exec_result" then
        if msg.id ~= id then
          return self:_error("protocol_error", ("the driver answered exec %d while exec %d ran")
            :format(msg.id, id))
        end
        self.held = {} -- a hostile driver may end an exec with calls still out
        local limit = self.opts.stdout_truncate_chars
        msg.stdout = cut(msg.stdout, limit, false)
        msg.error = msg.error and cut(msg.error, limit, true) or nil
        return msg
      end
      ok, err = self:_sub_query(msg)
      if not ok then
        return nil, err
      end
    end
  end
end

local function final_of(f)
  if f.kind == "var" then
    local answer = type(f.value) == "string" and f.value or f.repr or tostring(f.value)
    return { kind = "var", var = f.name, value = f.value, answer = answer }
  end
  return { kind = f.kind, value = f.value, answer = f.value }
end

-- Asks the root model (through poll/reply) and waits for its answer. The
-- driver is idle meanwhile: anything it says is an error, and the step
-- deadline still runs.
function Session:_call_root(messages)
  local ok, err = self:_check_budget()
  if not ok then
    return nil, err
  end
  local copy = {}
  for i, m in ipairs(messages) do
    copy[i] = { role = m.role, content = m.content }
  end
  local req = self:_request({ type = "root_llm", messages = copy, depth = self.depth })
  while true do
    local kind, a, b, c = self:_wait(true)
    if kind ~= "reply" then
      local _
      _, err = self:_driver_message({ fatal = true }, kind, a, b, c)
      if not err then
        err = select(2, self:_error("protocol_error", "the driver spoke while the root model was asked"))
      end
      return nil, err
    end
    if a.request == req then
      local text, usage = self:_model_result("root_llm", a)
      if not text then
        return nil, usage
      end
      ok, err = self:_emit({ type = "root_response", step = self.iterations, response = text,
        latency_ms = core.now_ms() - req.t0, usage = usage })
      if not ok then
        return nil, err
      end
      return text
    end
  end
end

-- Runs the blocks of one response; returns the history entry.
function Session:_run_blocks(response, blocks)
  local entry = { response = response, blocks = {} }
  local codes, outs, texts, first_error = {}, {}, {}, nil
  for i, code in ipairs(blocks) do
    local res, err = self:_exec(code)
    if not res then
      return nil, err
    end
    entry.blocks[i] = { code = code, stdout = res.stdout, error = res.error }
    codes[#codes + 1], outs[#outs + 1] = code, res.stdout
    first_error = first_error or res.error
    texts[#texts + 1] = prompt.exec_output(i, #blocks, res.stdout, res.error)
    local ok
    ok, err = self:_emit({ type = "exec_result", step = self.iterations, block = i,
      code = code, stdout = res.stdout, error = res.error })
    if not ok then
      return nil, err
    end
    if res.final then
      entry.final = final_of(res.final)
      break
    end
  end
  entry.code = table.concat(codes, "\n\n")
  entry.stdout = table.concat(outs, "")
  entry.error = first_error
  return entry, table.concat(texts, "\n\n")
end

function Session:_record(entry, feedback)
  self.messages[#self.messages + 1] = { role = "assistant", content = entry.response }
  if feedback then
    self.messages[#self.messages + 1] = { role = "user", content = feedback }
  end
  self.history[#self.history + 1] = entry
  if entry.final then
    self.final = entry.final
    return self:_emit({ type = "final", step = self.iterations, answer = entry.final.answer,
      kind = entry.final.kind })
  end
  return true
end

-- One root turn: ask the root model, run the code it wrote, record the
-- output for the model. Returns the history entry, or nil, err.
function Session:_turn()
  self.iterations = self.iterations + 1
  self.driver:set_deadline(self.opts.step_timeout_ms)
  local ok, err = self:_emit({ type = "step_start", step = self.iterations })
  if not ok then
    return nil, err
  end
  local response
  response, err = self:_call_root(self.messages)
  if not response then
    return nil, err
  end
  local blocks = prompt.extract(response)
  local entry, feedback
  if #blocks == 0 then
    entry, feedback = { response = response, code = "", stdout = "", blocks = {} }, prompt.NO_CODE
  else
    entry, feedback = self:_run_blocks(response, blocks)
    if not entry then
      return nil, feedback
    end
  end
  self.driver:set_deadline(0)
  ok, err = self:_record(entry, feedback)
  if not ok then
    return nil, err
  end
  return entry
end

function Session:_result(final)
  return {
    answer = final.answer,
    value = final.value,
    kind = final.kind,
    var = final.var,
    iterations = self.iterations,
    sub_calls = self.sub_calls,
    tokens = { input = self.tokens.input, output = self.tokens.output, total = self.tokens.total },
    history = self.history,
  }
end

-- When the turns run out: one more root call that may only answer.
function Session:_last_chance()
  self.messages[#self.messages + 1] = { role = "user", content = prompt.LAST_CHANCE }
  self.driver:set_deadline(self.opts.step_timeout_ms)
  local response, err = self:_call_root(self.messages)
  if not response then
    return nil, err
  end
  local finals = prompt.extract_finals(response)
  if #finals > 0 then
    local entry
    entry, err = self:_run_blocks(response, finals)
    if not entry then
      return nil, err
    end
    self.driver:set_deadline(0)
    if entry.final then
      local ok
      ok, err = self:_record(entry, nil)
      if not ok then
        return nil, err
      end
      return self:_result(entry.final)
    end
  end
  return nil, errors.new("max_iterations", ("no final answer after max_iterations (%d) root turns")
    :format(self.opts.max_iterations), { history = self.history })
end

-- max_iterations counts the root turns of one question.
function Session:_turns_spent()
  return self.iterations - (self.turn_base or 0) >= self.opts.max_iterations
end

-- The engine's body: boot once, then root turns until the goal is met. A
-- "step" event marks the end of each turn; the engine goes on only when
-- polled again, so step() can stop between turns.
function Session:_main()
  local ev = self:_run_turns()
  local r, e = ev.result, ev.err
  local ok, err = self:_emit({ type = "run_end", ok = r ~= nil, answer = r and r.answer,
    error_kind = e and e.kind, error_message = e and e.message, iterations = self.iterations,
    sub_calls = self.sub_calls, tokens = { input = self.tokens.input, output = self.tokens.output,
      total = self.tokens.total } })
  if not ok and not e then
    return { type = "error", err = err }
  end
  return ev
end

function Session:_run_turns()
  if not self.started then
    local ok, err = self:_emit({ type = "session_start", query = self.opts.query })
    if ok then
      ok, err = self:_start()
    end
    if not ok then
      return { type = "error", err = err }
    end
  end
  while true do
    if self.final and self.goal ~= "step" then
      return { type = "done", result = self:_result(self.final) }
    end
    if self:_turns_spent() then
      local result, err = self:_last_chance()
      if not result then
        return { type = "error", err = err }
      end
      return { type = "done", result = result }
    end
    local entry, err = self:_turn()
    if not entry then
      return { type = "error", err = err }
    end
    self.outbox[#self.outbox + 1] = { type = "step", entry = entry }
    coroutine.yield(IDLE)
  end
end

-- A yield from a user callback that runs inside the engine (on_event,
-- cost_usd): passed on to whoever resumed us, when that is a coroutine.
local function pass_through(...)
  local co, main = coroutine.running()
  if co == nil or main then
    error("rlm: a callback yielded outside a coroutine; under an adapter on_event and cost_usd must not yield", 0)
  end
  return coroutine.yield(...)
end

local function take(queue)
  return table.remove(queue, 1)
end

-- Resumes the engine until it has something for the outside or waits.
function Session:_pump()
  if not self.engine then
    self.engine = coroutine.create(function()
      return self:_main()
    end)
  end
  local res = pack(coroutine.resume(self.engine))
  while true do
    if not res[1] then
      error(debug.traceback(self.engine, "rlm: internal error: " .. tostring(res[2])), 0)
    end
    if coroutine.status(self.engine) == "dead" then
      self.engine = nil
      local ev = res[2]
      if ev.type == "error" then
        self:_fail(ev.err)
        ev.err = self.failed
      end
      self.terminal = ev
      return
    end
    if res[2] == IDLE then
      return
    end
    res = pack(coroutine.resume(self.engine, pass_through(unpack(res, 2, res.n))))
  end
end

--- The pump: what the session needs from the outside now, or nil when it
-- must wait (for fd() to be readable or timeout() ms). Never blocks, except
-- for the spawn of the sandbox at the first call and inside run()/step().
function Session:poll()
  if not self.terminal and (self.failed or self.closed) then
    self.terminal = { type = "error", err = self.failed or errors.new("driver_exited",
      "the session is closed", { history = self.history }) }
  end
  if self.terminal then
    self.outbox, self.pending = {}, {}
    return self.terminal
  end
  local ev = take(self.outbox)
  if ev then
    return ev
  end
  self:_pump()
  return take(self.outbox) or self.terminal
end

-- The answer to a request poll() handed out: reply(id, text[, usage]), or
-- reply(id, nil, message) when the call failed.
function Session:reply(id, text, usage)
  local req = self.pending[id]
  if not req then
    error(("rlm: reply to unknown request %s"):format(tostring(id)), 2)
  end
  self.pending[id] = nil
  local r = { request = req, text = text, usage = usage }
  if text == nil and type(usage) == "string" then
    r.failed, r.message, r.usage = true, usage, nil
  end
  self.inbox[#self.inbox + 1] = r
end

-- A descriptor that is readable when the session has work to do; nil while
-- no sandbox runs.
function Session:fd()
  if self.closed then
    return self.waitset and self.waitset:fd() or nil
  end
  if not self.waitset then
    self.waitset = assert(core.waitset())
  end
  return self.waitset:fd()
end

-- Puts a process's descriptor into the set behind fd(). Closing it takes it
-- out again.
function Session:_watch(d)
  if self.waitset then
    assert(self.waitset:add(d:fd()))
  end
end

-- An adapter that watched fd() lets go of it; only then may it close.
function Session:_unwatch()
  self.on_close = nil
  if self.closed and self.waitset then
    self.waitset:close()
    self.waitset = nil
  end
end

-- How often to look while another session of this Lua state probes the
-- interpreter: there is no descriptor to wait on then.
local PROBE_WAIT_MS = 5

-- Milliseconds until the session must be polled even if fd() stays quiet:
-- -1 for no timer, 0 to poll now.
function Session:timeout()
  if #self.outbox > 0 or #self.inbox > 0 or self.terminal or not self.engine then
    return 0
  end
  local d = self.driver or self.helper
  return d and d:timeout() or PROBE_WAIT_MS
end

-- Calls the user callback a request names, on the protected path (a yield
-- passes through to whoever resumed run()), and replies.
function Session:_answer(req)
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
function Session:_answer_batch(req)
  local batch, prompts = { req }, { req.prompt }
  while self.outbox[1] and self.outbox[1].driver_id == req.driver_id and self.outbox[1].batch_size do
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
function Session:_drive(goal, stop)
  self.goal = goal
  self.blocking = true
  while true do
    local ev = self:poll()
    if ev == nil then
      -- Only an adapter leaves requests unanswered; wait for the driver.
      ev = { type = "error", err = errors.new("protocol_error", "the session has requests outstanding "
        .. "that no one answers (run() mixed with an adapter?)") }
    end
    if ev.type == "llm_query" and ev.batch_size and self.opts.llm_query_batch then
      self:_answer_batch(ev)
    elseif ev.type == "root_llm" or ev.type == "llm_query" then
      self:_answer(ev)
    elseif ev.type == stop or ev.type == "done" or ev.type == "error" then
      self.blocking = false
      return ev
    end
  end
end

-- A finished run may go on: step() after the final answer continues the
-- same conversation.
function Session:_resume_after_done()
  if self.terminal and self.terminal.type == "done" then
    self.terminal = nil
  end
end

-- One root turn: ask the root model, run the code it wrote, show it the
-- output. Returns the history entry, or nil, err.
function Session:step()
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
function Session:run()
  local ev = self:_drive("run", nil)
  if ev.type == "done" then
    return ev.result
  end
  return nil, ev.err
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
  self.asked = self.asked or {}
  self.asked[#self.asked + 1] = { question = self.question or self.opts.query,
    answer = self.final.answer, steps = #self.history - (self.history_mark or 0) }
  self.question, self.history_mark = question, #self.history
  self.messages = {
    self.messages[1],
    { role = "user", content = prompt.follow_up(self.asked, question, SUMMARY_ANSWER_CHARS) },
  }
  self.final, self.terminal = nil, nil
  self.turn_base = self.iterations
end

-- A follow-up question after run(): see follow_up. Returns what run() does.
function Session:ask(question)
  self:follow_up(question)
  return self:run()
end

-- Kills the sandbox and removes its workdir. Safe to call more than once.
function Session:close()
  self.closed = true
  if self.helper then
    sandbox.forget_probe(self)
    self.helper:close()
    self.helper = nil
  end
  if self.driver then
    local drv = self.driver
    self.driver = nil
    drv:close()
  end
  if self.on_close then
    self.on_close() -- an adapter watches fd(): it lets go, then closes it
  elseif self.waitset then
    self.waitset:close()
    self.waitset = nil
  end
end

Session.__close = Session.close
Session.__gc = Session.close

return rlm
