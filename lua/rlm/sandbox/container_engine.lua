-- The container engine's own commands for rlm.sandbox.container (podman's
-- or docker's client, with the option's global flags): its argv, its rm,
-- a command run to its end within the start's deadline, and the sweep that
-- a Lua state's first start runs (the names are rlm.sandbox.container_names'
-- to read).
local core = require("rlm.core")
local errors = require("rlm.base.errors")
local util = require("rlm.base.util")
local helpers = require("rlm.sandbox.helper")
local names = require("rlm.sandbox.container_names")

local M = {}

local function unavailable(message)
  return nil, errors.new("sandbox_unavailable", message)
end

-- Runs a helper (the engine's ps or rm) to its end, or to the start's
-- deadline (c.deadline, on core.now_ms's clock: start_timeout_ms from the
-- prepare): its lines, status and stderr, or nil and why it could not run.
local function run_helper(c, argv, wait)
  local left = math.floor(c.deadline - core.now_ms())
  if left < 1 then
    return nil, ("sandbox.start_timeout_ms (%.0f ms) was spent before it ran"):format(c.start_timeout_ms)
  end
  local helper, err = core.helper(argv, left, 4 * 2 ^ 20)
  if not helper then
    return nil, err
  end
  local lines, status, stderr = helpers.drain(helper, wait, ("it did not end within sandbox.start_timeout_ms (%.0f ms):"
    .. " the engine did not answer; it was killed"):format(c.start_timeout_ms))
  if not lines then
    return nil, status
  end
  return lines, status, stderr
end

-- The engine's command with its global flags (podman's --runtime is one).
function M.argv(c, ...)
  local argv = util.append({ c.engine }, c.global_args)
  if c.backend == "podman" and c.runtime then
    util.append(argv, { "--runtime", c.runtime })
  end
  return util.append(argv, ...)
end

function M.rm_args(c, containers)
  if c.backend == "podman" then
    return util.append({ "rm", "-f", "--time", "0", "--ignore" }, containers)
  end
  return util.append({ "rm", "-f" }, containers)
end

-- The first start of a Lua state for an engine, its flags and a prefix
-- lists the engine's containers, and removes those of this prefix whose
-- host is gone. An engine that cannot list them cannot run one either:
-- sandbox_unavailable, in its own words.
local swept = {}
function M.sweep(c, wait)
  local key = table.concat(M.argv(c, { "\0", c.name }), "\0")
  if swept[key] then
    return true
  end
  swept[key] = true
  local ps = { "ps", "-a", "--format", "{{.Names}}" }
  local lines, status, stderr = run_helper(c, M.argv(c, ps), wait)
  if not lines or status ~= 0 then
    swept[key] = nil
    local why = lines and ("exit %s"):format(tostring(status)) or status
    return unavailable(("the %s engine (%s) cannot list its containers (%s %s: %s)%s"):format(c.backend,
      c.engine, c.backend, table.concat(ps, " "), why, stderr and stderr ~= "" and ": "
      .. stderr:gsub("%s+$", ""):sub(-500) or ""))
  end
  local gone = names.gone(c.name, lines)
  if gone[1] then
    -- What the rm says is not this start's business: a container may go
    -- meanwhile.
    run_helper(c, M.argv(c, M.rm_args(c, gone)), wait)
  end
  return true
end

return M
