-- The one loop every host runs over a session: poll, start the user's
-- callback for each request (a batch's requests in one llm_query_batch
-- call when it is given), reply when it answers, and stop at the end of the
-- run. How a callback is started (at once, in a coroutine of its own, in a
-- light thread) and how the host waits between polls is the host's: see
-- rlm.blocking (run, step), rlm.async (event loops) and rlm.adapters.resty.
local cache = require("rlm.engine.cache")
local claim = require("rlm.engine.claim")
local core = require("rlm.core")
local errors = require("rlm.base.errors")
local journal = require("rlm.engine.journal")
local opening = require("rlm.engine.opening")
local tools = require("rlm.engine.tools")

local M = {}

-- Who drives each session now, and what to do when it is closed meanwhile.
local driving = setmetatable({}, { __mode = "k" })

-- claim(s, who[, on_close]) marks s as driven by `who`; a second driver
-- raises (misuse: one run at a time), leaving the first alone. on_close()
-- is called by s:close() while the claim holds, so that a loop watching
-- fd() can report the end before the descriptor goes.
function M.claim(s, who, on_close)
  local d = driving[s]
  if d then
    error(("rlm: %s: this session is already being driven by %s (from a callback or another coroutine?); "
      .. "one run at a time"):format(who, d.who), 3)
  end
  driving[s] = { who = who, on_close = on_close }
  s.scheduler:reclaim()
end

-- Sets the on_close of the claim held on s.
function M.claim_close(s, on_close)
  driving[s].on_close = on_close
end

-- The loop lets go of s; a closed session's descriptor goes now.
function M.release(s)
  driving[s] = nil
  if s.closed then
    s.engine:close_waitset()
  end
end

-- Called by close(): true when a loop still watches the session's fd().
function M.closing(s)
  local d = driving[s]
  if d and d.on_close then
    d.on_close()
    return true
  end
  return false
end

local function argument(ev)
  if ev.type == "root_llm" then
    return ev.messages
  end
  return ev.prompt
end

-- The callback with its second argument, info = { depth =, model = }: the
-- session's depth and llm_query's model= hint (and a root call's delta). Under an adapter the second
-- argument was done(text[, usage]); info is then callable and does what
-- done does, so fn(arg, done) callbacks work as before. A Lua closure, so
-- that a yield inside fn passes through it on every Lua.
-- The done behind each callable info (weak keys: it goes with its info).
local dones = setmetatable({}, { __mode = "k" })
local callable_info = { __call = function(info, ...)
  return dones[info](...)
end }

-- A root call's info.delta(text): a piece of the reply as it comes, emitted
-- as a root_delta event by the session that asked. It returns false once
-- the reply is no longer wanted (answered, given up, the session closed or
-- failed: a raising on_event fails it), and the client may stop reading.
local function delta_of(s, ev)
  return function(text)
    if not s.scheduler:wants(ev.id) then
      return false
    end
    if type(text) ~= "string" or text == "" then
      return true
    end
    local from = s.scheduler:origin(ev.id)
    return from:_emit({ type = "root_delta", step = from.conversation.iterations, text = text }) == true
  end
end

local function with_info(fn, ev, s)
  return function(arg, done)
    local info = { depth = ev.depth or 0, model = ev.model }
    if ev.type == "root_llm" then
      info.delta = delta_of(s, ev)
    end
    if done then
      dones[info] = done
      setmetatable(info, callable_info)
    end
    return fn(arg, info)
  end
end

-- Starts the callback for request ev (and the rest of its batch).
-- start(fn, arg, settle) calls fn(arg) its host's way and settle(ok, text,
-- usage) once it answered (ok false: text is why it failed).
local function answer(s, ev, start)
  local o = s.opts
  if ev.type == "llm_query" and ev.batch_id and o.llm_query_batch then
    local reqs, prompts = { ev }, { ev.prompt }
    for _, r in ipairs(s.scheduler:batch_rest(ev)) do
      reqs[#reqs + 1], prompts[#prompts + 1] = r, r.prompt
    end
    -- A list of answers in order: a string, or { text =, usage = }, or
    -- { error = "message" }; any other slot is that sub-call's error; a
    -- raise fails every slot.
    return start(with_info(o.llm_query_batch, ev, s), prompts, function(ok, answers)
      if ok and type(answers) ~= "table" then
        ok, answers = false, "llm_query_batch returned " .. type(answers) .. ", not a list"
      end
      for i, r in ipairs(reqs) do
        local slot = ok and answers[i]
        if not ok then
          s:reply(r.id, nil, tostring(answers))
        elseif type(slot) == "table" and type(slot.text) == "string" then
          s:reply(r.id, slot.text, slot.usage)
        elseif type(slot) == "table" and type(slot.error) == "string" then
          s:reply(r.id, nil, slot.error)
        else
          s:reply(r.id, slot)
        end
      end
    end)
  end
  -- A root call may go out while its session's sandbox starts: the time its
  -- callback holds the host's thread is not the start's (rlm.engine.opening).
  local from = ev.type == "root_llm" and s.scheduler:origin(ev.id)
  local t0 = from and core.now_ms()
  start(with_info(o[ev.type], ev, s), argument(ev), function(ok, text, usage)
    if ok then
      s:reply(ev.id, text, usage)
    else
      s:reply(ev.id, nil, tostring(text))
    end
  end)
  if from then
    opening.host_held(from, core.now_ms() - t0)
  end
end

-- Polls s and starts a callback for every request, until the session waits
-- (nil: wait for fd() or timeout()) or an event ends the loop: done, error,
-- or one of type `stop`.
function M.next(s, start, stop)
  while true do
    local ev = s:poll()
    if ev == nil then
      return nil
    elseif ev.type == "root_llm" or ev.type == "llm_query" then
      answer(s, ev, start)
    elseif ev.type == "tool_call" then
      tools.start(s, ev, start)
    elseif ev.type == "cache_get" or ev.type == "cache_set" then
      cache.start(s, ev, start)
    elseif ev.type == "journal" then
      journal.start(s, ev, start)
    elseif ev.type == "sandbox_claim" then
      claim.start(s, ev, start)
    elseif ev.type == "done" or ev.type == "error" or ev.type == stop then
      return ev
    end
  end
end

-- An error a loop caught (a raise out of poll or a callback it started):
-- the session ends with it, as a structured err.
function M.fail(s, e)
  if not errors.is_error(e) then
    e = errors.new(s.closed and "cancelled" or "callback_error", tostring(e))
  end
  s:close()
  return { type = "error", err = e }
end

return M
