-- The fields of the `sandbox` option that every backend takes: what shapes
-- a sandbox (its interpreter, its limits, its start), beside the fields of
-- the backend itself (rlm.sandbox.exec's argv, a container's image). A
-- session and a pool check them here, and a pool's sessions get the
-- pool's (rlm.engine.options). Misuse raises naming 'sandbox.<field>'.
local checks = require("rlm.base.checks")

local M = {}

-- What one driver line needs besides the output and the traceback: the
-- JSON around them, the truncation markers, and a short final answer.
M.LINE_OVERHEAD = 8192

-- A uid map takes uids below 2^31 (the kernel says EINVAL above).
M.MAX_UID = 2 ^ 31 - 1
M.UIDS = { first = 1879048192, count = 65536 }

local function module_list(v)
  if type(v) ~= "table" then
    return false, "a list of module names"
  end
  local n = #v
  for k, name in pairs(v) do
    if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then
      return false, "a list of module names"
    end
    if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then
      return false, "a list of top-level module names (got " .. tostring(name) .. ")"
    end
  end
  return true
end

-- { first = uid, count = n }: the host uids a root host's sandboxes take
-- (docs/security.md), the last of them, first + count - 1, below 2^31.
local function uid_range(v)
  local want = ("a table { first = 1 to 2^31 - 1, count = 1 to 2^31 - 1 } whose last uid, first + count - 1, "
    .. "is at most 2^31 - 1")
  if type(v) ~= "table" then
    return false, want
  end
  for k in pairs(v) do
    if k ~= "first" and k ~= "count" then
      return false, want
    end
  end
  local whole = checks.integer(1, M.MAX_UID)
  if not whole(v.first) or not whole(v.count) then
    return false, want
  end
  if v.first + v.count - 1 > M.MAX_UID then
    return false, want, ("must end at uid 2^31 - 1 at most (the uids a uid map takes), got first %.0f + count %.0f - 1"
      .. " = %.0f"):format(v.first, v.count, v.first + v.count - 1)
  end
  return true
end

-- name = { check, default } (rlm.base.checks.option). tmpdir's default is
-- read when the option is (M.read): $TMPDIR, else /tmp.
M.FIELDS = {
  python = { checks.non_empty_string, "python3" },
  bwrap = { checks.non_empty_string, "bwrap" },
  allowed_modules = { module_list },
  bind_pth_paths = { checks.boolean, false },
  memory_cgroup = { checks.boolean, true },
  rss_poll_interval_ms = { checks.integer(1, 60000), 50 },
  workdir_max_bytes = { checks.integer(4096, 2 ^ 40), 2 ^ 28 },
  workdir_max_files = { checks.integer(1, 2 ^ 31 - 1), 10000 },
  uids = { uid_range },
  max_message_bytes = { checks.integer(12 + M.LINE_OVERHEAD, 2 ^ 30), 16 * 2 ^ 20 },
  tmpdir = { checks.non_empty_string },
  start_timeout_ms = { checks.milliseconds, 30000 },
  interrupt_grace_ms = { checks.milliseconds, 2000 },
}

-- A backend's own fields with these beside them, as one schema.
function M.with(own)
  local out = {}
  for k, rule in pairs(M.FIELDS) do
    out[k] = rule
  end
  for k, rule in pairs(own) do
    out[k] = rule
  end
  return out
end

-- out (a backend's read option) with these fields of v, defaults filled in.
function M.read(v, out)
  for name, rule in pairs(M.FIELDS) do
    local x = v[name]
    if x == nil then
      x = rule[2]
    end
    out[name] = x
  end
  out.tmpdir = out.tmpdir or os.getenv("TMPDIR") or "/tmp"
  local modules = {}
  for i, name in ipairs(out.allowed_modules or {}) do
    modules[i] = name
  end
  out.allowed_modules = modules
  local uids = v.uids or M.UIDS
  out.uids = { first = uids.first, count = uids.count }
  return out
end

return M
