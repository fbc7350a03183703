-- A sandbox that outlives its host (issue 41; docs/protocol.md,
-- "Lingering"): the exec backend's keeper, asked at its start, keeps the
-- driver and its REPL for `sandbox.linger_ms` after its stream ends, and a
-- new stream reaches it again with the start's token and a fence no lower
-- than the last one. What the engine's resume uses:
--   linger.token()                  -> a new secret for one sandbox
--   linger.start_spec(spec, d)      -> exec's spec whose start asks for it
--   linger.attach(opts, d)          -> a Handle on the lingering sandbox
-- where d = { id =, token =, fence = [, seen = ] } is what the host keeps
-- (its journal): the id names the keeper's socket, the token lets in, the
-- fence orders owners, `seen` (Handle:received()) is where the replay of
-- the keeper's lines starts.
local core = require("rlm.core")
local errors = require("rlm.base.errors")
local exec = require("rlm.sandbox.exec")
local json = require("rlm.base.json")
local stream = require("rlm.sandbox.stream")
local util = require("rlm.base.util")

local M = {}

-- How long an attach waits for the keeper's word (the attacher's start
-- and the keeper's answer: milliseconds where it lingers).
M.ATTACH_TIMEOUT_MS = 10000

local TOKEN_BYTES = 16

-- A new token: TOKEN_BYTES from the kernel's random source, as hex; nil
-- and why when it cannot be read.
function M.token()
  return util.random_hex(TOKEN_BYTES)
end

local function check_durable(where, d, ms)
  if type(d) ~= "table" then
    error(("%s: expected a table { id, token, fence }, got %s"):format(where, type(d)), 3)
  elseif type(d.id) ~= "string" or not d.id:find("^[%w_%-]+$") or #d.id > 64 then
    error(where .. ": 'id' must be 1 to 64 of [A-Za-z0-9_-]", 3)
  elseif type(d.token) ~= "string" or not d.token:find("^[0-9a-f]+$") or #d.token < 32 or #d.token > 128 then
    error(where .. ": 'token' must be 32 to 128 lowercase hex digits (linger.token())", 3)
  elseif type(d.fence) ~= "number" or d.fence ~= math.floor(d.fence) or d.fence < 0 or d.fence > 2 ^ 53 then
    error(where .. ": 'fence' must be an integer from 0 to 2^53", 3)
  elseif ms ~= nil and (type(ms) ~= "number" or ms < 1 or ms > exec.LINGER_MAX_MS) then
    error(("%s: option 'sandbox.linger_ms' must be set (1 to %d) for a sandbox that lingers")
      :format(where, exec.LINGER_MAX_MS), 3)
  end
end

-- exec.prepare's spec, its start asking the keeper to linger for the
-- session's `sandbox.linger_ms` as d says (d.seen is not read).
function M.start_spec(spec, d)
  local o = spec.opts
  check_durable("rlm.sandbox.linger.start_spec", d, o and o.sandbox.linger_ms or false)
  local out = {}
  for k, v in pairs(spec) do
    out[k] = v
  end
  out.durable = { id = d.id, token = d.token, fence = d.fence }
  out.start = exec.start_message(o, { ms = o.sandbox.linger_ms, id = d.id, token = d.token, fence = d.fence })
  return out
end

-- The argv that reaches the keeper again: `sandbox.attach_argv`, or
-- `sandbox.argv` with --attach after it (rlm-keeper last, as in podman
-- exec -i c rlm-keeper).
local function attach_argv(sandbox)
  local argv = sandbox.attach_argv or util.append(util.append({}, sandbox.argv or {}), { "--attach" })
  local program = core.find_program(argv[1] or "")
  if not program then
    return nil, ("the exec backend's program %q was not found"):format(tostring(argv[1]))
  end
  argv = util.append({}, argv)
  argv[1] = program
  return argv
end

local function failed(kind, message)
  return nil, errors.new(kind, message)
end

-- A Handle on the keeper that lingers as d.id, its REPL as it was, ready
-- for the session's next line: the keeper's lines after d.seen (default
-- 0) come first (replayed). Returns h, { from =, lost =, sent =, taken = }
-- (the first line replayed, how many between seen and it the keeper no
-- longer held, how many it sent in all, how many of the host's driver
-- lines it took: Handle:sent_lines() goes on from there), or nil and an
-- error: sandbox_lost
-- when no keeper lingers there (gone, or never), sandbox_unavailable
-- when it refuses (a wrong token, a stale fence).
function M.attach(opts, d)
  check_durable("rlm.sandbox.linger.attach", d)
  local seen = d.seen or 0
  local sandbox = opts.sandbox
  local argv, why = attach_argv(sandbox)
  if not argv then
    return failed("sandbox_unavailable", why)
  end
  local drv, err = core.stream(argv, sandbox.max_message_bytes + 1)
  if not drv then
    return failed("sandbox_unavailable", "reaching the lingering sandbox: " .. tostring(err))
  end
  drv:send_keeper(json.encode({ type = "attach", id = d.id, token = d.token, fence = d.fence, seen = seen }))
  local allow = {}
  for _, name in ipairs(sandbox.allow or exec.DEFAULT_ALLOW) do
    allow[name] = true
  end
  local deadline = core.now_ms() + M.ATTACH_TIMEOUT_MS
  while true do
    local left = deadline - core.now_ms()
    if left <= 0 then
      drv:close()
      return failed("sandbox_lost", ("the lingering sandbox %s did not answer within %d ms")
        :format(d.id, M.ATTACH_TIMEOUT_MS))
    end
    local kind, a = drv:poll(math.ceil(left))
    if kind == "keeper" then
      local ok, msg = pcall(json.decode, a)
      local t = ok and type(msg) == "table" and msg.type
      if t == "attached" and type(msg.from) == "number" and allow[msg.sandbox] then
        local h = stream.handle(drv, { ping_timeout_ms = sandbox.ping_timeout_ms or exec.PING_TIMEOUT_MS,
          allow = allow, durable = { id = d.id, token = d.token, fence = d.fence } })
        h.hello, h.sandbox, h.hello_at = msg, msg.sandbox, core.now_ms()
        -- its numbering: the attached line is none of it
        h.seq_base, h.uncounted = math.floor(msg.from), 1
        h.sent = math.floor(tonumber(msg.taken) or 0)
        h.beating = true
        drv:heartbeat('{"type":"ping"}', math.min(exec.PING_MS, math.max(math.floor(h.ping_timeout_ms / 2), 1)),
          h.ping_timeout_ms)
        return h, { from = h.seq_base, lost = math.floor(msg.lost), sent = math.floor(msg.sent),
          taken = h.sent }
      end
      drv:close()
      if t == "refused" then
        return failed("sandbox_unavailable", "the lingering sandbox refused the attach: " .. tostring(msg.message))
      elseif t == "failed" then
        return failed("sandbox_lost", tostring(msg.message))
      elseif t == "attached" then
        return failed("sandbox_unavailable", ("the lingering sandbox makes a %s sandbox, which option "
          .. "'sandbox.allow' does not name"):format(tostring(msg.sandbox)))
      end
      return failed("sandbox_lost", "the far side's first line is not an answer to the attach: " .. a:sub(1, 200))
    elseif kind == "exit" or kind == "failed" then
      drv:close()
      return failed("sandbox_lost", ("no lingering sandbox %s answered (the attach's stream ended)"):format(d.id))
    elseif kind ~= nil then
      drv:close()
      return failed("sandbox_lost", "the far side's first line is not an answer to the attach")
    end
  end
end

return M
