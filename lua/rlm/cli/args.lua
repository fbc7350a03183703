-- The command line's flags (docs/cli.md): what each takes and where it
-- goes, their reading, and a misuse said of the flag that caused it.
local M = {}

-- Flags: name = { kind, destination }. kind: string, integer, number,
-- list (repeatable string), flag (no value).
local FLAGS = {
  context = { "list" },
  provider = { "string" },
  ["base-url"] = { "string" },
  model = { "string" },
  ["sub-model"] = { "string" },
  ["api-key-env"] = { "string" },
  temperature = { "number", "client" },
  ["max-tokens"] = { "integer", "client" },
  ["timeout-ms"] = { "number", "client" },
  retries = { "integer", "client" },
  price = { "list" },
  ["max-iterations"] = { "integer", "session" },
  ["step-timeout-ms"] = { "number", "session" },
  ["max-sub-calls"] = { "integer", "session" },
  ["max-depth"] = { "integer", "session" },
  ["max-wall-ms"] = { "number", "session" },
  ["max-cost-usd"] = { "number" },
  ["max-total-tokens"] = { "integer", "session" },
  ["max-sub-prompt-chars"] = { "integer", "session" },
  ["stdout-truncate-chars"] = { "integer", "session" },
  ["max-rss-bytes"] = { "integer", "session" },
  python = { "string" },
  ["allow-module"] = { "list" },
  tools = { "string" },
  ["max-tool-calls"] = { "integer", "session" },
  schema = { "string" },
  ["no-fallback"] = { "flag" },
  quiet = { "flag" },
  trace = { "flag" },
  verbatim = { "flag" },
  log = { "string" },
  journal = { "string" },
  resume = { "string" },
  help = { "flag" },
  version = { "flag" },
}
M.FLAGS = FLAGS

-- The edit distance of a and b (insertions, deletions, substitutions, and
-- two neighbours swapped), for "did you mean".
local function distance(a, b)
  local prev2, prev = {}, {}
  for j = 0, #b do
    prev[j] = j
  end
  for i = 1, #a do
    local row = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      row[j] = math.min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + cost)
      if i > 1 and j > 1 and a:byte(i) == b:byte(j - 1) and a:byte(i - 1) == b:byte(j) then
        row[j] = math.min(row[j], prev2[j - 2] + 1)
      end
    end
    prev2, prev = prev, row
  end
  return prev[#b]
end

-- The known flag nearest to name, if one is near: within a third of its
-- length in edits, one that name is the start of, or one that starts name
-- (--context-file).
local function nearest_flag(name)
  local best, best_d
  for known in pairs(FLAGS) do
    local d = distance(name, known)
    if known:sub(1, #name) == name and #name >= 3 or name:sub(1, #known + 1) == known .. "-" then
      d = math.min(d, 1)
    end
    if d <= math.max(1, math.floor(#known / 3)) and (not best_d or d < best_d or d == best_d and known < best) then
      best, best_d = known, d
    end
  end
  return best
end

local function unknown_flag(console, shown, name)
  if name == "api-key" or name == "key" then
    console:usage_error("unknown flag " .. shown .. ": the key is never a flag (a command line is visible to every "
      .. "user through /proc); put it in $OPENAI_API_KEY, or in the variable --api-key-env names")
  end
  local near = nearest_flag(name)
  console:usage_error("unknown flag " .. shown .. (near and ("; did you mean --%s?"):format(near) or ""))
end

local function parse_value(console, name, kind, text)
  if kind == "string" or kind == "list" then
    return text
  end
  local n = tonumber(text)
  if not n or n ~= n or n == math.huge or n == -math.huge then
    console:usage_error(("--%s wants a number, got %q"):format(name, text))
  end
  if kind == "integer" and n ~= math.floor(n) then
    console:usage_error(("--%s wants an integer, got %q"):format(name, text))
  end
  return n
end

-- argv read: the flags by name (a list for each repeatable one), the
-- positional arguments, and the text each flag was given as, for messages
-- ("got 5", not "got number"). A misuse is a usage error on the console.
function M.parse(argv, console)
  local flags, positional, given = { context = {}, price = {}, ["allow-module"] = {} }, {}, {}
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "--" then
      for j = i + 1, #argv do
        positional[#positional + 1] = argv[j]
      end
      break
    elseif a == "-h" then
      flags.help = true
    elseif a:sub(1, 2) == "--" then
      local name, value = a:match("^%-%-([^=]+)=(.*)$")
      name = name or a:sub(3)
      local spec = FLAGS[name]
      if not spec then
        unknown_flag(console, "--" .. name, name)
      end
      local kind = spec[1]
      if kind == "flag" then
        if value then
          console:usage_error("--" .. name .. " takes no value")
        end
        flags[name] = true
      else
        if not value then
          i = i + 1
          value = argv[i]
          if value == nil then
            console:usage_error("--" .. name .. " wants a value")
          end
        end
        given[name] = value
        value = parse_value(console, name, kind, value)
        if kind == "list" then
          local list = flags[name]
          list[#list + 1] = value
        else
          flags[name] = value
        end
      end
    elseif a:sub(1, 1) == "-" and a ~= "-" then
      unknown_flag(console, a, #a > 2 and a:sub(2) or "")
    else
      positional[#positional + 1] = a
    end
    i = i + 1
  end
  return flags, positional, given
end

-- The flag that sets a library option, where its name is not the option's.
local FLAG_OF = { ["cost.max_usd"] = "max-cost-usd", ["sandbox.allowed_modules"] = "allow-module",
  ["sandbox.python"] = "python", answer_schema = "schema", fallback = "no-fallback" }

-- A misuse the library raised ("rlm.Session.new: option 'temperature' must
-- be a number from 0 to 2, got number"), said of the flag that caused it,
-- with the value as it was typed: "--temperature must be ..., got 5".
local function flag_of(option)
  local flag = FLAG_OF[option] or option:gsub("_", "-")
  return FLAGS[flag] and flag
end

function M.option_error(message, given)
  local option, rest = message:match("option '([%w_.]+)' (must be .*)$")
  local flag = option and flag_of(option)
  if not (flag and given[flag]) then
    -- Another misuse: its options named as flags ("option 'max_rss_bytes'"
    -- is --max-rss-bytes), the library's prefix left out.
    message = message:gsub("^rlm%.[%w_.]+: ", "")
    return (message:gsub("option '([%w_.]+)'", function(name)
      return flag_of(name) and "--" .. flag_of(name) or nil
    end))
  end
  rest = rest:gsub(", got [^,]*$", "")
  local value = given[flag]
  return ("--%s %s, got %s"):format(flag, rest, tonumber(value) and value or ("%q"):format(value))
end

-- "MODEL=IN:OUT" -> model, { input_per_mtok =, output_per_mtok = }
function M.parse_price(text, console)
  local model, input, output = text:match("^(.+)=([^:=]+):([^:=]+)$")
  input, output = tonumber(input), tonumber(output)
  if not (model and input and output and input >= 0 and output >= 0) then
    console:usage_error(("--price wants MODEL=IN:OUT (USD per million tokens), got %q"):format(text))
  end
  return model, { input_per_mtok = input, output_per_mtok = output }
end

return M
