-- The interpreter probe of the bubblewrap backend (rlm.sandbox.bwrap):
-- python/probe.py, run once per interpreter and module list on the host,
-- says what of its installation the sandbox must show (sys.path, the
-- files its modules load) and packs the driver's package with this
-- interpreter's bytecode. Its report is cached for the life of the Lua
-- state; a session that asks while another is asking waits for it.
local core = require("rlm.core")
local errors = require("rlm.base.errors")
local protocol = require("rlm.base.protocol")
local util = require("rlm.base.util")

local M = {}

local PROBE_TIMEOUT_MS = 20000

local function unavailable(message, fields)
  return nil, errors.new("sandbox_unavailable", message, fields)
end

-- The file next to the modules, or nil, err naming why it is not.
function M.find_file(name)
  local here = util.module_dir()
  local problem
  for _, candidate in ipairs({
    here .. "/" .. name,                   -- installed: next to the modules
    here .. "/../../python/" .. name,      -- a checkout: lua/rlm/ -> python/
  }) do
    local ok, why = util.file_exists(candidate)
    if ok then
      return candidate
    end
    problem = problem or why
  end
  if problem then
    return unavailable(("python/%s cannot be opened: %s"):format(name, problem))
  end
  return unavailable(("python/%s was not found next to the rlm modules"):format(name))
end

-- One probe per (interpreter, module list) for the life of this Lua state.
-- While one is in flight, the entry is { pending = true, owner = session },
-- and other sessions of the state wait for it. The owner is held weakly: a
-- session dropped while it probes is collected (and its helper with it), and
-- the next session asks anew.
local probe_cache = {}
local WEAK_OWNER = { __mode = "v" }

-- Runs the probe as a helper process and reads its one line; wait(helper)
-- returns the helper's next event (the session's engine yields meanwhile).
local function run_probe(python, modules, wait, driver_dir)
  local script, ferr = M.find_file("probe.py")
  if not script then
    return nil, ferr
  end
  local argv = util.append({ python, "-I", "-S", script, "--driver", driver_dir }, modules)
  local helper, err = core.helper(argv, PROBE_TIMEOUT_MS, 4 * 2 ^ 20)
  if not helper then
    return unavailable(("asking %s about its installation: %s%s"):format(python, err,
      require("rlm.diagnose").hint(err)))
  end
  local out, status, problem = nil, nil, nil
  while not status and not problem do
    local kind, a, b = wait(helper)
    if kind == "line" then
      out = out or a
    elseif kind == "exit" then
      status = b ~= 0 and 128 + b or a
    elseif kind == "timeout" then
      problem = "timed out"
    elseif kind == "failed" then
      problem = a -- it could not be started
    else
      problem = "printed too much"
    end
  end
  helper:close()
  if problem then
    return unavailable(("asking %s about its installation: %s%s"):format(python, problem,
      require("rlm.diagnose").hint(problem)))
  end
  out = out or ""
  local ok, info = pcall(protocol.decode_probe, out)
  -- -1: the host reaped the helper itself (nginx's SIGCHLD handler waits
  -- for any child), so its status is lost; its report still counts.
  if not ok or (status ~= 0 and status ~= -1) or not info then
    return unavailable(("%s did not describe its installation (exit %s): %s")
      :format(python, tostring(status), out:sub(1, 200)))
  end
  -- The driver's package in one zip, with this interpreter's bytecode.
  info.driver_zip = type(info.driver_zip) == "string" and core.base64_decode(info.driver_zip) or nil
  info.driver_pyc = type(info.driver_pyc) == "string" and core.base64_decode(info.driver_pyc) or nil
  if not info.driver_zip or not info.driver_pyc then
    return unavailable(("%s could not pack the driver's package"):format(python))
  end
  return info
end

-- How long a session waits for another's probe when that session is not
-- driven meanwhile (a host that polls one session and then blocks in
-- another's run()): past it, it asks too.
local STALE_OWNER_MS = 250

local function stale(entry)
  local at = entry.owner.pumped_at
  return at ~= nil and core.now_ms() - at > STALE_OWNER_MS
end

local function probe_key(python, modules, driver_dir)
  return python .. "\0" .. driver_dir .. "\0" .. table.concat(modules, "\0")
end

-- Whether the report for (python, modules) is known, or being asked for.
function M.asked(python, modules, driver_dir)
  return probe_cache[probe_key(python, modules, driver_dir)] ~= nil
end

-- The interpreter's report for (python, modules), asked once per Lua
-- state (wait and owner as bwrap.prepare's): info | nil, err.
function M.report(python, modules, wait, owner, driver_dir)
  local key = probe_key(python, modules, driver_dir)
  while probe_cache[key] and probe_cache[key].pending do
    -- Another session of this Lua state is asking: wait for its answer.
    local entry = probe_cache[key]
    if entry.owner == nil then
      probe_cache[key] = nil -- its session was dropped: ask in its place
    elseif stale(entry) then
      return run_probe(python, modules, wait, driver_dir)
    else
      wait(nil)
    end
  end
  if probe_cache[key] then
    return probe_cache[key]
  end
  probe_cache[key] = setmetatable({ pending = true, owner = owner }, WEAK_OWNER)
  local info, err = run_probe(python, modules, wait, driver_dir)
  probe_cache[key] = info
  return info, err
end

-- A session that goes away while it probes lets the others ask.
function M.forget(owner)
  for key, entry in pairs(probe_cache) do
    if entry.owner == owner then
      probe_cache[key] = nil
    end
  end
end

return M
