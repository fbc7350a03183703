-- Reading the final answer: a FINAL or FINAL_VAR the REPL ran, or one
-- written in prose; when the turns run out, the last-chance call and the
-- partial answer. Split from lua/rlm/engine/turn.lua, which runs the turns.
local errors = require("rlm.base.errors")
local feedback = require("rlm.engine.feedback")
local json = require("rlm.base.json")
local trim = require("rlm.engine.markup").trim
local reply_parser = require("rlm.engine.reply")
local util = require("rlm.base.util")

local M = {}

-- Conversation methods (rlm.engine.conversation).
M.methods = {}
local C = M.methods

-- FINAL_VAR's value travels once: the answer is that string, or the
-- value's JSON text (made here, not sent twice). rlm.protocol lets through
-- no value that JSON cannot carry: one that would not encode raises (the
-- engine's protocol_error), never an answer of tostring's "table: 0x...".
function M.final_of(f)
  if f.kind == "var" then
    local answer = f.answer or f.value -- the driver's text where an int came as a string
    if type(answer) ~= "string" then
      answer = json.encode(f.value)
    end
    return { kind = "var", var = f.name, value = f.value, answer = answer }
  end
  return { kind = f.kind, value = f.value, answer = f.value }
end

-- Python's name rule, for FINAL_VAR's argument.
local function identifier(s)
  return s:match("^[%a_][%w_]*$") ~= nil
end

-- The code that runs for a final written in prose or as a block of its
-- own: FINAL_VAR takes a name, quoted or not (else an expression whose
-- value a variable holds); FINAL an expression.
function M.final_code(f)
  if f.kind == "var" then
    local name = trim(f.text)
    name = name:match([[^"(.*)"$]]) or name:match("^'(.*)'$") or name
    return identifier(name) and ("FINAL_VAR('%s')"):format(name) or ("FINAL_VAR(%s)"):format(f.text)
  end
  return "FINAL(" .. f.text .. ")"
end

-- A FINAL whose text is not Python (FINAL(text) did not compile: the
-- driver's syntax_error) answers with the text itself, as the reference
-- reads it. One that is Python and raised (a failed sub-call, a NameError,
-- 1/0, an answer too large) is no answer: an error the model sees.
function M.text_final(f, res)
  if f.kind == "final" and not f.strict and res.error and res.syntax_error then
    return { kind = "value", value = f.text, answer = f.text, source = "prose" }
  end
end

-- A FINAL(...) or FINAL_VAR(...) line of prose (or, in_code, a FINAL line
-- of a block at the last chance). FINAL's text is the answer as written
-- unless the driver finds it code (docs/prompt.md: a str literal, or an
-- expression of the model's variables or the REPL's functions): then its
-- value is, and an exception is an error. Returns the final, or nil and
-- what to tell the model; nil, nil, err when the session ended.
function C:prose_final(f, in_code)
  local prose = not in_code and f.kind == "final" and f.text or nil
  local res, err = self:exec(M.final_code(f), prose)
  if not res then
    return nil, nil, err
  end
  if prose and res.literal then
    -- A str literal's value, else the text as written.
    local text = type(res.value) == "string" and res.value or trim(f.text)
    return { kind = "value", value = text, answer = text, source = "prose", literal = true }
  end
  if res.final then
    local final = M.final_of(res.final)
    final.source = "prose"
    return final
  end
  local final = in_code and M.text_final(f, res)
  if final then
    return final
  end
  if f.kind == "final" then
    return nil, "Your FINAL line did not give an answer: it is code (it uses your variables or the REPL's "
      .. "functions), so it ran as Python, and it raised (text meant as text must not be code, or be quoted: "
      .. "FINAL(\"...\")):\n" .. (res.error or "(no error)")
  end
  return nil, "Your FINAL_VAR line did not give an answer:\n" .. (res.error or "(no error)")
end

-- The best answer a run without a final one has: what the REPL printed
-- last, else the prose of the model's last response.
function C:partial()
  for i = #self.history, 1, -1 do
    local out = self.history[i].stdout
    if out and out:match("%S") then
      return trim(out), "repl_output"
    end
  end
  for i = #self.history, 1, -1 do
    local text = reply_parser.parse(self.history[i].response or "").text
    if text ~= "" then
      return text, "response"
    end
  end
  return nil
end

-- When the turns run out: one more root call that may only answer. A
-- FINAL or FINAL_VAR (in prose, or a FINAL line of a block) is the answer;
-- else the response's plain text is (answer_source "text"). Nothing runs
-- but the final lines.
function C:last_chance()
  local s = self.session
  local compacted, why = self.compactor:if_due() -- option compact (rlm.engine.compact)
  if not compacted then
    return nil, why
  end
  self.messages[#self.messages + 1] = { role = "user", content = feedback.LAST_CHANCE }
  s.clock:arm_root(s.sandbox.driver)
  local response, err = self:call_root(self.messages)
  if not response then
    return nil, err
  end
  s.clock:arm_step(s.sandbox.driver)
  local reply = reply_parser.parse(response)
  local entry = { response = response, code = "", stdout = "", blocks = {}, last_chance = true }
  local final
  for i, f in ipairs(util.append({}, reply.finals, reply.code_finals)) do
    local _
    final, _, err = self:prose_final(f, i > #reply.finals)
    if err then
      return nil, err
    elseif final then
      break
    end
  end
  if not final and reply.text ~= "" and not reply.conflict then
    final = { kind = "text", value = reply.text, answer = reply.text, source = "text" }
  end
  s.clock:disarm(s.sandbox.driver)
  entry.final = final
  local checked
  checked, err = self:check_answer(entry, "") -- rlm.engine.answer
  if not checked then
    return nil, err
  end
  final = entry.final
  if final then
    -- Given without a turn to check it: partial, as a fallback answer is.
    final.partial, final.reason = true, { kind = "max_iterations", message = ("the answer was given "
      .. "after max_iterations (%d) root turns, without code"):format(self.opts.max_iterations) }
    local ok
    ok, err = self:record(entry, nil)
    if not ok then
      return nil, err
    end
    return self:result(final)
  end
  local partial, source = self:partial()
  return nil, errors.new("max_iterations", ("no final answer after max_iterations (%d) root turns")
    :format(self.opts.max_iterations), { history = self.history, partial = partial, partial_source = source })
end

return M
