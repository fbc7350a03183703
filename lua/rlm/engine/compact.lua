-- Compaction (option compact): when the root conversation passes
-- compact.at_tokens, the turns before the last compact.keep_turns are
-- replaced, in the first user message after the question, by a digest of
-- them (each turn's code, the first line of its output, its error, any
-- final answer) or by a summary the root model writes (compact.summary =
-- "model"), with the REPL's variables as the driver lists them. The
-- system prompt and the question stay as they are; the REPL keeps its
-- state; the history (result.history, err.partial) keeps every turn. A
-- collaborator of the conversation (rlm.engine.conversation), which makes
-- it and asks it before each root call.
local core = require("rlm.core")
local feedback = require("rlm.engine.feedback")
local textlib = require("rlm.base.text")

local M = {}

-- Every field of a compactor, in one place (spec/layers_spec.lua checks
-- that the engine sets no other).
---@class Compactor
---@field conversation Conversation the conversation it compacts
---@field option table|nil option compact: { at_tokens =, keep_turns =, summary = }
---@field done table|nil the current question's: { head = its first user message, turns = compacted }
---@field count integer|nil compactions run over the session's life
---@field sent_size table|nil the last root call's size: { bytes =, tokens = (its usage's input) }
local Compactor = {}
Compactor.__index = Compactor
local C = Compactor

function M.new(conversation)
  return setmetatable({ conversation = conversation, option = conversation.opts.compact }, Compactor)
end

-- The size measure's rate where the model reports no usage: 4 bytes a
-- token, the usual rate of English text under OpenAI's and Anthropic's
-- tokenizers (code and other scripts take more tokens a byte).
M.BYTES_PER_TOKEN = 4

-- A digest's turn: its code cut to this many characters, its output's
-- first line and its error's last to this many.
M.CODE_CHARS = 800
M.LINE_CHARS = 200

-- A compaction aims at half of compact.at_tokens, so that the next one
-- comes after some turns, not at the next: the digest (or the model's
-- summary) gets what is left of that half beside what stays (the system
-- prompt, the question, the kept turns, the variables, the notice). A
-- summary gets at least SUMMARY_MIN_BYTES; a digest at least its newest
-- turn.
M.SUMMARY_MIN_BYTES = 1000

-- The turns left out of the digest, or under a summary, still say which
-- had an error or a final answer (given, or refused): a line each, the
-- most recent MAX_FACTS of them.
M.MAX_FACTS = 20
local NOTICE_BYTES = 600 -- feedback.compacted's words around the digest
local LISTING = { vars = true, fatal = true } -- what the driver may say to list_vars
-- The bytes the conversation's contents take.
local function bytes_of(messages)
  local n = 0
  for i = 1, #messages do
    n = n + #messages[i].content
  end
  return n
end
M.bytes_of = bytes_of

-- A root call of this session's conversation was answered: what it sent,
-- in bytes and (as its usage reported) tokens, for the measure below.
function C:sent(messages, usage)
  self.sent_size = { bytes = bytes_of(messages), tokens = type(usage) == "table" and usage.input_tokens or nil }
end

-- The conversation's size in tokens as the next root call would send it:
-- the input tokens the last call reported, and the bytes added since at
-- BYTES_PER_TOKEN; without a report, all of its bytes at that rate.
function C:tokens(bytes)
  local sent = self.sent_size
  if sent and sent.tokens then
    return sent.tokens + math.ceil(math.max(bytes - sent.bytes, 0) / M.BYTES_PER_TOKEN)
  end
  return math.ceil(bytes / M.BYTES_PER_TOKEN)
end

-- The REPL's variables now, as the driver's own list_vars gives them
-- (docs/protocol.md): true and { vars = { { name, type, len }, ... },
-- more = n }, or true, nil without a sandbox; nil, err when the session
-- ended. Not an exec: no code of the REPL's runs (a rebound SHOW_VARS, a
-- class's __len__ or __name__), so no sub-call, tool call or budget is
-- involved; the driver answers in its own time, under step_timeout_ms.
function C:list_vars()
  local conv = self.conversation
  local s = conv.session
  local d = s.sandbox.driver
  if not d then
    return true, nil
  end
  local id = conv:next_id()
  local ok, err = s.sandbox:send({ type = "list_vars", id = id })
  if not ok then
    return nil, err
  end
  s.clock:disarm(d)
  s.clock:set(d, conv.opts.step_timeout_ms)
  local msg
  msg, err = s.sandbox:expect(LISTING)
  if not msg then
    return nil, err
  end
  s.clock:disarm(s.sandbox.driver)
  if msg.id ~= id then
    return s:_error("protocol_error", ("the driver answered list_vars %d, not %d"):format(msg.id, id))
  end
  return true, msg
end

