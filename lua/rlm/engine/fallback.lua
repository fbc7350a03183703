-- The fallback answer: when a run ends because its turns or its budget ran
-- out, one more root call asks the model for its best answer from what it
-- found, and the run ends with that answer marked `partial = true` instead
-- of the error (docs/api.md, "The fallback answer"). Off with
-- `fallback = false`.
local core = require("rlm.core")
local answer = require("rlm.engine.answer")
local IDLE = require("rlm.engine.loop").IDLE

local M = {}

-- The ends that a best-effort answer may replace.
M.KINDS = { max_iterations = true, cost_budget = true, sub_call_budget = true }

M.PROMPT = "The run is over (%s). No more code can run. From what you found so far, give your best "
  .. "answer to the question now, as plain text, and say what remains uncertain."

-- What the model wrote, without a FINAL(...) around it.
local function answer_text(response)
  local text = response:gsub("^%s+", ""):gsub("%s+$", "")
  local inner = text:match("^FINAL%s*%((.*)%)$")
  if inner then
    text = inner:gsub("^%s*[\"']", ""):gsub("[\"']%s*$", "")
  end
  return text
end

-- Asks the root model once more, through poll()/reply(), however the run
-- ended (the sandbox may be gone). Bounded by step_timeout_ms, checked
-- each time the session is polled. Returns the text, or nil.
local function ask(c, reason)
  local s = c.session
  local copy = {}
  for i, m in ipairs(c.messages) do
    copy[i] = { role = m.role, content = m.content }
  end
  copy[#copy + 1] = { role = "user", content = M.PROMPT:format(reason) }
  local req = s.scheduler:request({ type = "root_llm", messages = copy, depth = s.depth, fallback = true })
  local deadline = core.now_ms() + s.opts.step_timeout_ms
  while true do
    local r = s.scheduler:take_reply()
    if r and r.request == req then
      if r.failed or type(r.text) ~= "string" then
        return nil
      end
      s:_add_usage("root_llm", r.usage)
      return r.text, r.usage, core.now_ms() - req.t0
    end
    if not r then
      if s.closed or core.now_ms() >= deadline then
        return nil
      end
      coroutine.yield(IDLE)
    end
  end
end

-- The run's end, ev ({ type = "done" | "error", ... }), with a fallback
-- answer in place of an error of M.KINDS where the model gives one. c: the
-- session's conversation (rlm.engine.conversation).
function M.after(c, ev)
  local s = c.session
  local e = ev.err
  if ev.type ~= "error" or not s.opts.fallback or not M.KINDS[e.kind] or s.closed then
    return ev
  end
  -- The session has failed (the sandbox may be gone); it is polled once
  -- more for this call, and fails as before if no answer comes.
  local failed = s.failed
  s.failed = nil
  local text, usage, latency
  if type(e.partial) == "string" and e.partial ~= "" then
    text = e.partial -- the last-chance call already answered in prose
  else
    text, usage, latency = ask(c, e.message)
    if text and s.opts.on_event then
      s:_emit({ type = "root_response", step = c.iterations, response = text, latency_ms = latency,
        usage = usage, fallback = true })
    end
  end
  local ok, value
  if text then
    text = answer_text(text)
    ok, value = answer.check(s.opts, text)
  end
  if not ok or s.closed then
    s.failed = failed or s.failed
    e.partial_answer = text
    return ev
  end
  s.failed = nil
  s:_emit({ type = "final", step = c.iterations, answer = text, kind = "fallback", partial = true,
    reason = e.kind })
  local result = c:result({ kind = "fallback", answer = text, value = value })
  result.partial, result.reason = true, { kind = e.kind, message = e.message }
  return { type = "done", result = result }
end

return M
