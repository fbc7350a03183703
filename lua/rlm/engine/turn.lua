-- Root turns: ask the root model, run its code, record the output; the
-- engine's body. Reading the final answer is lua/rlm/engine/finals.lua's.
local errors = require("rlm.base.errors")
local finals = require("rlm.engine.finals")
local prompt = require("rlm.engine.prompt")
local reply_parser = require("rlm.engine.reply")
local textlib = require("rlm.base.text")
local IDLE = require("rlm.engine.loop").IDLE

local M = {}

local EXEC_REPLIES = { exec_result = true, llm_query = true, llm_batch = true, rlm_query = true,
  rlm_batch = true, tool_call = true, fatal = true }

-- Runs one block of code; answers the driver's calls back meanwhile.
-- prose: the text of a prose FINAL line, which the driver runs (as code)
-- only when it is code (docs/prompt.md); else its result is `literal`.
function M:_exec(code, prose)
  self.next_exec_id = self.next_exec_id + 1
  self.interrupted = nil
  self.scheduler:exec_started()
  local id = self.next_exec_id
  local ok, err = self.sandbox:send({ type = "exec", id = id, code = code, prose = prose })
  if not ok then
    return nil, err
  end
  self.sandbox:remove_canaries() -- the start's, while the driver runs the code (rlm.boot)
  while true do
    local kind, a, b, c = self:_wait(true)
    if kind == "reply" then
      ok, err = self.scheduler:answer(a)
    elseif kind == "soft" then
      ok, err = self:_interrupt()
    elseif kind == "child" then
      ok, err = self.nested:done(a, b)
    else
      local msg
      msg, err = self.sandbox:message(EXEC_REPLIES, kind, a, b, c)
      if msg and msg.type == "exec_result" then
        return self:_exec_done(msg, id)
      end
      ok = msg ~= nil
      if ok then
        ok, err = self.scheduler:query(msg)
      end
    end
    if not ok then
      return nil, err
    end
  end
end

function M:_exec_done(msg, id)
  if msg.id ~= id then
    return self:_error("protocol_error", ("the driver answered exec %d while exec %d ran"):format(msg.id, id))
  end
  -- A hostile driver may end an exec with calls still out.
  self.scheduler:exec_ended()
  self.nested:end_all()
  if not self.nested:running() and self.sandbox.driver then
    self.clock:resume(self.sandbox.driver)
  end
  local limit = self.opts.stdout_truncate_chars
  msg.stdout = textlib.cut(msg.stdout, limit, false)
  msg.error = msg.error and textlib.cut(msg.error, limit, true) or nil
  if self.interrupted then
    msg.interrupted = true
    msg.error = (msg.error and msg.error .. "\n" or "") .. self:_interrupt_note()
  end
  return msg
end

-- What the model is told after an interrupted block.
function M:_interrupt_note()
  return ("[the step ran past step_timeout_ms (%.0f ms) and was interrupted: this block's changes were rolled "
    .. "back and the rest of the turn's blocks did not run; do less per step (smaller chunks, fewer calls)]")
    :format(self.opts.step_timeout_ms)
end

-- The step ran out of time: SIGINT to the driver (a KeyboardInterrupt in
-- the code), the call it waits on answered with `interrupted`, and any call
-- it makes from now on too; the sandbox dies at the hard deadline unless
-- the exec ends first.
function M:_interrupt()
  self.interrupted = true
  self.scheduler:drop_held()
  self.nested:end_all()
  self.clock:interrupted(self.sandbox.driver)
  self.sandbox.driver:interrupt()
  local ok, err = self:_emit({ type = "interrupt", step = self.iterations,
    timeout_ms = self.opts.step_timeout_ms, grace_ms = self.opts.sandbox.interrupt_grace_ms })
  if not ok then
    return nil, err
  end
  local answer = self.scheduler:interrupt_open()
  if answer then
    return self.sandbox:send(answer)
  end
  return true
end

