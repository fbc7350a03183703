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

-- After its hello, the rest of the boot (self-test, context) may take this
-- long, or step_timeout_ms when that is longer.
local BOOT_TIMEOUT_MS = 30000
-- Room for the driver's own "[truncated N chars]" marker before the host
-- cuts again.
local MARKER_SLACK = 64
-- What the engine yields when it has nothing to do until the driver or a
-- reply wakes it; any other yield comes from a user callback.
local IDLE = {}

local pack, unpack = util.pack, util.unpack

-- What a session and the nested sessions it starts share: one budget, one
-- cap on the sub-calls in flight, and the clock of the run.
local function new_tree()
  return {
    sub_calls = 0,
    tokens = { input = 0, output = 0, total = 0 },
    in_flight = 0, -- sub-calls handed out and not yet answered
    held = {}, -- { session =, req = }: past max_concurrent_sub_calls, not yet handed out
    batches = 0,
  }
end

-- A session over context_data (text, or a JSON document); parent is the
-- session whose code started it with rlm_query, or nil.
local function new_session(o, parent, context_data, context_format, description)
  local self = setmetatable({
    opts = o,
    parent = parent,
    depth = parent and parent.depth + 1 or 0,
    tree = parent and parent.tree or new_tree(),
    context_data = context_data,
    context_format = context_format,
    history = {},
    iterations = 0,
    next_exec_id = 0,
    next_request_id = 0,
    outbox = {}, -- requests and events not yet handed out by poll()
    inbox = {}, -- replies not yet taken by the engine
    pending = {}, -- id -> request handed out and not yet answered
    routes = {}, -- id -> { child =, id = } for a request passed on from a child
    children = {}, -- nested sessions running for the current exec
    queued = {}, -- nested sessions asked for past max_concurrent_sub_calls
    started_children = 0,
    open_slots = 0, -- answers the driver still waits for, for its current call
    max_values = protocol.max_values(o.max_message_bytes), -- JSON values in one line
  }, Session)
  -- Names the session in its events: "1" for the root, "1.2" for the second
  -- session its code started, and so on.
  if parent then
    parent.started_children = parent.started_children + 1
    self.session_id = parent.session_id .. "." .. parent.started_children
  else
    self.session_id = "1"
  end
  self.tokens = self.tree.tokens
  self.messages = {
    { role = "system", content = prompt.system(o, description, self.depth) },
    { role = "user", content = prompt.first_user(o.query) },
  }
  return self
end

function Session.new(opts)
  local o = options.check(opts)
  if type(o.context) == "string" then
    return new_session(o, nil, o.context, "text", prompt.describe(o.context))
  end
  local ok, encoded = pcall(protocol.encode, o.context)
  if not ok then
    error("rlm.Session.new: option 'context' cannot be sent as JSON: " .. tostring(encoded), 2)
  end
  return new_session(o, nil, encoded, "json", prompt.describe(o.context))
end

