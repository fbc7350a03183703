-- How a run ends for its caller (docs/cli.md, "Exit status"): the answer
-- on stdout, or the error's line on stderr, and the exit status of each.
local EXIT = require("rlm.cli.usage").EXIT
local for_stdout = require("rlm.cli.console").for_stdout

local M = {}

-- The exit status of an error of kind `kind` (rlm.base.errors).
function M.status(kind)
  return EXIT[kind] or EXIT.failure
end

-- A run's error as one line: its kind, its message without the traceback a
-- raise in a callback carries (docs/api.md: callback_error), the exit
-- status. A 404 from a base URL whose path does not end in /v1 names the
-- URL that most servers answer on; a memory_limit names the flag that
-- gives the sandbox more, as the check before the run does.
function M.error_line(err, base_url)
  local line = require("rlm.base.errors").line(err)
  if err.kind == "callback_error" and line:find("HTTP 404", 1, true) and not base_url:find("/v1/?$") then
    line = ("%s; did you mean %s/v1?"):format(line, (base_url:gsub("/+$", "")))
  elseif err.kind == "memory_limit" and err.limit then
    line = ("%s; raise --max-rss-bytes (now %.0f; 0: no limit) to give it more"):format(line, err.limit)
  end
  return ("rlm: %s (exit %d)"):format(line, M.status(err.kind))
end

-- The answer of a run that returned one, on stdout (a partial one said so
-- on stderr first); its exit status.
function M.write(result, flags, console)
  local answer = result.answer
  if flags.schema and type(result.value) ~= "string" then
    answer = require("cjson").encode(result.value)
  end
  answer = for_stdout(answer, flags.verbatim)
  if result.partial then
    -- Said before the text, which a reader would otherwise take for the
    -- model's answer.
    console:say("rlm: partial answer (", result.reason.kind, ": ", result.reason.message, "): not a FINAL answer, ",
      "the model's best from what it found (exit ", EXIT.partial, ")")
    io.stderr:flush()
  end
  io.stdout:write(answer, answer:sub(-1) == "\n" and "" or "\n")
  io.stdout:flush()
  if result.partial then
    return EXIT.partial
  end
  return EXIT.ok
end

return M
