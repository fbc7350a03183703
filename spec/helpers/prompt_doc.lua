-- The texts docs/prompt.md shows, made by lua/rlm/engine/prompt.lua,
-- feedback.lua and reply.lua themselves:
-- spec/prompt_spec.lua checks that the document still says them, and
--   lua5.4 spec/helpers/prompt_doc.lua docs/prompt.md
-- (with the LUA_PATH/LUA_CPATH of make test) writes them into it again.
local options = require("rlm.engine.options")
local feedback = require("rlm.engine.feedback")
local prompt = require("rlm.engine.prompt")
local reply = require("rlm.engine.reply")

local M = {}

local function noop() end

-- The default options, as a session gets them.
local function defaults(extra)
  local o = { root_llm = noop, llm_query = noop }
  for k, v in pairs(extra or {}) do
    o[k] = v
  end
  return options.check(o)
end

local function docs(n)
  local t = {}
  for i = 1, n do
    t[i] = ("document %d: "):format(i) .. ("lorem ipsum "):rep(i * 7)
  end
  return t
end

-- { name, text } in the order the document shows them.
function M.blocks()
  local o = defaults()
  local parse_notes = reply.parse("```bash\nls\n```\n```repl\nprint(1)\n```\n```\nprint(2)\n```\n"
    .. "FINAL(never closed\n\n```repl\nprint(3)\n").notes
  parse_notes[#parse_notes + 1] = reply.parse("FINAL(see\n```repl\nx = ')'\n```\n").notes[1]
  parse_notes[#parse_notes + 1] = reply.parse("FINAL(41)\nWait, the REPL printed 42.\nFINAL(42)\n").notes[1]
  parse_notes[#parse_notes + 1] = reply.parse("<function_calls>\n<invoke name=\"bash\">\n<parameter name=\"code\">"
    .. "ls</parameter>\n</invoke>\n</function_calls>").notes[1]
  return {
    { "system", prompt.default_system(o, "a str of 1,234,567 characters", 0) },
    { "nested", prompt.default_system(defaults({ max_depth = 2 }), "a str of 1,234,567 characters", 0)
      :match("(\n%- `rlm_query%(.-)\n%- Variables persist") },
    { "describe", table.concat({
      "str:          " .. prompt.describe("héllo wörld"),
      "short list:   " .. prompt.describe({ "alpha", "beta", "gamma delta" }),
      "long list:    " .. prompt.describe(docs(12)),
      "dict:         " .. prompt.describe({ title = "Q3 report", body = ("x"):rep(5000), pages = 12 }),
      "nested JSON:  " .. prompt.describe_json('[{"id": 1, "text": "a"}, {"id": 2, "text": "bb"}]'),
    }, "\n") },
    { "first_user", prompt.first_user("Which service failed during incident INC-4471?") },
    { "exec_output", feedback.exec_output(1, 2, "3 lines\n", nil) .. "\n\n"
      .. feedback.exec_output(2, 2, "", "Traceback (most recent call last):\n  File \"<repl-4>\", line 1, in <module>\n"
        .. "NameError: name 'lines2' is not defined") .. "\n\n"
      .. feedback.status({ used = 4, max = 20, sub_calls = 12, max_sub_calls = 200 }) },
    { "status_near_end", feedback.status({ used = 19, max = 20, sub_calls = 12, max_sub_calls = 200 }) },
    { "status_last", feedback.status({ used = 20, max = 20, sub_calls = 200, max_sub_calls = 200 }) },
    { "no_code", feedback.NO_CODE },
    { "no_reply", feedback.REASONING_ONLY .. "\n" .. feedback.EMPTY_REPLY },
    { "skipped", table.concat(parse_notes, "\n") },
    { "last_chance", feedback.LAST_CHANCE },
    { "compacted", feedback.compacted({ first = 1, last = 12, hidden = 10, dropped = 0,
      entries = {
        feedback.digest_turn(11, { code = "hits = [t for t in context if 'refund' in t['text'].lower()]\n"
          .. "print(len(hits), 'of', len(context))", stdout = "212 of 600\n" }, 800, 200),
        feedback.digest_turn(12, { code = "print(counts.most_common(2))", stdout = "", error = "Traceback (most "
          .. "recent call last):\n  File \"<repl-14>\", line 1, in <module>\nNameError: name 'counts' is not defined" },
          800, 200),
      },
      facts = { feedback.turn_fact(4, { error = "Traceback (most recent call last):\nKeyError: 'product'" }, 200),
        feedback.turn_fact(9, { rejected = "expected a number" }, 200) },
      vars = feedback.vars_listing({ { "hits", "list", 212 }, { "batches", "list", 5 }, { "asks", "set", 131 },
        { "Row", "type" }, { "row", "Row" } }, 0) }) },
    { "compacted_model", feedback.compacted({ first = 1, last = 12, hidden = 0, dropped = 0, facts = {},
      summary = "(the model's summary of turns 1 to 12)", vars = feedback.vars_listing({ { "hits", "list", 212 } }, 0) }) },
    { "compact_request", feedback.COMPACT_REQUEST:format(1, 12, 4, 2500) },
  }
end

-- The text between the marker of block `name` and the end of its fence.
local function pattern(name)
  return "(<!%-%- prompt:" .. name .. " %-%->\n````text\n)(.-)(\n````)"
end

-- What the document says for each block: { name = text }.
function M.read(doc)
  local out = {}
  for _, b in ipairs(M.blocks()) do
    local _, text = doc:match(pattern(b[1]))
    out[b[1]] = text
  end
  return out
end

function M.write(doc)
  for _, b in ipairs(M.blocks()) do
    local text = b[2]
    doc = doc:gsub(pattern(b[1]), function(head, _, tail)
      return head .. text .. tail
    end)
  end
  return doc
end

if arg and arg[0] and arg[0]:match("prompt_doc%.lua$") and arg[1] then
  local f = assert(io.open(arg[1], "rb"))
  local doc = f:read("*a")
  f:close()
  f = assert(io.open(arg[1], "wb"))
  f:write(M.write(doc))
  f:close()
end

return M
