-- Root turns: ask the root model, run its code (rlm.engine.exec), record
-- the output; the engine's body. Methods of the conversation
-- (rlm.engine.conversation). Reading the final answer is
-- lua/rlm/engine/finals.lua's.
local errors = require("rlm.base.errors")
local feedback = require("rlm.engine.feedback")
local finals = require("rlm.engine.finals")
local reply_parser = require("rlm.engine.reply")
local IDLE = require("rlm.engine.loop").IDLE

local M = {}

-- Conversation methods (rlm.engine.conversation).
M.methods = {}
local C = M.methods

-- Asks the root model (through poll/reply) and waits for its answer. The
-- driver is idle meanwhile: anything it says is an error, and the step
-- deadline still runs. A compaction's call (rlm.engine.compact) fails
-- softly: false, why, and the digest stands in. req: the call already out
-- (the first, asked as the sandbox started: rlm.engine.opening).
function C:call_root(messages, compaction, req)
  local s = self.session
  local ok, err
  if not req then
    ok, err = s:_check_budget()
    if not ok then
      return nil, err
    end
    -- The conversation itself, not a copy: it is only appended to, so a
    -- step costs the same at step 2,000 as at step 10 (docs/api.md: read
    -- it, do not modify it; copy what you keep).
    req = s.scheduler:request({ type = "root_llm", messages = messages, depth = s.depth,
      compaction = compaction })
  end
  while true do
    local kind, a, b, c = s.engine:wait(true)
    if kind ~= "reply" and kind ~= "soft" then
      local _
      _, err = s.sandbox:message({ fatal = true }, kind, a, b, c)
      if not err then
        err = select(2, s:_error("protocol_error", "the driver spoke while the root model was asked"))
      end
      return nil, err
    end
    if kind == "soft" then
      -- Given up: a late answer is dropped (reply() returns false).
      s.scheduler:forget(req.id)
      if compaction then
        return false, ("root_llm did not answer within root_timeout_ms (%.0f ms)"):format(self.opts.root_timeout_ms)
      end
      return nil, self:root_failed(("root_llm did not answer within root_timeout_ms (%.0f ms)")
        :format(self.opts.root_timeout_ms), { timeout_ms = self.opts.root_timeout_ms })
    end
    if a.request == req and (compaction or not s.parent) and (a.failed or type(a.text) ~= "string") then
      local why = a.failed and ("root_llm raised: " .. tostring(a.message))
        or ("root_llm returned " .. type(a.text) .. ", not a string")
      if compaction then
        return false, why
      end
      return nil, self:root_failed(why)
    elseif a.request == req then
      local text, usage = s:_model_result("root_llm", a)
      if not text then
        return nil, usage
      end
      ok, err = s:_emit({ type = "root_response", step = self.iterations, response = text,
        latency_ms = a.at - req.t0, usage = usage, compaction = compaction })
      if not ok then
        return nil, err
      end
      if self.opts.compact and not compaction then
        self.compactor:sent(messages, usage) -- the size measure of compaction (rlm.engine.compact)
      end
      return text, usage
    end
  end
end

-- A root call that failed (raised, returned nil, err, or timed out) leaves
-- the session as it is: the error goes to run() or step(), and the next
-- run() or step() asks again, with the REPL intact. (A nested session's
-- root call fails its rlm_query instead.)
function C:root_failed(message, fields)
  local err = errors.new("callback_error", message, fields)
  err.resumable, err.history = true, self.history
  return err
end