-- Asks the root model (through poll/reply) and waits for its answer. The
-- driver is idle meanwhile: anything it says is an error, and the step
-- deadline still runs. A compaction's call (rlm.engine.compact) fails
-- softly: false, why, and the digest stands in. req: the call already out
-- (the first, asked as the sandbox started: rlm.engine.opening).
function M:_call_root(messages, compaction, req)
  local ok, err
  if not req then
    ok, err = self:_check_budget()
    if not ok then
      return nil, err
    end
    -- The conversation itself, not a copy: it is only appended to, so a
    -- step costs the same at step 2,000 as at step 10 (docs/api.md: read
    -- it, do not modify it; copy what you keep).
    req = self.scheduler:request({ type = "root_llm", messages = messages, depth = self.depth,
      compaction = compaction })
  end
  while true do
    local kind, a, b, c = self:_wait(true)
    if kind ~= "reply" and kind ~= "soft" then
      local _
      _, err = self.sandbox:message({ fatal = true }, kind, a, b, c)
      if not err then
        err = select(2, self:_error("protocol_error", "the driver spoke while the root model was asked"))
      end
      return nil, err
    end
    if kind == "soft" then
      -- Given up: a late answer is dropped (reply() returns false).
      self.scheduler:forget(req.id)
      if compaction then
        return false, ("root_llm did not answer within root_timeout_ms (%.0f ms)"):format(self.opts.root_timeout_ms)
      end
      return nil, self:_root_failed(("root_llm did not answer within root_timeout_ms (%.0f ms)")
        :format(self.opts.root_timeout_ms), { timeout_ms = self.opts.root_timeout_ms })
    end
    if a.request == req and (compaction or not self.parent) and (a.failed or type(a.text) ~= "string") then
      local why = a.failed and ("root_llm raised: " .. tostring(a.message))
        or ("root_llm returned " .. type(a.text) .. ", not a string")
      if compaction then
        return false, why
      end
      return nil, self:_root_failed(why)
    elseif a.request == req then
      local text, usage = self:_model_result("root_llm", a)
      if not text then
        return nil, usage
      end
      ok, err = self:_emit({ type = "root_response", step = self.iterations, response = text,
        latency_ms = a.at - req.t0, usage = usage, compaction = compaction })
      if not ok then
        return nil, err
      end
      if self.opts.compact and not compaction then
        self:_sent(messages, usage) -- the size measure of compaction (rlm.engine.compact)
      end
      return text, usage
    end
  end
end

-- A root call that failed (raised, returned nil, err, or timed out) leaves
-- the session as it is: the error goes to run() or step(), and the next
-- run() or step() asks again, with the REPL intact. (A nested session's
-- root call fails its rlm_query instead.)
function M:_root_failed(message, fields)
  local err = errors.new("callback_error", message, fields)
  err.resumable, err.history = true, self.history
  return err
end

-- Runs the blocks of one response; returns the history entry and the
-- output texts for the model. sole[i]: block i is only a final.
function M:_run_blocks(response, blocks, sole)
  sole = sole or {}
  local entry = { response = response, blocks = {} }
  local codes, outs, texts, first_error = {}, {}, {}, nil
  for i, code in ipairs(blocks) do
    local res, err = self:_exec(sole[i] and finals.final_code(sole[i]) or code)
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
function M:_act(response)
  local reply = reply_parser.parse(response)
  local entry, texts = { response = response, code = "", stdout = "", blocks = {} }, {}
  if #reply.blocks > 0 then
    entry, texts = self:_run_blocks(response, reply.blocks, reply.sole_finals)
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
      local final, why, err = self:_prose_final(f)
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
    table.insert(texts, 1, reply.only_reasoning and prompt.REASONING_ONLY
      or (not response:find("%S") and prompt.EMPTY_REPLY) or prompt.NO_CODE)
  end
  entry.skipped = #reply.notes > 0 and reply.notes or nil
  return entry, texts
end

