-- rlm.journal.owner: a lease's owner named so that a later process of the
-- same machine can tell that it is gone (docs/durability.md, "The lease"),
-- and the release of such a lease. One name for the CLI, the OpenResty
-- example and the Neovim plugin:
--
--   <label> pid <pid> on <host> (boot <boot>, start <start>)[ <tag>]
--
-- host: the kernel's host name; boot: the first 8 hex digits of its boot
-- id; start: the process's start time (clock ticks after boot, the 22nd
-- field of /proc/<pid>/stat), so that a pid used again is another
-- process; tag: what tells apart owners of one process (a request's id).
--
--   owner.name(label[, tag])          -> string | nil (no /proc)
--   owner.parse(name)                 -> { label, pid, host, boot, start, tag } | nil
--   owner.gone(name)                  -> true when it is a process of this machine that ended
--   owner.release_if_gone(store, id)  -> true | false | nil, err
local lease = require("rlm.journal.lease")
local store = require("rlm.journal.store")

local M = {}

local function first_line(path)
  local f = io.open(path, "rb")
  local line = f and f:read("*l")
  if f then
    f:close()
  end
  return line
end

-- A process as /proc tells it ("self" or a pid): its pid, its start time
-- and its state letter; nil when there is none.
local function process(pid)
  local stat = first_line("/proc/" .. pid .. "/stat")
  local rest = stat and stat:match("^%d+ %(.*%) (.*)$") -- the name may hold ") "
  if not rest then
    return nil
  end
  local fields = {}
  for word in rest:gmatch("%S+") do
    fields[#fields + 1] = word
  end
  return stat:match("^%d+"), fields[20], fields[1] -- fields 3.. of proc(5): starttime is the 22nd
end

-- This machine: its host name (spaces and control characters as "_") and
-- boot id's first 8 hex digits; nil without /proc.
local function machine()
  local boot = first_line("/proc/sys/kernel/random/boot_id")
  local host = first_line("/proc/sys/kernel/hostname") or "localhost"
  if not boot then
    return nil
  end
  return (host:gsub("[%c ]", "_")), boot:sub(1, 8)
end

function M.name(label, tag)
  if type(label) ~= "string" or not label:find("^%S+$") then
    error("rlm.journal.owner: a label is one word, not " .. tostring(label), 2)
  end
  if tag ~= nil and (type(tag) ~= "string" or tag == "" or tag:find("%c")) then
    error("rlm.journal.owner: a tag is a string without control characters, not " .. tostring(tag), 2)
  end
  local pid, start = process("self")
  local host, boot = machine()
  if not (pid and start and host) then
    return nil
  end
  return ("%s pid %s on %s (boot %s, start %s)%s"):format(label, pid, host, boot, start, tag and (" " .. tag) or "")
end

function M.parse(name)
  if type(name) ~= "string" then
    return nil
  end
  local label, pid, host, boot, start, rest =
    name:match("^(%S+) pid (%d+) on (%S+) %(boot (%x+), start (%d+)%)(.*)$")
  if not label or (rest ~= "" and not rest:find("^ %S")) or rest:find("%c") then
    return nil
  end
  return { label = label, pid = pid, host = host, boot = boot, start = start, tag = rest:sub(2) ~= "" and rest:sub(2)
    or nil }
end

-- True when name is a process of this machine (its host name and boot id)
-- that has ended: no process has its pid, one that has is another (another
-- start time), or it is a zombie. Anything else (another machine's, a
-- live one, a name not of this form, no /proc) is not known to be gone.
function M.gone(name)
  local o = M.parse(name)
  local host, boot = machine()
  if not o or not host or o.host ~= host or o.boot ~= boot then
    return false
  end
  local _, start, state = process(o.pid)
  return start ~= o.start or state == "Z" or state == "X"
end

-- Lets go of session id's lease when its holder is gone (M.gone): a process
-- of this machine killed before it could release, whose lease would
-- otherwise live its time out (30 s by default) with nothing to renew it.
-- As lease.release_for does, only while the lease is as read: true when
-- released; false when it was not (free, expired, held by a live or
-- unknown owner, or changed meanwhile); nil, err when the store failed.
function M.release_if_gone(s, id, clock)
  store.check(s)
  lease.check_id(id)
  local value, err = store.call(s, "get", id .. ".lease")
  if err then
    return nil, err
  end
  local fence, expires, holder = lease.decode(value)
  if not fence or holder == "" or expires <= (clock or os.time)() or not M.gone(holder) then
    return false
  end
  return lease.release_for(s, id, value)
end

return M