-- The digest of turns 1..last (of this question): one entry a turn, made
-- again from its history entry each time, newest first within `budget`
-- bytes (the newest always). Returns the entries (oldest first) and how many of the oldest
-- were left out.
function C:digest(last, budget)
  local conv = self.conversation
  local base = conv.history_mark or 0
  local entries, used = {}, 0
  local earliest = last + 1
  for turn = last, 1, -1 do
    local text = feedback.digest_turn(turn, conv.history[base + turn] or {}, M.CODE_CHARS, M.LINE_CHARS)
    if used + #text > budget and turn < last then
      break
    end
    used = used + #text + 1
    table.insert(entries, 1, text)
    earliest = turn
  end
  return entries, earliest - 1
end

-- The facts of turns 1..upto (of this question) that had an error or a
-- final answer: the most recent MAX_FACTS lines (oldest first), and how
-- many more there were.
function C:facts(upto)
  local conv = self.conversation
  local base = conv.history_mark or 0
  local facts, dropped = {}, 0
  for turn = upto, 1, -1 do
    local fact = feedback.turn_fact(turn, conv.history[base + turn] or {}, M.LINE_CHARS)
    if fact and #facts < M.MAX_FACTS then
      table.insert(facts, 1, fact)
    elseif fact then
      dropped = dropped + 1
    end
  end
  return facts, dropped
end

-- The model's summary of the conversation: text, usage, or false, why (a
-- failed call: the digest stands in) or nil, err (the session ended).
function C:model_summary(first, last, keep, words)
  local conv = self.conversation
  local s = conv.session
  local copy = {}
  for i, m in ipairs(conv.messages) do
    copy[i] = { role = m.role, content = m.content }
  end
  copy[#copy + 1] = { role = "user", content = feedback.COMPACT_REQUEST:format(first, last, keep, words) }
  s.clock:arm_root(s.sandbox.driver)
  local text, usage = conv:call_root(copy, true)
  s.clock:disarm(s.sandbox.driver)
  return text, usage
end

-- Before a root call: when the conversation passes compact.at_tokens and
-- holds turns older than the last keep_turns, they go (see the top).
-- true, or nil, err when the session ended meanwhile.
function C:if_due()
  local c = self.option
  if not c then
    return true
  end
  local conv = self.conversation
  local messages = conv.messages
  local shown = math.floor((#messages - 2) / 2) -- whole turns: a response and its REPL output
  local old = shown - c.keep_turns
  if old < 1 then
    return true
  end
  local before = bytes_of(messages)
  local tokens = self:tokens(before)
  if tokens <= c.at_tokens then
    return true
  end
  local stays = #messages[1].content + NOTICE_BYTES
  for i = 3 + 2 * old, #messages do
    stays = stays + #messages[i].content
  end
  local t0 = core.now_ms()
  local state = self.done or { head = messages[2].content, turns = 0 }
  local first, last = state.turns + 1, state.turns + old
  local ok, listing = self:list_vars()
  if not ok then
    return nil, listing
  end
  local vars = listing and feedback.vars_listing(listing.vars, listing.more) or nil
  -- The digest, or the model's summary (about 6 bytes an English word),
  -- in what is left of half the bound.
  local budget = math.floor(c.at_tokens * M.BYTES_PER_TOKEN / 2) - stays - #state.head - #(vars or "")
  local summary, usage, why
  if c.summary == "model" then
    budget = math.max(budget, M.SUMMARY_MIN_BYTES)
    summary, usage = self:model_summary(1, last, c.keep_turns, math.floor(budget / 6))
    if summary == nil then
      return nil, usage
    elseif summary == false then
      summary, why = nil, usage
    else
      summary = textlib.cut(summary, budget, false)
    end
  end
  local entries, hidden
  if not summary then
    entries, hidden = self:digest(last, budget)
  end
  local facts, dropped = self:facts(summary and last or hidden)
  local text = feedback.compacted({ first = 1, last = last, summary = summary, entries = entries, hidden = hidden,
    facts = facts, dropped = dropped, vars = vars })
  messages[2] = { role = "user", content = state.head .. "\n\n" .. text }
  local n = #messages
  for i = 3, n do
    messages[i] = messages[i + 2 * old] -- nil past the kept turns
  end
  state.turns = last
  self.done = state
  self.count = (self.count or 0) + 1
  self.sent_size = nil
  local after = bytes_of(messages)
  return conv.session:_emit({ type = "compaction", step = conv.iterations, index = self.count, turns = old,
    first_turn = first, last_turn = last, kept_turns = c.keep_turns, bytes_before = before, bytes_after = after,
    tokens_before = tokens, tokens_after = math.ceil(after / M.BYTES_PER_TOKEN), at_tokens = c.at_tokens,
    summary = summary and "model" or "digest", summary_error = why, usage = usage,
    vars = listing and #listing.vars + listing.more or nil, latency_ms = core.now_ms() - t0 })
end

-- A follow-up question (rlm's ask): a new conversation, nothing of it
-- compacted yet.
function C:reset()
  self.done, self.sent_size = nil, nil
end

return M
