-- A reasoning model's thinking, taken out of its reply before the reply is
-- read (rlm.engine.reply): it never runs and is never an answer. Servers
-- that pass it through raw (llama.cpp's --reasoning-format none, Ollama,
-- some vLLM set-ups) leave it in the text as <think>...</think> (Qwen3,
-- DeepSeek-R1, Kimi K2), a lone </think> (an R1-distill whose chat template
-- opened the tag), <thinking>, Kimi-VL's ◁think▷, Gemma 4's
-- <|channel>thought...<channel|>, or gpt-oss's Harmony channels (analysis
-- and commentary are reasoning; the final channel is the reply).
local M = {}

local PAIRS = {
  { "<think>", "</think>" },
  { "<thinking>", "</thinking>" },
  { "\226\151\129think\226\150\183", "\226\151\129/think\226\150\183" }, -- ◁think▷ ◁/think▷
  { "<|channel>", "<channel|>" },
}

-- The fence open after line, given the one open before it (nil: none): a
-- run of ``` or ~~~ opens one; a line of a run as long, of the same
-- character and nothing else, closes it.
local function fence_after(fence, line)
  local run = line:match("^[ \t]*(```+)") or line:match("^[ \t]*(~~~+)")
  if not fence then
    return run
  end
  if run and run:sub(1, 1) == fence:sub(1, 1) and #run >= #fence and line:match("^[ \t]*[`~]+[ \t]*$") then
    return nil
  end
  return fence
end

-- Whether position pos of text is inside a ``` or ~~~ fence opened
-- after position from (the lines between read as rlm.engine.reply reads them).
local function in_fence(text, from, pos)
  local fence
  local at = from
  while at <= pos do
    local eol = text:find("\n", at, true) or #text + 1
    if eol > pos then
      break
    end
    fence = fence_after(fence, text:sub(at, eol - 1))
    at = eol + 1
  end
  return fence ~= nil
end

-- The first opening tag at or after pos that is outside the fences: its
-- position and its pair. One walk over the lines, as in_fence's.
local function next_open(text, pos)
  local fence, at = nil, pos
  while at <= #text do
    local eol = text:find("\n", at, true) or #text + 1
    local line = text:sub(at, eol - 1)
    local before = fence
    fence = fence_after(fence, line)
    if not before and not fence then
      local best, pair
      for _, p in ipairs(PAIRS) do
        local found = line:find(p[1], 1, true)
        if found and (not best or found < best) then
          best, pair = found, p
        end
      end
      if best then
        return at + best - 1, pair
      end
    end
    at = eol + 1
  end
end

-- A closing tag before any opening one: the reasoning of a reply whose
-- opening tag was the chat template's. Taken when it is outside the
-- fences, or on a line of its own (code that holds "</think>" in a string
-- is neither).
local function lone_close(text)
  for _, p in ipairs(PAIRS) do
    local at = text:find(p[2], 1, true)
    local open = text:find(p[1], 1, true)
    if at and (not open or open > at) then
      local line_start = (text:sub(1, at - 1):match(".*()\n") or 0) + 1
      local line_end = (text:find("\n", at, true) or #text + 1) - 1
      local alone = text:sub(line_start, line_end):match("^%s*(.-)%s*$") == p[2]
      if alone or not in_fence(text, 1, at) then
        return text:sub(1, at - 1), text:sub(at + #p[2])
      end
    end
  end
end

local function tags(text, reasoning)
  local before, after = lone_close(text)
  if before then
    reasoning[#reasoning + 1] = before
    text = after
  end
  local out, pos = {}, 1
  while true do
    local at, pair = next_open(text, pos)
    if not at then
      out[#out + 1] = text:sub(pos)
      break
    end
    out[#out + 1] = text:sub(pos, at - 1)
    local close, close_end = text:find(pair[2], at + #pair[1], true)
    reasoning[#reasoning + 1] = text:sub(at + #pair[1], (close or #text + 1) - 1)
    if not close then
      break -- never closed: the model ran out of tokens thinking
    end
    pos = close_end + 1
  end
  return table.concat(out)
end

-- Harmony (gpt-oss): <|channel|>NAME<|message|>BODY up to the next special
-- token. The final channel's bodies are the reply; the others' are
-- reasoning; what is outside any message is kept when there is no final
-- channel. Served with its special tokens skipped, the reply reads
-- "analysis...assistantfinal...".
local function harmony(text, reasoning)
  if not text:find("<|channel|>", 1, true) then
    local start = text:match("^%s*analysis()")
    local last
    for at in text:gmatch("()assistantfinal") do
      last = at
    end
    if start and last then
      reasoning[#reasoning + 1] = text:sub(start, last - 1)
      return text:sub(last + #"assistantfinal")
    end
    return text
  end
  local finals, rest, pos = {}, {}, 1
  while true do
    local s, e = text:find("<|channel|>", pos, true)
    rest[#rest + 1] = text:sub(pos, (s or #text + 1) - 1)
    if not s then
      break
    end
    local m1, m2 = text:find("<|message|>", e + 1, true)
    if not m1 then
      reasoning[#reasoning + 1] = text:sub(e + 1)
      break
    end
    local stop = text:find("<|[%a_]+|>", m2 + 1) or #text + 1
    local body = text:sub(m2 + 1, stop - 1)
    if text:sub(e + 1, m1 - 1):match("^%s*final%f[^%w_]") then
      finals[#finals + 1] = body
    else
      reasoning[#reasoning + 1] = body
    end
    pos = stop
  end
  if #finals > 0 then
    return table.concat(finals, "\n")
  end
  return (table.concat(rest):gsub("<|start|>%a*", ""):gsub("<|[%a_]+|>", ""))
end

-- strip(response) -> the reply without its reasoning, and the reasoning
-- (nil when there was none).
function M.strip(response)
  if not (response:find("<", 1, true) or response:find("\226\151\129", 1, true)
    or response:find("assistantfinal", 1, true)) then
    return response
  end
  local reasoning = {}
  local reply = tags(harmony(response, reasoning), reasoning)
  if #reasoning == 0 then
    return reply -- Harmony's final channel alone: its tokens go, nothing else
  end
  return reply, table.concat(reasoning, "\n\n")
end

return M
