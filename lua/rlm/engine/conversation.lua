-- The root model's conversation and its turns: a collaborator of the
-- session (docs/architecture.md, "Who owns what"), made with it and held as
-- session.conversation. It holds what the model was told and what it did
-- (the messages, the history, the turns taken, the answer) and runs the
-- turns: asking the root model, running the code it wrote (rlm.engine.turn,
-- exec) and reading the answer (rlm.engine.finals, answer): those files
-- hold its methods, by job. Its compactor (rlm.engine.compact, option
-- compact) shortens it when it grows long. It reaches the rest of the
-- session (its sandbox, scheduler, clock, events, how it fails) through
-- `session`.
local compact = require("rlm.engine.compact")
local prompt = require("rlm.engine.prompt")
local reply_parser = require("rlm.engine.reply")

local M = {}

-- Every field of a conversation, in one place (spec/layers_spec.lua checks
-- that the engine sets no other).
---@class Conversation
---@field session Session the session whose conversation it is
---@field opts table the session's checked options
---@field messages table the root model's conversation
---@field history table the steps so far (err.history, result.history)
---@field iterations integer turns taken
---@field next_exec_id integer the current exec's id (the scheduler drops a reply to an older one)
---@field interrupted boolean|nil the current exec ran out of time
---@field first_call table|nil the root call that went out while the sandbox started, till a turn takes it
---@field final table|nil the answer, once given
---@field turns_over boolean|nil max_iterations is spent
---@field more_turns boolean|nil step() after the answer goes on (ask)
---@field asked table|nil the earlier questions and answers of ask()
---@field question string|nil the current follow-up question
---@field history_mark integer|nil where the current question's steps begin
---@field turn_base integer|nil the turns taken before the current question
---@field compactor Compactor shortens the messages when they grow long (rlm.engine.compact)
local Conversation = {}
Conversation.__index = Conversation

-- The conversation of session, opened with its system prompt and the
-- question (option query).
function M.new(session, system)
  local self = setmetatable({
    session = session,
    opts = session.opts,
    messages = {
      { role = "system", content = system },
      { role = "user", content = prompt.first_user(session.opts.query) },
    },
    history = {},
    iterations = 0,
    next_exec_id = 0,
  }, Conversation)
  self.compactor = compact.new(self)
  return self
end

-- The next exec's id (an exec, or the driver's list_vars).
function Conversation:next_id()
  self.next_exec_id = self.next_exec_id + 1
  return self.next_exec_id
end

-- A resume by re-attach (rlm.engine.reattach): the conversation after
-- `steps` done steps (done: step n -> its journal record), none of them
-- run again, and the last exec's id. Their history entries hold what the
-- journal has: the response, its code, the output as the model was told
-- it (`told`), and `restored`.
function Conversation:restore(done, steps, exec_id)
  local messages = self.messages
  for n = 1, steps do
    local entry = { response = "", code = "", stdout = "", blocks = {}, restored = true }
    for _, m in ipairs(done[n].messages) do
      messages[#messages + 1] = { role = m.role, content = m.content }
      if m.role == "assistant" then
        entry.response = m.content
        local blocks = reply_parser.parse(m.content).blocks
        entry.code = table.concat(blocks, "\n\n")
      elseif m.role == "user" then
        entry.told = m.content
      end
    end
    self.history[n] = entry
  end
  self.iterations, self.next_exec_id = math.floor(steps), math.floor(exec_id) -- JSON's numbers: integers
end

-- The run's first root call went out while the sandbox started
-- (rlm.engine.opening): its turn is counted meanwhile, for the step its
-- root_delta events name.
function Conversation:first_out(req)
  self.first_call = req
  self.iterations = self.iterations + 1
end

-- The sandbox's start is over with the first call still out: the turn
-- that takes it counts it again.
function Conversation:first_waits()
  if self.first_call then
    self.iterations = self.iterations - 1
  end
end

-- The first call, taken once (by the first turn, or dropped as the start
-- failed).
function Conversation:take_first()
  local req = self.first_call
  self.first_call = nil
  return req
end

-- max_iterations counts the root turns of one question.
function Conversation:turns_spent()
  return self.iterations - (self.turn_base or 0) >= self.opts.max_iterations
end

-- step() after the final answer: one more turn of the same conversation.
function Conversation:go_on()
  self.more_turns = true
end

-- A follow-up question (rlm's ask): a new conversation in the same REPL,
-- opened with a short summary of the earlier ones, each answer cut to
-- limit characters. History and counters carry on.
function Conversation:next_question(question, limit)
  self.asked = self.asked or {}
  self.asked[#self.asked + 1] = { question = self.question or self.opts.query,
    answer = self.final.answer, steps = #self.history - (self.history_mark or 0) }
  self.question, self.history_mark = question, #self.history
  self.messages = {
    self.messages[1],
    { role = "user", content = prompt.follow_up(self.asked, question, limit) },
  }
  self.final, self.turns_over = nil, nil
  self.compactor:reset()
  self.turn_base = self.iterations
end

for _, name in ipairs({ "turn", "exec", "finals", "answer" }) do
  for k, fn in pairs(require("rlm.engine." .. name).methods) do
    assert(Conversation[k] == nil, k)
    Conversation[k] = fn
  end
end

M.Conversation = Conversation
return M