-- The nested session for one rlm_query: the same options and callbacks, the
-- prompt as its question, and the given context (or the prompt) as its own.
function Session:_new_child(call)
  local o = {}
  for k, v in pairs(self.opts) do
    o[k] = v
  end
  o.query, o.context = call.prompt, nil
  if call.context and call.format == "json" then
    return new_session(o, self, call.context, "json",
      ("a JSON document of %d bytes, loaded as a Python value"):format(#call.context))
  end
  local text = call.context or call.prompt
  return new_session(o, self, text, "text", prompt.describe(text))
end

-- Ends the session with err: the sandbox is torn down, and every later
-- call returns the same err.
function Session:_fail(err)
  err.history = self.history
  self.failed = self.failed or err
  self:_end_children()
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
  ev.session = self.session_id
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
    local nested = self.children[1] ~= nil
    if nested then
      local child, ev = self:_pump_children()
      if child then
        return "child", child, ev
      end
    end
    local blocking = self.blocking and next(self.pending) == nil and #self.outbox == 0
    local kind, a, b, c = drv:poll((blocking and not nested) and -1 or 0, self.max_values)
    if kind then
      return kind, a, b, c
    end
    if blocking then
      -- Only nested sessions can have something: wait on all of them.
      self:_waitset():wait(self:timeout())
    else
      coroutine.yield(IDLE)
    end
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
  elseif kind == "failed" then
    -- The start (on rlm.core's thread) failed: nothing ran.
    return self:_error("sandbox_unavailable", "starting the sandbox: " .. tostring(a))
  elseif kind == "timeout" then
    return self:_timeout_error()
  elseif kind == "memory" then
    return self:_error("memory_limit", ("the sandbox passed max_rss_bytes (%.0f bytes; peak seen %.0f bytes); "
      .. "the poll of its processes' memory killed it"):format(self.opts.max_rss_bytes, a),
      { limit = self.opts.max_rss_bytes, peak = a, mechanism = "poll" })
  elseif kind == "files" then
    return self:_error("memory_limit", ("the sandbox made more than workdir_max_files (%d) files in /session "
      .. "(%.0f seen); its tmpfs holds them in memory"):format(self.opts.workdir_max_files, a),
      { limit = self.opts.max_rss_bytes, peak = self.driver and self.driver:peak_rss() or 0,
        mechanism = "workdir files", files = a, max_files = self.opts.workdir_max_files })
  elseif kind == "dense" then
    return self:_error("protocol_error", ("the driver sent a line of %d JSON values or more; the limit is %d "
      .. "(max_message_bytes / 256)"):format(a, self.max_values))
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
  self.booting = "hello"
  self:_set_deadline(o.start_timeout_ms)
  local canary_info = canaries:info()

  local hello, err = self:_expect({ hello = true, fatal = true })
  -- It only had to be there to leak into the spawn, which runs on the
  -- driver's own thread and is over once the driver speaks.
  canaries:close_leaked()
  if not hello then
    return nil, err
  end
  if hello.protocol ~= protocol.VERSION then
    return self:_error("protocol_error", ("the driver speaks protocol %s, the host %d")
      :format(tostring(hello.protocol), protocol.VERSION))
  end
  self.started = true
  self.booting = "boot"
  self:_set_deadline(math.max(BOOT_TIMEOUT_MS, o.step_timeout_ms))
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
    max_message_bytes = o.max_message_bytes, max_message_values = self.max_values,
    guardrails = o.guardrails,
    allowed_modules = #o.allowed_modules > 0 and o.allowed_modules or nil, -- {} would be an object
    sys_path = info.sys_path, rlimits = rlimits })
  if ok then
    ok, err = self:_send({ type = "self_test", absent = info.absent, canaries = canary_info })
  end
  if ok then
    ok, err = self:_send({ type = "load_context", format = self.context_format })
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
  problem = selftest.check_uids(tree, drv:uid())
  if problem then
    return self:_error("sandbox_violation", "the sandbox runs as the wrong uid: " .. problem)
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
  self.booting = nil
  self:_set_deadline(0)
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
    return self:_timeout_error()
  end
  return true
end

-- Arms the driver's deadline ms from now (0: none), or sooner when
-- max_wall_ms ends first.
function Session:_set_deadline(ms)
  local left = self:_wall_left()
  self.wall_cut = ms > 0 and left ~= nil and left < ms
  if self.wall_cut then
    ms = math.max(left, 1)
  end
  self.deadline_at = ms > 0 and core.now_ms() + ms or nil
  self.driver:set_deadline(ms)
end

-- While a step waits on nested sessions its clock stops: they have their
-- own steps and deadlines, and max_wall_ms bounds the whole.
function Session:_pause_deadline()
  if self.deadline_at and not self.paused_left then
    self.paused_left = math.max(self.deadline_at - core.now_ms(), 1)
    self:_set_deadline(0)
  end
end

function Session:_resume_deadline()
  if self.paused_left and not self.children[1] and self.driver then
    local left = self.paused_left
    self.paused_left = nil
    self:_set_deadline(left)
  end
end

-- Milliseconds left of max_wall_ms in this run, or nil.
function Session:_wall_left()
  local w, t0 = self.opts.max_wall_ms, self.tree.t0
  return w and t0 and w - (core.now_ms() - t0) or nil
end

function Session:_wall_error()
  local w = self.opts.max_wall_ms
  return self:_error("cost_budget", ("the run took max_wall_ms (%.0f ms); it was stopped"):format(w),
    { wall_ms = core.now_ms() - self.tree.t0, max_wall_ms = w })
end

function Session:_timeout_error()
  if self.wall_cut then
    return self:_wall_error()
  end
  if self.booting == "hello" then
    return self:_error("sandbox_unavailable", ("the driver did not say hello within start_timeout_ms "
      .. "(%.0f ms); the sandbox was killed"):format(self.opts.start_timeout_ms),
      { timeout_ms = self.opts.start_timeout_ms })
  elseif self.booting then
    local ms = math.max(BOOT_TIMEOUT_MS, self.opts.step_timeout_ms)
    return self:_error("sandbox_unavailable", ("the sandbox did not finish its self-test and load the "
      .. "context within %.0f ms; it was killed"):format(ms), { timeout_ms = ms })
  end
  return self:_error("step_timeout", ("the step ran past step_timeout_ms (%.0f ms); the sandbox was killed")
    :format(self.opts.step_timeout_ms), { timeout_ms = self.opts.step_timeout_ms })
end

-- Checked before each root turn and each sub-call.
function Session:_check_budget()
  local o = self.opts
  local left = self:_wall_left()
  if left and left <= 0 then
    return self:_wall_error()
  end
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
-- Sub-calls count against max_concurrent_sub_calls over the whole tree of
-- sessions (a blocking run() makes them one at a time anyway).
function Session:_request(req)
  self.next_request_id = self.next_request_id + 1
  req.id = self.next_request_id
  if req.type == "llm_query" then
    local tree = self.tree
    if not tree.blocking and tree.in_flight >= self.opts.max_concurrent_sub_calls then
      tree.held[#tree.held + 1] = { session = self, req = req } -- until one in flight answers
      return req
    end
    tree.in_flight, req.counted = tree.in_flight + 1, true
  end
  self:_hand_out(req)
  return req
end

function Session:_hand_out(req)
  req.t0 = core.now_ms()
  self.pending[req.id] = req
  self.outbox[#self.outbox + 1] = req
end

-- A counted sub-call is over: the next held one, of any session of the
-- tree, goes out.
function Session:_release()
  local tree = self.tree
  tree.in_flight = tree.in_flight - 1
  local h = table.remove(tree.held, 1)
  if h then
    tree.in_flight, h.req.counted = tree.in_flight + 1, true
    h.session:_hand_out(h.req)
  end
end

-- Forgets the sub-calls this session has held back (an exec ended with
-- calls still out).
function Session:_drop_held()
  local held = self.tree.held
  for i = #held, 1, -1 do
    if held[i].session == self then
      table.remove(held, i)
    end
  end
end

-- Forgets every request this session has out or held (its run ended), so
-- that they stop counting.
function Session:_drop_requests()
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

-- The calls one message of the code asks for: { {prompt=, context=,
-- format=} or a prompt string, ... }, whether it is a batch, and whether they are nested
-- sessions. Past max_depth a nested session is one sub-model call that reads
-- the prompt and the context.
function Session:_calls_of(msg)
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
function Session:_prompt_problem(p, slot)
  local limit = self.opts.max_sub_prompt_chars
  local chars = limit and utf8_len(p)
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
function Session:_sub_query(msg)
  local o, tree = self.opts, self.tree
  -- The driver waits for each call's answers before the next: so at most
  -- one message's worth of prompts is ever held here.
  if self.open_slots > 0 then
    return self:_error("protocol_error", "the driver made a call before its last one was answered")
  end
  local calls, batch, nested = self:_calls_of(msg)
  local ok, err
  self.open_slots = #calls
  if batch then
    ok, err = self:_check_budget()
    if not ok then
      return nil, err
    end
    tree.batches = tree.batches + 1
  end
  for i, c in ipairs(calls) do
    if type(c) == "string" then
      c = { prompt = c }
    end
    local slot = batch and i or nil
    if batch and tree.sub_calls >= o.max_sub_calls then
      -- The rest of the batch is past the budget: one error for all of its
      -- slots, so what the host does stays bounded by the sub-calls left.
      self.open_slots = self.open_slots - (#calls - i)
      return self:_send_result({ driver_id = msg.id, batch_index = slot, count = #calls - i + 1 }, nil,
        ("not sent: the session's max_sub_calls (%d) are spent"):format(o.max_sub_calls))
    end
    local problem = self:_prompt_problem(c.prompt, slot)
    if not problem and tree.sub_calls >= o.max_sub_calls then
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
      tree.sub_calls = tree.sub_calls + 1
      local call = { prompt = c.prompt, depth = self.depth, driver_id = msg.id, exec_id = self.next_exec_id,
        index = tree.sub_calls, batch_index = slot, batch_size = batch and #calls or nil,
        batch_id = batch and tree.batches or nil }
      if nested then
        call.context, call.format = c.context, c.format
        self:_queue_child(call)
      else
        call.type = "llm_query"
        self:_request(call)
      end
    end
  end
  return true
end

-- What the code receives for a call: text, or the error for its slot (a
-- batch) or to raise (a lone call).
function Session:_send_result(call, text, problem)
  self.open_slots = self.open_slots - 1
  return self:_send({ type = "llm_result", id = call.driver_id, text = text, error = problem,
    index = call.batch_index and call.batch_index - 1 or nil, count = call.count })
end

-- The answer to one of the code's llm_query calls: back to the driver.
function Session:_sub_answer(reply)
  local req = reply.request
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
    batch_index = req.batch_index, batch_size = req.batch_size, batch_id = req.batch_id, usage = usage })
  if not ok then
    return nil, err
  end
  return self:_send_result(req, text, slot_error)
end

-- Nested sessions. A child runs as an engine inside this one's: this
-- session pumps it while its exec waits, passes its requests (root_llm,
-- llm_query) out through its own poll() with the child's depth, and routes
-- the replies back. Its descriptors join the root's waitset.

function Session:_queue_child(call)
  if #self.children >= self.opts.max_concurrent_sub_calls then
    self.queued[#self.queued + 1] = call
    return
  end
  local child = self:_new_child(call)
  child.call = call
  call.t0 = core.now_ms()
  self:_root():_waitset() -- a blocking run() waits on it from now on
  self.children[#self.children + 1] = child
  self:_pause_deadline()
end

function Session:_root()
  local s = self
  while s.parent do
    s = s.parent
  end
  return s
end

-- Runs each child until it waits; returns the first that ended, and how.
function Session:_pump_children()
  for i, child in ipairs(self.children) do
    while true do
      local ev = child:poll()
      if not ev then
        break
      elseif ev.type == "done" or ev.type == "error" then
        table.remove(self.children, i)
        return child, ev
      elseif ev.type == "root_llm" or ev.type == "llm_query" then
        self:_forward(child, ev)
      end -- a child's "step" is its own business
    end
  end
end

-- Hands a child's request out as this session's own, with a new id.
function Session:_forward(child, ev)
  local req = {}
  for k, v in pairs(ev) do
    req[k] = v
  end
  self.next_request_id = self.next_request_id + 1
  req.id, req.counted = self.next_request_id, nil
  self.routes[req.id] = { child = child, id = ev.id }
  self:_hand_out(req)
end

-- A child ended: its sandbox goes, and its answer (or why it failed) goes
-- to the code that asked.
function Session:_child_done(child, ev)
  child:close()
  local call = child.call
  local next_call = table.remove(self.queued, 1)
  if next_call then
    self:_queue_child(next_call)
  end
  self:_resume_deadline()
  local text, problem
  if ev.type == "done" then
    text = ev.result.answer
  else
    problem = ("rlm_query failed (%s): %s"):format(ev.err.kind, tostring(ev.err.message):match("^[^\n]*"))
  end
  local ok, err = self:_emit({ type = "sub_query", step = self.iterations, prompt = call.prompt,
    response = text, error = problem, latency_ms = core.now_ms() - call.t0, index = call.index,
    batch_index = call.batch_index, batch_size = call.batch_size, batch_id = call.batch_id,
    recursive = true, iterations = child.iterations, error_kind = ev.err and ev.err.kind })
  if not ok then
    return nil, err
  end
  return self:_send_result(call, text, problem)
end

-- Closes the children and forgets the queued ones (an exec or the session
-- ended).
function Session:_end_children()
  for _, child in ipairs(self.children) do
    child:close()
  end
  self.children, self.queued = {}, {}
  self.paused_left = nil
end

local EXEC_REPLIES = { exec_result = true, llm_query = true, llm_batch = true, rlm_query = true,
  rlm_batch = true, fatal = true }

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
    elseif kind == "child" then
      ok, err = self:_child_done(a, b)
    else
      local msg
      msg, err = self:_driver_message(EXEC_REPLIES, kind, a, b, c)
      if msg and msg.type == "exec_result" then
        return self:_exec_done(msg, id)
      end
      ok = msg ~= nil
      if ok then
        ok, err = self:_sub_query(msg)
      end
    end
    if not ok then
      return nil, err
    end
  end
end

function Session:_exec_done(msg, id)
  if msg.id ~= id then
    return self:_error("protocol_error", ("the driver answered exec %d while exec %d ran"):format(msg.id, id))
  end
  -- A hostile driver may end an exec with calls still out.
  self.open_slots = 0
  self:_drop_held()
  self:_end_children()
  self:_resume_deadline()
  local limit = self.opts.stdout_truncate_chars
  msg.stdout = cut(msg.stdout, limit, false)
  msg.error = msg.error and cut(msg.error, limit, true) or nil
  return msg
end

-- FINAL_VAR's value travels once: the answer is that string, or the
-- value's JSON text (made here, not sent twice).
local function final_of(f)
  if f.kind == "var" then
    local answer = f.value
    if type(answer) ~= "string" then
      local ok, text = pcall(protocol.encode, f.value)
      answer = ok and text or tostring(f.value)
    end
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
  self:_set_deadline(self.opts.step_timeout_ms)
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
  self:_set_deadline(0)
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
    sub_calls = self.tree.sub_calls,
    tokens = { input = self.tokens.input, output = self.tokens.output, total = self.tokens.total },
    history = self.history,
  }
end

-- When the turns run out: one more root call that may only answer.
function Session:_last_chance()
  self.messages[#self.messages + 1] = { role = "user", content = prompt.LAST_CHANCE }
  self:_set_deadline(self.opts.step_timeout_ms)
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
    self:_set_deadline(0)
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
    sub_calls = self.tree.sub_calls, tokens = { input = self.tokens.input, output = self.tokens.output,
      total = self.tokens.total } })
  if not ok and not e then
    return { type = "error", err = err }
  end
  return ev
end

function Session:_run_turns()
  if not self.parent then
    self.tree.t0 = core.now_ms() -- max_wall_ms counts from here, over the tree
  end
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
      -- The engine raised. Whatever the driver sent must not raise out of
      -- run(), step(), poll() or an adapter: the session ends with an err.
      local trace = debug.traceback(self.engine, tostring(res[2]))
      self.engine = nil
      self:_fail(errors.new("protocol_error", "rlm: internal error while handling the driver's input: "
        .. trace))
      self.terminal = { type = "error", err = self.failed }
      return
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
    self:_drop_requests()
    return self.terminal
  end
  local ev = self:_next_out()
  if ev then
    return ev
  end
  self:_pump()
  return self:_next_out() or self.terminal
end

-- Whether request id is still wanted: not answered, and (passed on from a
-- child) the child has not ended.
function Session:_wants(id)
  local route = self.routes[id]
  return self.pending[id] ~= nil and (not route or route.child:_wants(route.id))
end

-- The next event for the outside, leaving out the requests of children
-- that ended before they were handed out.
function Session:_next_out()
  while true do
    local ev = take(self.outbox)
    if not ev or not ev.id or self:_wants(ev.id) then
      return ev
    end
    self.pending[ev.id], self.routes[ev.id] = nil, nil
  end
end

-- The answer to a request poll() handed out: reply(id, text[, usage]), or
-- reply(id, nil, message) when the call failed.
function Session:reply(id, text, usage)
  local req = self.pending[id]
  if not req then
    error(("rlm: reply to unknown request %s"):format(tostring(id)), 2)
  end
  self.pending[id] = nil
  local route = self.routes[id]
  if route then
    -- A child's request: the answer is the child's, unless it has ended.
    self.routes[id] = nil
    if route.child.pending[route.id] then
      route.child:reply(route.id, text, usage)
    end
    return
  end
  if req.counted then
    req.counted = nil
    self:_release()
  end
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
  return self:_waitset():fd()
end

-- The set behind fd(), made on first use with the processes running then.
function Session:_waitset()
  if not self.waitset then
    self.waitset = assert(core.waitset())
    for _, d in ipairs({ self.driver or false, self.helper or false }) do
      if d then
        assert(self.waitset:add(d:fd()))
      end
    end
  end
  return self.waitset
end

-- Puts a process's descriptor into the set behind fd() (the root's, for a
-- nested session). Closing it takes it out again.
function Session:_watch(d)
  if self.parent then
    return self.parent:_watch(d)
  end
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
  local ms = d and d:timeout() or PROBE_WAIT_MS
  for _, child in ipairs(self.children) do
    local c = child:timeout()
    if ms < 0 or (c >= 0 and c < ms) then
      ms = c
    end
  end
  return ms
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
function Session:_drive(goal, stop)
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

-- Kills the sandbox (its /session goes with it). Safe to call more than once.
function Session:close()
  self.closed = true
  self:_end_children()
  self:_drop_requests()
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
