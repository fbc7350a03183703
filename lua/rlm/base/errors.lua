-- Runtime errors: `nil, err` with err.kind from a fixed list.
local M = {}

M.kinds = {
  sandbox_unavailable = true,
  sandbox_violation = true,
  sandbox_lost = true,
  step_timeout = true,
  memory_limit = true,
  sub_call_budget = true,
  cost_budget = true,
  max_iterations = true,
  driver_exited = true,
  protocol_error = true,
  callback_error = true,
  cancelled = true,
  -- a session's journal (option journal, Session.resume: docs/durability.md)
  journal_error = true,
  lease_held = true,
  lease_lost = true,
  context_mismatch = true,
  replay_diverged = true,
}

local Error = {}
Error.__index = Error

function Error.__tostring(e)
  return "rlm: " .. e.kind .. ": " .. e.message
end

-- new(kind, message[, fields]) -> err; fields are copied onto it.
function M.new(kind, message, fields)
  assert(M.kinds[kind], "unknown error kind " .. tostring(kind))
  local e = { kind = kind, message = message }
  if fields then
    for k, v in pairs(fields) do
      e[k] = v
    end
  end
  return setmetatable(e, Error)
end

-- An error as one line, as every host shows it: "kind: message" (or a
-- raised string as it is), without the traceback that a raise in a
-- callback carries (docs/api.md: callback_error), its line breaks folded.
function M.line(err)
  local kind = type(err) == "table" and err.kind or nil
  local message = tostring(kind and err.message or err):gsub("\n?stack traceback:.*$", "")
    :gsub("%s*\n%s*", " ")
  return kind and (kind .. ": " .. message) or message
end

function M.is_error(v)
  return getmetatable(v) == Error
end

return M