-- Runs the blocks of one response; returns the history entry and the
-- output texts for the model. sole[i]: block i is only a final.
function C:run_blocks(response, blocks, sole)
  local s = self.session
  sole = sole or {}
  local entry = { response = response, blocks = {} }
  local codes, outs, texts, first_error = {}, {}, {}, nil
  for i, code in ipairs(blocks) do
    local res, err = self:exec(sole[i] and finals.final_code(sole[i]) or code)
    if not res then
      return nil, err
    end
    entry.blocks[i] = { code = code, stdout = res.stdout, error = res.error }
    codes[#codes + 1], outs[#outs + 1] = code, res.stdout
    first_error = first_error or res.error
    texts[#texts + 1] = feedback.exec_output(i, #blocks, res.stdout, res.error)
    local ok
    ok, err = s:_emit({ type = "exec_result", step = self.iterations, block = i,
      code = code, stdout = res.stdout, error = res.error })
    if not ok then
      return nil, err
    end
    if res.final then
      entry.final = finals.final_of(res.final)
      entry.final.source = "code"
      break
    end
    entry.final = sole[i] and finals.text_final(sole[i], res)
    if entry.final then
      break
    end
    if res.interrupted then
      break -- the turn's time is spent: the rest of its blocks do not run
    end
  end
  entry.code = table.concat(codes, "\n\n")
  entry.stdout = table.concat(outs, "")
  entry.error = first_error
  return entry, texts
end

-- What one response does: its blocks run in order; its prose FINAL or
-- FINAL_VAR is taken alone, or beside code once every block ran without
-- an error when it is a FINAL_VAR or a FINAL of code (the value the
-- model's code computed, as the reference reads FINAL_VAR); a FINAL of
-- text beside code is a guess (the model had not seen the code's output).
-- Returns the history entry and the feedback for the model.
function C:act(response)
  local reply = reply_parser.parse(response)
  local entry, texts = { response = response, code = "", stdout = "", blocks = {} }, {}
  if #reply.blocks > 0 then
    entry, texts = self:run_blocks(response, reply.blocks, reply.sole_finals)
    if not entry then
      return nil, texts
    end
  end
  if reply.reasoning then
    -- Kept in the log and the history; the conversation gets the reply
    -- without it, as reasoning models' chat templates send it back.
    entry.reasoning = reply.reasoning
    entry.sent = reply.only_reasoning and "(reasoning only, no reply)" or reply_parser.without_reasoning(response)
  end
  local f = reply.finals[1]
  if f and not entry.final then
    if entry.error then
      texts[#texts + 1] = "Your FINAL line was not taken as the answer, because a block raised an " ..
        "error: fix it, check the result, and answer again."
    else
      local final, why, err = self:prose_final(f)
      if err then
        return nil, err
      end
      local guess = #reply.blocks > 0 and final and final.literal
      if guess then
        final, why = nil, "Your FINAL line was not taken as the answer, because you wrote it before you saw what "
          .. "your code printed: check the output above, then answer with a FINAL line in a response with no code."
      end
      entry.final = final
      if why then
        entry.error = not guess and why or nil
        texts[#texts + 1] = why
      end
    end
  end
  for _, note in ipairs(reply.notes) do
    texts[#texts + 1] = note
  end
  if #reply.blocks == 0 and not f and not reply.conflict then
    table.insert(texts, 1, reply.only_reasoning and feedback.REASONING_ONLY
      or (not response:find("%S") and feedback.EMPTY_REPLY) or feedback.NO_CODE)
  end
  entry.skipped = #reply.notes > 0 and reply.notes or nil
  return entry, texts
end

function C:record(entry, told)
  local s = self.session
  self.messages[#self.messages + 1] = { role = "assistant", content = entry.sent or entry.response }
  if told then
    self.messages[#self.messages + 1] = { role = "user", content = told }
  end
  self.history[#self.history + 1] = entry
  if entry.final then
    self.final = entry.final
    return s:_emit({ type = "final", step = self.iterations, answer = entry.final.answer,
      kind = entry.final.kind, source = entry.final.source, partial = entry.final.partial,
      reason = entry.final.reason and entry.final.reason.kind })
  end
  return true
end

-- Turns used and left, sub-calls used and left: the last line of every
-- REPL output message.
function C:status()
  local s = self.session
  return feedback.status({ used = self.iterations - (self.turn_base or 0), max = self.opts.max_iterations,
    sub_calls = s.tree.sub_calls, max_sub_calls = self.opts.max_sub_calls })
end

-- One root turn: ask the root model, run the code it wrote, record the
-- output for the model. Returns the history entry, or nil, err.
function C:turn()
  local s = self.session
  -- The run's first call went out as the sandbox started, and its step
  -- began then (rlm.engine.opening); root_timeout_ms counts from it.
  local first, ok, err = self:take_first(), true, nil
  self.iterations = self.iterations + 1
  if not first then
    ok, err = s:_emit({ type = "step_start", step = self.iterations })
    if ok then
      ok, err = self.compactor:if_due() -- option compact (rlm.engine.compact)
    end
  end
  if not ok then
    return nil, err
  end
  s.clock:arm_root(s.sandbox.driver, first and first.t0)
  local response
  response, err = self:call_root(self.messages, nil, first)
  if not response then
    if err.resumable then
      s.clock:disarm(s.sandbox.driver)
      self.iterations = self.iterations - 1 -- the turn is asked again
    end
    return nil, err
  end
  s.clock:arm_step(s.sandbox.driver)
  local entry, texts = self:act(response)
  s.sandbox:remove_canaries() -- a turn with no code: the start's go now (rlm.engine.boot)
  if not entry then
    return nil, texts
  end
  local complaint
  complaint, err = self:check_answer(entry, "") -- rlm.engine.answer
  if not complaint then
    return nil, err
  end
  if complaint ~= "" then
    texts[#texts + 1] = complaint
  end
  s.clock:disarm(s.sandbox.driver)
  texts[#texts + 1] = self:status()
  ok, err = self:record(entry, table.concat(texts, "\n\n"))
  if not ok then
    return nil, err
  end
  return entry
end

function C:result(final)
  local s = self.session
  local tokens = s.tree.tokens
  return {
    answer = final.answer,
    value = final.value,
    kind = final.kind,
    var = final.var,
    answer_source = final.source,
    partial = final.partial,
    reason = final.reason,
    iterations = self.iterations,
    sub_calls = s.tree.sub_calls,
    tokens = { input = tokens.input, output = tokens.output, total = tokens.total },
    cache_hits = s.tree.cache and s.tree.cache.hits or 0,
    compactions = self.compactor.count or 0,
    history = self.history,
    sandbox = s.sandbox.info,
    resumed = s.journal and s.journal.resumed,
  }
end

-- The engine's body: boot once, then root turns until the goal is met. A
-- "step" event marks the end of each turn; the engine goes on only when
-- polled again, so step() can stop between turns.
function C:main()
  local s = self.session
  local ev = require("rlm.engine.fallback").after(self, self:run_turns())
  local r, e = ev.result, ev.err
  if r and s.journal then
    local diverged = s.journal.diverged -- a resume that went on past a divergence: never a plain success
    if diverged and not r.partial then
      r.partial, r.reason = true, diverged
    end
    s.journal:finish() -- the run gave its answer: its entries go (a failure to is the store's ttl's)
  end
  local tokens = s.tree.tokens
  local ok, err = s:_emit({ type = "run_end", ok = r ~= nil, answer = r and r.answer,
    error_kind = e and e.kind, error_message = e and e.message, iterations = self.iterations,
    sub_calls = s.tree.sub_calls, tokens = { input = tokens.input, output = tokens.output,
      total = tokens.total }, cache_hits = s.tree.cache and s.tree.cache.hits or nil,
    compactions = self.compactor.count })
  if not ok and not e then
    return { type = "error", err = err }
  end
  return ev
end

function C:run_turns()
  local s = self.session
  if not s.parent then
    s.tree:start_clock() -- max_wall_ms counts from here, over the tree
  end
  if s.system_problem then
    return { type = "error", err = select(2, s:_error("callback_error", s.system_problem)) }
  end
  local journal = s.journal
  if journal then
    local ok, err = journal:begin() -- the lease and the head (rlm.engine.journal)
    if not ok then
      return { type = "error", err = err }
    end
  end
  if not s.sandbox.started then
    local ok, err = require("rlm.engine.opening").open(s) -- the start, the first call out meanwhile
    if not ok then
      return { type = "error", err = err }
    end
  end
  while true do
    -- step() after the final answer asks for one more turn of the same
    -- conversation; anything else ends the run with the answer.
    if self.final and not self.more_turns then
      return { type = "done", result = self:result(self.final) }
    end
    if self:turns_spent() then
      self.turns_over = true
      -- The one place where a run that spent its turns ends: the last-chance
      -- call (rlm.engine.finals), and the fallback answer after it (main).
      local result, err = self:last_chance()
      if not result then
        err.resumable = nil -- the run ends here
        return { type = "error", err = err }
      end
      return { type = "done", result = result }
    end
    self.more_turns = nil
    local before = #self.messages
    local entry, err = self:turn()
    if entry and journal then
      local ok
      ok, err = journal:step_done(self, entry, before)
      if not ok then
        return { type = "error", err = err }
      end
    end
    if entry and journal and journal:replaying(self.iterations) then -- luacheck: ignore 542
      -- A step a resume runs again: the run goes on without a stop.
    elseif not entry and err.resumable and not s.closed then
      -- Reported, not the end: polled again, the turn is asked again. The
      -- journal's lease goes meanwhile, its entries stay (rlm.engine.renewal).
      if journal then
        journal.renewal:suspend(journal)
      end
      s.scheduler:post({ type = "error", err = err })
      coroutine.yield(IDLE)
      if journal then
        local ok
        ok, err = journal:begin()
        if not ok then
          return { type = "error", err = err }
        end
      end
    elseif not entry then
      return { type = "error", err = err }
    else
      s.scheduler:post({ type = "step", entry = entry })
      coroutine.yield(IDLE)
    end
  end
end

return M
