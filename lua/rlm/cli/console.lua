-- The command line's terminal: stderr, where everything is for a person
-- (the trace, errors) and one status line is redrawn in place, and what
-- goes to stdout. One console a run, made by rlm.cli.main.
local printable = require("rlm.cli.printable")
local EXIT = require("rlm.cli.usage").EXIT

local M = {}

-- live: the status line (rlm.tools.status) while a run is on a terminal,
-- else nil. stream_open: a line of the root model's streamed text (--trace)
-- is not yet ended, so the next line on stderr (an event that came before
-- the call's end, the run's error) begins on a line of its own.
---@class Console
---@field live table|nil
---@field stream_open boolean
local Console = {}
Console.__index = Console

function M.new()
  return setmetatable({ live = nil, stream_open = false }, Console)
end

-- Everything on stderr (the trace, errors) is for a person: always printable.
-- The status line is cleared first, and drawn again after.
function Console:say(...)
  if self.live then
    self.live.clear()
  end
  if self.stream_open then
    self.stream_open = false
    io.stderr:write("\n")
  end
  io.stderr:write(printable.text(table.concat({ ... })), "\n")
  if self.live then
    self.live.draw()
  end
end

-- The status line wiped and put away (before the run's last words).
function Console:end_live()
  if self.live then
    self.live.clear()
    self.live = nil
  end
end

function Console:usage_error(message)
  self.live = nil
  self:say("rlm: ", message)
  self:say("Try 'rlm --help'.")
  os.exit(EXIT.usage)
end

function Console:failure(message)
  self:end_live()
  self:say("rlm: ", message)
  os.exit(EXIT.failure)
end

function M.is_terminal(fd)
  local status = os.execute("test -t " .. fd)
  return status == true or status == 0
end

-- The terminal's width in columns ($COLUMNS, else stty's view of stderr).
function M.columns()
  local n = tonumber(os.getenv("COLUMNS") or "")
  if n then
    return n
  end
  local p = io.popen("stty size 0<&2 2>/dev/null")
  local size = p and p:read("*a") or ""
  if p then
    p:close()
  end
  local columns = tonumber(size:match("^%d+ (%d+)"))
  return columns and columns > 0 and columns or 80 -- a pseudo-terminal may say 0
end

-- What goes to stdout: the exact bytes for a pipe or a file, or with
-- --verbatim; nothing a terminal would act on, or that reads out of order.
function M.for_stdout(text, verbatim)
  if verbatim or not M.is_terminal(1) then
    return text
  end
  return printable.text(text)
end

return M
