-- Other model families' forms (docs/prompt.md, "Other families' forms"),
-- rewritten into the blocks and FINAL lines rlm.engine.reply's parse
-- reads, outside the fences: Anthropic's XML tool call (<function_calls>
-- <invoke name="repl"><parameter name="code">, with or without the antml:
-- prefix), the
-- Hermes/Qwen <tool_call>{"name": "repl", "arguments": {"code": ...}}, GLM's
-- <|begin_of_box|>...<|end_of_box|> and an <answer>...</answer>. Strict: a
-- call to another tool, a second parameter, anything but whitespace
-- between the calls or an unclosed tag runs nothing, and the note says why.
local json = require("rlm.base.json")
local markup = require("rlm.engine.markup")

local final_at, open_fence, fence_end = markup.final_at, markup.open_fence, markup.fence_end
local split_lines, trim = markup.split_lines, markup.trim

local M = {}

-- The tool names whose call runs its "code" argument.
local CALL_NAMES = { repl = true, python = true, python3 = true, py = true, ipython = true, python_repl = true,
  run_python = true, execute_python = true, run_code = true, execute_code = true }
M.CALL_NOT_RUN = "A %s tool call did not run: %s. Only a call to \"repl\" (or \"python\") with one \"code\" "
  .. "argument runs; or write the code in a ```repl block."

-- The fenced block lines that hold code: a fence longer than its longest
-- run of backticks.
local function fenced(code, out)
  local longest = 3
  for run in code:gmatch("`+") do
    longest = math.max(longest, #run + 1)
  end
  local fence = ("`"):rep(longest)
  out[#out + 1] = fence .. "repl"
  for _, l in ipairs(split_lines((code:gsub("^[ \t]*\r?\n", ""):gsub("%s+$", "")))) do
    out[#out + 1] = l
  end
  out[#out + 1] = fence
end

-- The code of one XML invoke (the part between <invoke ...> and
-- </invoke>), or nil and why not.
local function invoke_code(name, body, prefix)
  if not CALL_NAMES[name] then
    return nil, ("it calls %q, which is no tool here"):format(name:sub(1, 40))
  end
  local param, open_end = body:match("^%s*<" .. prefix .. "parameter%s+name%s*=%s*[\"']([%w_]+)[\"']%s*>()")
  local close = param and body:match(".*()</" .. prefix .. "parameter>%s*$")
  if not close then
    return nil, "its arguments are not one <parameter> element"
  end
  local code = body:sub(open_end, close - 1)
  if param ~= "code" or code:find("<" .. prefix .. "parameter", 1, true) then
    return nil, "its arguments are not one \"code\" parameter"
  end
  return code
end

-- <function_calls> ... </function_calls> (inner, its prefix): the blocks
-- into out, or a note.
local function xml_calls(inner, prefix, out)
  local codes, pos = {}, 1
  local open = "^%s*<" .. prefix .. "invoke%s+name%s*=%s*[\"']([^\"']*)[\"']%s*>()"
  while inner:find("%S", pos) do
    local name, body_start = inner:sub(pos):match(open)
    local close = name and inner:find("</" .. prefix .. "invoke>", pos, true)
    if not close then
      return M.CALL_NOT_RUN:format("<function_calls>", "it is not a list of <invoke> elements")
    end
    local code, why = invoke_code(name, inner:sub(pos + body_start - 1, close - 1), prefix)
    if not code then
      return M.CALL_NOT_RUN:format("<function_calls>", why)
    end
    codes[#codes + 1] = code
    pos = close + #("</" .. prefix .. "invoke>")
  end
  for _, code in ipairs(codes) do
    fenced(code, out)
  end
end

-- <tool_call>{json}</tool_call>: the block into out, or a note.
local function json_call(inner, out)
  local ok, call = pcall(json.decode, inner)
  if not ok or type(call) ~= "table" or type(call.name) ~= "string" then
    return M.CALL_NOT_RUN:format("<tool_call>", "it is not a JSON object with a \"name\"")
  end
  local args = call.arguments
  if type(args) == "string" then
    args = select(2, pcall(json.decode, args))
  end
  if not CALL_NAMES[call.name] then
    return M.CALL_NOT_RUN:format("<tool_call>", ("it calls %q, which is no tool here"):format(call.name:sub(1, 40)))
  end
  if type(args) ~= "table" or type(args.code) ~= "string" or next(args, next(args)) ~= nil then
    return M.CALL_NOT_RUN:format("<tool_call>", "its arguments are not one \"code\" string")
  end
  fenced(args.code, out)
end

-- A Python string literal of text, on one line, with no parenthesis in it.
local function py_literal(text)
  return '"' .. text:gsub('[%c\\"()]', function(c)
    return ("\\x%02x"):format(c:byte())
  end) .. '"'
end

-- The element opened at the start of lines[i]: its inner text, the rest of
-- its closing line and that line's index; nil when it is never closed.
local function element(lines, i, open, close)
  local text = table.concat(lines, "\n", i)
  local from = select(2, text:find(open, 1, true)) + 1
  local to = text:find(close, from, true)
  if not to then
    return nil
  end
  local last = i + select(2, text:sub(1, to):gsub("\n", ""))
  return text:sub(from, to - 1), text:sub(to + #close):match("^[^\n]*"), last
end

-- The response with the other forms rewritten (a response with no "<"
-- comes back as it is), and the notes on what did not run.
function M.rewrite(response)
  if not response:find("<", 1, true) then
    return response
  end
  local lines, out, notes = split_lines(response), {}, {}
  local answers = select(2, response:gsub("<answer>", "")) == 1 and select(2, response:gsub("</answer>", "")) == 1
  local i = 1
  while i <= #lines do
    local line = lines[i]
    local _, fence = open_fence(line)
    local prefix = line:match("^%s*<(a?n?t?m?l?:?)function_calls>")
    local element_of = prefix and { "<" .. prefix .. "function_calls>", "</" .. prefix .. "function_calls>" }
      or line:match("^%s*<tool_call>") and { "<tool_call>", "</tool_call>" }
      or answers and line:match("^%s*<answer>") and { "<answer>", "</answer>" }
    local inner, rest, last
    if element_of and (prefix == nil or prefix == "" or prefix == "antml:") then
      inner, rest, last = element(lines, i, element_of[1], element_of[2])
      if not inner then
        notes[#notes + 1] = ("A %s was never closed (no %s after it), so it was not read.")
          :format(element_of[1], element_of[2])
      end
    end
    if fence then
      local j = fence_end(lines, i, fence) or #lines
      for k = i, j do
        out[#out + 1] = lines[k]
      end
      i = j + 1
    elseif inner then
      local note
      if element_of[1] == "<tool_call>" then
        note = json_call(inner, out)
      elseif element_of[1] == "<answer>" then
        inner = trim(inner)
        out[#out + 1] = final_at(inner) and inner or "FINAL(" .. py_literal(inner) .. ")"
      else
        note = xml_calls(inner, prefix, out)
      end
      notes[#notes + 1] = note
      out[#out + 1] = rest
      i = last + 1
    elseif line:find("<|begin_of_box|>", 1, true) or line:find("<|end_of_box|>", 1, true) then
      -- GLM's box around its answer: the box's text on lines of its own.
      for _, l in ipairs(split_lines((line:gsub("<|begin_of_box|>", "\n"):gsub("<|end_of_box|>", "\n")))) do
        out[#out + 1] = l
      end
      i = i + 1
    else
      out[#out + 1] = line
      i = i + 1
    end
  end
  return table.concat(out, "\n"), notes
end

return M
