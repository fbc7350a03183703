-- rlm.log: trajectory logs. jsonl() returns an on_event callback that writes
-- each event as one JSON line, bounded, valid UTF-8, flushed at once; see
-- docs/log.md.
local checks = require("rlm.base.checks")
local logline = require("rlm.tools.logline")

local M = {}

-- rlm.log.truncate(s, limit): see lua/rlm/tools/logline.lua.
M.truncate = logline.truncate

local DEFAULTS = {
  max_field_chars = 20000, -- a string value (code, stdout, prompt, response)
  max_key_chars = 200,
  max_items = 1000, -- entries of one table
  max_depth = 16, -- tables in tables: a field of the event is at depth 1
  max_event_bytes = 256 * 1024, -- one line
  max_run_bytes = 64 * 1024 * 1024, -- the lines of one run, from its session_start
}

-- The least a line may take, whatever the budgets: its leading fields and
-- the event's small ones (a run_end's ok and error_kind).
local MIN_EVENT_BYTES = 1024

local has_core, core = pcall(require, "rlm.core")
if not (has_core and type(core) == "table") then
  core = {}
end

local function monotonic_ms()
  return core.now_ms or function()
    return os.time() * 1000
  end
end

-- Wall-clock seconds: luasocket's gettime when it is there (milliseconds);
-- else the second os.time() gave when the writer was made, moved on by the
-- monotonic clock (milliseconds apart, the whole may be up to a second off).
local function wall_clock(mono)
  local ok, socket = pcall(require, "socket")
  if ok and type(socket) == "table" and type(socket.gettime) == "function" then
    return socket.gettime
  end
  local wall0, mono0 = os.time(), mono()
  return function()
    return wall0 + (mono() - mono0) / 1000
  end
end

local function mode(v)
  return v == "append" or v == "truncate", '"append" or "truncate"'
end

local integer, callable = checks.integer, checks.callable
local SCHEMA = {
  mode = { mode, "append" },
  cost_usd = { callable },
  clock = { callable },
  max_event_bytes = { integer(MIN_EVENT_BYTES), DEFAULTS.max_event_bytes },
}
for name, default in pairs(DEFAULTS) do
  SCHEMA[name] = SCHEMA[name] or { integer(1), default }
end

local function check_options(opts)
  return checks.options("rlm.log.jsonl", opts, SCHEMA, nil, 3)
end

local Writer = {}
Writer.__index = Writer

-- Whether the file at path ends in something else than a newline (a line
-- a crash or a full disk left partial): true or false, nil when it cannot
-- be read.
local function ends_partial(path)
  local f = io.open(path, "rb")
  if not f then
    return nil
  end
  local size, last = f:seek("end"), nil
  if size and size > 0 and f:seek("set", size - 1) then
    last = f:read(1)
  end
  f:close()
  if size == 0 then
    return false
  end
  return last ~= "\n"
end

-- Writes one event. Never raises: a session's run must not end because its
-- log could not be written. The first failure is kept in self.error.
function Writer:write(ev)
  if self.closed then
    return
  end
  local now = self.mono()
  if not self.first_ms then
    self.first_ms = now
  end
  local o = self.opts
  local stamp = { t_ms = math.floor((now - self.first_ms) * 1000 + 0.5) / 1000 }
  local ok_clock, wall = pcall(self.clock)
  if ok_clock and type(wall) == "number" then
    stamp.ts = math.floor(wall * 1000 + 0.5) / 1000
  end
  if o.cost_usd then
    local ok, cost = pcall(o.cost_usd)
    if ok and type(cost) == "number" then
      stamp.cost_usd = cost
    end
  end
  if type(ev) == "table" and ev.type == "session_start" and (ev.depth or 0) == 0 then
    self.run_bytes = 0 -- a new run (a nested session's start has depth > 0)
  end
  -- A line gets max_event_bytes, or what is left of the run's budget, and
  -- never less than MIN_EVENT_BYTES: past the run's budget, each event is
  -- still there, as its small fields.
  local budget, why = o.max_event_bytes, "event"
  local run_left = o.max_run_bytes - self.run_bytes
  if run_left < budget then
    budget, why = math.max(run_left, MIN_EVENT_BYTES), "run"
  end
  local ok, line = pcall(logline.event, type(ev) == "table" and ev or { type = "invalid", value = ev }, stamp, o,
    budget, why)
  if not ok then
    line = logline.event({ type = "log_error", message = tostring(line),
      event_type = type(ev) == "table" and ev.type or nil }, stamp, o, budget, why)
  end
  self.run_bytes = self.run_bytes + #line + 1
  -- After a failed write (a full disk: part of the line may be in the
  -- file) or on a file that ended mid-line, this line starts with a
  -- newline of its own, so that it is not glued to the partial one. A file
  -- of ours is looked at first: a failed write may have left nothing.
  local start = ""
  if self.partial and (not self.path or ends_partial(self.path) ~= false) then
    start = "\n"
  end
  local wrote, err = self.file:write(start, line, "\n")
  if wrote then
    wrote, err = self.file:flush()
  end
  if wrote then
    self.lines = self.lines + 1
    self.partial = false
  else
    self.dropped = self.dropped + 1
    self.error = self.error or tostring(err)
    self.partial = true
  end
end

Writer.__call = Writer.write

-- Closes the file if jsonl() opened it (a handle passed in is only
-- flushed). Safe to call more than once.
function Writer:close()
  if self.closed then
    return true
  end
  self.closed = true
  if self.owned then
    return self.file:close()
  end
  return self.file:flush()
end

-- jsonl(path_or_file, opts) -> on_event, writer | nil, message
-- path_or_file: a path (opened in opts.mode: "append", the default, or
-- "truncate") or an open file handle (written to, never closed).
function M.jsonl(target, opts)
  local o = check_options(opts)
  local file, owned
  if io.type(target) == "file" then
    file = target
  elseif type(target) == "string" then
    local err
    file, err = io.open(target, o.mode == "truncate" and "wb" or "ab")
    if not file then
      return nil, err
    end
    owned = true
  else
    error("rlm.log.jsonl: path_or_file must be a path or an open file, not "
      .. (io.type(target) or type(target)), 2)
  end
  local mono = monotonic_ms()
  local self = setmetatable({
    file = file,
    owned = owned,
    path = owned and target or nil,
    opts = o,
    mono = mono,
    clock = o.clock or wall_clock(mono),
    lines = 0,
    dropped = 0,
    run_bytes = 0,
    -- A file appended to that ends mid-line (a crash) gets a newline
    -- before the first line.
    partial = owned and o.mode == "append" and ends_partial(target) == true,
  }, Writer)
  return function(ev)
    self:write(ev)
  end, self
end

return M