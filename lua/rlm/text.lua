-- Text as the model sees it: UTF-8 lengths and truncation.
local core = require("rlm.core")

local M = {}

-- Room for the driver's own "[truncated N chars]" marker before the host
-- cuts again.
local MARKER_SLACK = 64

function M.utf8_len(s)
  return select(2, core.utf8_prefix(s, 2 ^ 53))
end

-- Cuts s to about `limit` characters, as the driver should have (it is not
-- trusted to). Output keeps its first two thirds and its last third, so the
-- model sees how it ended; a traceback keeps its end, where the error is.
function M.cut(s, limit, keep_end)
  if core.utf8_prefix(s, limit + MARKER_SLACK) >= #s then
    return s
  end
  local total = M.utf8_len(s)
  local tail = keep_end and limit or math.floor(limit / 3)
  local head = limit - tail
  local head_bytes = core.utf8_prefix(s, head)
  local tail_start = core.utf8_prefix(s, total - tail)
  local marker = ("[truncated %d chars]"):format(total - limit)
  if keep_end then
    return marker .. "\n" .. s:sub(tail_start + 1)
  end
  return s:sub(1, head_bytes) .. "\n" .. marker .. "\n" .. s:sub(tail_start + 1)
end
return M
