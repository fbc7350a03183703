-- rlm.llm.sse: a parser of server-sent events (the WHATWG HTML standard's
-- "event stream" format), fed the body in pieces as they come. Each event
-- goes to on_event(name, data) as its blank line arrives; what is held
-- between is one unfinished event, bounded.
local M = {}

-- The most bytes one event may hold (its lines, not yet ended by a blank
-- line): a stream that never ends an event fails past it.
M.MAX_EVENT_BYTES = 4 * 2 ^ 20

local Parser = {}
Parser.__index = Parser

-- new(on_event[, max_event_bytes]) -> parser. on_event(name, data) gets the
-- event's name ("message" when it has no `event:` field) and its `data:`
-- lines joined by "\n"; it returns true to go on, or nil, message to stop
-- the stream (feed returns them).
function M.new(on_event, max_event_bytes)
  return setmetatable({
    on_event = on_event,
    max = max_event_bytes or M.MAX_EVENT_BYTES,
    partial = {}, -- the pieces of a line not yet ended
    held = 0, -- bytes of the event so far
    name = nil,
    data = nil, -- list of data lines
    after_cr = false, -- the last piece ended in CR: a LF next ends nothing
    events = 0,
  }, Parser)
end

function Parser:_line(line)
  if line == "" then
    local data, name = self.data, self.name
    self.data, self.name, self.held = nil, nil, 0
    if not data then
      return true -- a blank line after no data: no event (the standard's rule)
    end
    self.events = self.events + 1
    return self.on_event(name or "message", table.concat(data, "\n"))
  end
  if line:sub(1, 1) == ":" then
    return true -- a comment (keep-alive)
  end
  local field, value = line:match("^([^:]*):? ?(.*)$")
  if field == "data" then
    self.data = self.data or {}
    self.data[#self.data + 1] = value
  elseif field == "event" then
    self.name = value
  end -- id and retry mean nothing here
  return true
end

-- Feeds a piece of the body: true, or nil, message (an event too long, or
-- what on_event stopped with).
function Parser:feed(piece)
  local from = 1
  if self.after_cr and piece:sub(1, 1) == "\n" then
    from = 2
  end
  self.after_cr = false
  while true do
    local i = piece:find("[\r\n]", from)
    if not i then
      local rest = piece:sub(from)
      self.held = self.held + #rest
      if self.held > self.max then
        return nil, ("an event of the stream is longer than %d bytes"):format(self.max)
      end
      if rest ~= "" then
        self.partial[#self.partial + 1] = rest
      end
      return true
    end
    local line = piece:sub(from, i - 1)
    self.held = self.held + #line
    if self.held > self.max then
      return nil, ("an event of the stream is longer than %d bytes"):format(self.max)
    end
    if self.partial[1] then
      self.partial[#self.partial + 1] = line
      line = table.concat(self.partial)
      self.partial = {}
    end
    local ok, err = self:_line(line)
    if not ok then
      return nil, err
    end
    from = i + 1
    if piece:sub(i, i) == "\r" then
      if i == #piece then
        self.after_cr = true
      elseif piece:sub(i + 1, i + 1) == "\n" then
        from = i + 2
      end
    end
  end
end

return M
