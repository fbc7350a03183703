-- The names of the containers the container backends start
-- (rlm.sandbox.container): <prefix>-<boot>-<pid>-<start>-<token>-<n>, this
-- host's boot, pid and start time (so that a later host can tell whether
-- it still runs), a token of this Lua state (two states of one process
-- count apart) and a count; and, from an engine's list, which of a
-- prefix's containers belong to a host that is gone. Plain Lua over /proc.
local util = require("rlm.base.util")

local M = {}

local read_all = util.read_file
local owner

-- A process's start time (clock ticks after the boot) from its stat line:
-- the 22nd field, the 20th after the command's closing parenthesis.
local function stat_start(stat)
  local rest = stat and stat:match("^.*%)%s(.*)$")
  if not rest then
    return nil
  end
  local i = 0
  for field in rest:gmatch("%S+") do
    i = i + 1
    if i == 20 then
      return field
    end
  end
end

-- This host as a name says it: { boot =, pid =, start =, token = }, or nil
-- when its boot id or its own stat line cannot be read.
function M.owner()
  if owner then
    return owner
  end
  local boot = (read_all("/proc/sys/kernel/random/boot_id") or ""):gsub("[^%x]", ""):sub(1, 8)
  local stat = read_all("/proc/self/stat") or ""
  local pid, start = stat:match("^(%d+)"), stat_start(stat)
  local token = util.random_hex(3)
  if #boot ~= 8 or not pid or not start or not token then
    return nil
  end
  owner = { boot = boot, pid = pid, start = start, seq = 0, token = token }
  return owner
end

-- The next container name under prefix (M.owner() has answered).
function M.next(prefix)
  local o = M.owner()
  o.seq = o.seq + 1
  return ("%s-%s-%s-%s-%s-%d"):format(prefix, o.boot, o.pid, o.start, o.token, o.seq)
end

-- Whether proc (a procfs's root, "/proc") shows every process, so that a
-- pid absent from it is a pid that does not run: not when it is mounted
-- hidepid (1, 2, noaccess, invisible: another user's processes hidden or
-- closed, as on many shared machines), as its mount's options say, and
-- only when its pid 1 can be seen.
local function shows_every_process(proc)
  local info = read_all(proc .. "/self/mountinfo") or read_all("/proc/self/mountinfo") or ""
  for line in info:gmatch("[^\n]+") do
    -- id parent major:minor root mount-point options ... - type source super-options
    local point, rest = line:match("^%S+ %S+ %S+ %S+ (%S+) (.*)$")
    if point == proc then
      local hide = rest:match("hidepid=(%w+)")
      if hide and hide ~= "0" and hide ~= "off" then
        return false
      end
    end
  end
  return util.file_exists(proc .. "/1/stat")
end

-- Whether the host a name of ours names is proven gone: another boot's, a
-- pid that runs with another start time, or a pid absent from a /proc that
-- shows every process. What cannot be proven (a /proc that hides other
-- users' processes, a stat that cannot be read) counts as running: its
-- containers may be another user's live ones, where users share an engine.
local function host_gone(boot, pid, start, proc, shows_all)
  if boot ~= owner.boot then
    return true
  end
  local stat, _, code = read_all(proc .. "/" .. pid .. "/stat")
  if not stat then
    return code == 2 and shows_all() -- ENOENT
  end
  return stat_start(stat) ~= start
end

-- The containers of prefix whose host is gone, from the lines of an
-- engine's `ps -a --format {{.Names}}`; no other name. proc: the procfs
-- to read (default "/proc").
function M.gone(prefix, lines, proc)
  proc = proc or "/proc"
  local shows
  local function shows_all()
    if shows == nil then
      shows = shows_every_process(proc)
    end
    return shows
  end
  local gone = {}
  local head = prefix .. "-"
  for _, line in ipairs(lines) do
    for name in line:gmatch("[^%s,]+") do -- docker lists a container's names with commas
      local rest = name:sub(1, #head) == head and name:sub(#head + 1)
      local boot, pid, start = (rest or ""):match("^(%x%x%x%x%x%x%x%x)%-(%d+)%-(%d+)%-%x+%-%d+$")
      if boot and host_gone(boot, pid, start, proc, shows_all) then
        gone[#gone + 1] = name
      end
    end
  end
  return gone
end

return M