function M:_record(entry, feedback)
  self.messages[#self.messages + 1] = { role = "assistant", content = entry.sent or entry.response }
  if feedback then
    self.messages[#self.messages + 1] = { role = "user", content = feedback }
  end
  self.history[#self.history + 1] = entry
  if entry.final then
    self.final = entry.final
    return self:_emit({ type = "final", step = self.iterations, answer = entry.final.answer,
      kind = entry.final.kind, source = entry.final.source, partial = entry.final.partial,
      reason = entry.final.reason and entry.final.reason.kind })
  end
  return true
end

-- Turns used and left, sub-calls used and left: the last line of every
-- REPL output message.
function M:_status()
  return prompt.status({ used = self.iterations - (self.turn_base or 0), max = self.opts.max_iterations,
    sub_calls = self.tree.sub_calls, max_sub_calls = self.opts.max_sub_calls })
end

-- One root turn: ask the root model, run the code it wrote, record the
-- output for the model. Returns the history entry, or nil, err.
function M:_turn()
  -- The run's first call went out as the sandbox started, and its step
  -- began then (rlm.engine.opening); root_timeout_ms counts from it.
  local first, ok, err = self.first_call, true, nil
  self.first_call = nil
  self.iterations = self.iterations + 1
  if not first then
    ok, err = self:_emit({ type = "step_start", step = self.iterations })
    if ok then
      ok, err = self:_compact_if_due() -- option compact (rlm.engine.compact)
    end
  end
  if not ok then
    return nil, err
  end
  self.clock:arm_root(self.sandbox.driver, first and first.t0)
  local response
  response, err = self:_call_root(self.messages, nil, first)
  if not response then
    if err.resumable then
      self.clock:disarm(self.sandbox.driver)
      self.iterations = self.iterations - 1 -- the turn is asked again
    end
    return nil, err
  end
  self.clock:arm_step(self.sandbox.driver)
  local entry, texts = self:_act(response)
  self.sandbox:remove_canaries() -- a turn with no code: the start's go now (rlm.boot)
  if not entry then
    return nil, texts
  end
  local complaint
  complaint, err = self:_check_answer(entry, "") -- rlm.answer
  if not complaint then
    return nil, err
  end
  if complaint ~= "" then
    texts[#texts + 1] = complaint
  end
  self.clock:disarm(self.sandbox.driver)
  texts[#texts + 1] = self:_status()
  ok, err = self:_record(entry, table.concat(texts, "\n\n"))
  if not ok then
    return nil, err
  end
  return entry
end

function M:_result(final)
  local tokens = self.tree.tokens
  return {
    answer = final.answer,
    value = final.value,
    kind = final.kind,
    var = final.var,
    answer_source = final.source,
    partial = final.partial,
    reason = final.reason,
    iterations = self.iterations,
    sub_calls = self.tree.sub_calls,
    tokens = { input = tokens.input, output = tokens.output, total = tokens.total },
    cache_hits = self.tree.cache and self.tree.cache.hits or 0,
    compactions = self.compactions or 0,
    history = self.history,
    sandbox = self.sandbox.info,
  }
end

-- The one place where a run that spent its turns ends: the last-chance
-- call, and (rlm.fallback, when configured) anything after it.
function M:_out_of_turns()
  return self:_last_chance()
end

-- max_iterations counts the root turns of one question.
function M:_turns_spent()
  return self.iterations - (self.turn_base or 0) >= self.opts.max_iterations
end

-- The engine's body: boot once, then root turns until the goal is met. A
-- "step" event marks the end of each turn; the engine goes on only when
-- polled again, so step() can stop between turns.
function M:_main()
  local ev = require("rlm.engine.fallback").after(self, self:_run_turns())
  local r, e = ev.result, ev.err
  local tokens = self.tree.tokens
  local ok, err = self:_emit({ type = "run_end", ok = r ~= nil, answer = r and r.answer,
    error_kind = e and e.kind, error_message = e and e.message, iterations = self.iterations,
    sub_calls = self.tree.sub_calls, tokens = { input = tokens.input, output = tokens.output,
      total = tokens.total }, cache_hits = self.tree.cache and self.tree.cache.hits or nil,
    compactions = self.compactions })
  if not ok and not e then
    return { type = "error", err = err }
  end
  return ev
end

function M:_run_turns()
  if not self.parent then
    self.tree:start_clock() -- max_wall_ms counts from here, over the tree
  end
  if self.system_problem then
    return { type = "error", err = select(2, self:_error("callback_error", self.system_problem)) }
  end
  if not self.sandbox.started then
    local ok, err = self:_open() -- rlm.engine.opening: the start, the first call out meanwhile
    if not ok then
      return { type = "error", err = err }
    end
  end
  while true do
    -- step() after the final answer asks for one more turn of the same
    -- conversation; anything else ends the run with the answer.
    if self.final and not self.more_turns then
      return { type = "done", result = self:_result(self.final) }
    end
    if self:_turns_spent() then
      self.turns_over = true
      local result, err = self:_out_of_turns()
      if not result then
        err.resumable = nil -- the run ends here
        return { type = "error", err = err }
      end
      return { type = "done", result = result }
    end
    self.more_turns = nil
    local entry, err = self:_turn()
    if not entry and err.resumable and not self.closed then
      -- Reported, not the end: polled again, the turn is asked again.
      self.scheduler:post({ type = "error", err = err })
      coroutine.yield(IDLE)
    elseif not entry then
      return { type = "error", err = err }
    else
      self.scheduler:post({ type = "step", entry = entry })
      coroutine.yield(IDLE)
    end
  end
end

return M
