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

function M.is_error(v)
  return getmetatable(v) == Error
end

return M
