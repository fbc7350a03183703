-- An rlm.core helper (a command run to its end, its output read line by
-- line) read through a wait function: the one loop that the container
-- engines' commands and kubectl's share. wait(helper) returns the
-- helper's next event, blocking or from a coroutine that yields meanwhile.
local M = {}

-- The status of an "exit" event: the code, or 128 plus the signal that
-- ended the command, as a shell says it.
function M.status(code, signal)
  return signal ~= 0 and 128 + signal or code
end

-- Reads the helper's events to its end and closes it: its lines, its
-- status and its stderr; or nil and why, then the lines it printed. Why
-- is timeout_message when the helper's time ran out, else what failed or
-- "it printed too much".
function M.drain(helper, wait, timeout_message)
  local lines, status, stderr, problem = {}, nil, "", nil
  while not status and not problem do
    local kind, a, b, d = wait(helper)
    if kind == "line" then
      lines[#lines + 1] = a
    elseif kind == "exit" then
      status, stderr = M.status(a, b), d or ""
    elseif kind == "timeout" then
      problem = timeout_message
    elseif kind == "failed" then
      problem = tostring(a)
    else
      problem = "it printed too much"
    end
  end
  helper:close()
  if problem then
    return nil, problem, lines
  end
  return lines, status, stderr
end

return M
