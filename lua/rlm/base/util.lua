-- Small helpers shared by the modules of rlm.
local M = {}

M.unpack = rawget(table, "unpack") or unpack -- 5.2+, or 5.1 and LuaJIT

function M.pack(...)
  return { n = select("#", ...), ... }
end

function M.is_callable(v)
  if type(v) == "function" then
    return true
  end
  local mt = getmetatable(v)
  return type(mt) == "table" and type(mt.__call) == "function"
end

-- Whether the running code may yield: inside a coroutine, and (5.3+) not
-- across a C boundary.
function M.can_yield()
  local isyieldable = rawget(coroutine, "isyieldable")
  if isyieldable then
    return isyieldable()
  end
  local co, main = coroutine.running()
  return co ~= nil and not main
end

-- A yield from a callback inside a loop of rlm's own coroutine (the
-- engine's, run()'s): passed on to whoever resumed that coroutine when it
-- may yield; otherwise the callback gets NO_YIELD back, and fails.
function M.pass_through(...)
  if not M.can_yield() then
    return M.NO_YIELD
  end
  return coroutine.yield(...)
end

-- What a callback's yield gets back when there is no one to pass it to:
-- call_protected then fails the call.
M.NO_YIELD = setmetatable({}, { __tostring = function()
  return "rlm.NO_YIELD"
end })

-- pcall and xpcall can be yielded across everywhere but on PUC Lua 5.1.
local yieldable_pcall = not (_VERSION == "Lua 5.1" and rawget(_G, "jit") == nil)
M.PCALL_YIELDS = yieldable_pcall

-- How a user callback is called (every host, every callback): in a
-- coroutine of its own, what it raises caught with a traceback. Two ways,
-- by where a yield of it goes:
--   run_now(fn, ...): here and now, as run() and step() call every callback
--     and every host calls on_event, cost.usd and validate. A yield is
--     passed on to whoever resumed us (run() inside a scheduler's
--     coroutine, cqueues, an OpenResty request) and its answer handed
--     back; when nothing may yield there, the call fails (NO_YIELD).
--     Returns true, results... | false, message.
--   call(fn, on_end, ctx, ...): under an adapter. fn stays suspended until
--     what it waits on (a timer, a socket of the host's loop) resumes it;
--     on_end(ctx, ok, results... | false, message) comes once, when it
--     returns.
-- On PUC Lua 5.1, a raise after such an outside resume reaches that resumer.
local DONE = {} -- what a worker yields when its call is over
local traceback = debug.traceback

local NO_RESUMER = "the callback yielded, and nothing can resume it here (run() outside a coroutine, "
  .. "or on_event/cost.usd under an adapter): "

-- run_now's workers run one call after another: a coroutine per call costs
-- its allocation (a Lua state and its stack) on every llm_query. A call
-- comes in its worker's slot (fn and up to two arguments), emptied before
-- fn runs, so that an idle worker holds nothing of its last call. Not on
-- LuaJIT: there an idle worker kept a finished call's session reachable
-- (its sandbox outlived close-by-GC in the specs), and a coroutine costs it
-- little to make.
local MAX_IDLE_WORKERS = rawget(_G, "jit") and 0 or 4
local idle_workers = {} -- { co =, slot = }

local function run_slot(slot)
  local fn, n, a, b = slot.fn, slot.n, slot.a, slot.b
  slot.fn, slot.a, slot.b = nil, nil, nil
  if yieldable_pcall then -- fn may be a callable table
    if n == 0 then
      return xpcall(fn, traceback)
    elseif n == 1 then
      return xpcall(fn, traceback, a)
    end
    return xpcall(fn, traceback, a, b)
  end
  if n == 0 then
    return true, fn()
  elseif n == 1 then
    return true, fn(a)
  end
  return true, fn(a, b)
end

local function worker(slot)
  while true do
    coroutine.yield(DONE, run_slot(slot))
  end
end

-- One resume of worker w (varargs: no table per resume): the call ended
-- (DONE and its results), raised (PUC Lua 5.1), or yielded: passed on.
local now_resumed
local function now_back(w, first, ...)
  if first == M.NO_YIELD then
    return false, NO_RESUMER .. traceback(w.co)
  end
  return now_resumed(w, coroutine.resume(w.co, first, ...))
end

now_resumed = function(w, ok, first, ...)
  if not ok then
    return false, traceback(w.co, tostring(first))
  end
  if first == DONE then
    if #idle_workers < MAX_IDLE_WORKERS then
      idle_workers[#idle_workers + 1] = w
    end
    return ...
  end
  if not M.can_yield() then
    return false, NO_RESUMER .. traceback(w.co) -- w stays suspended: never reused
  end
  return now_back(w, coroutine.yield(first, ...))
end

-- run_now with its arguments counted: fn(a, b) when n is 2 (a model
-- callback's: its argument and info), fn(a) or fn() for 1 or 0.
local function run_argv(fn, n, a, b)
  local idle = #idle_workers
  local w = idle_workers[idle]
  if w then
    idle_workers[idle] = nil
  else
    w = { co = coroutine.create(worker), slot = {} }
  end
  local slot = w.slot
  slot.fn, slot.n, slot.a, slot.b = fn, n, a, b
  return now_resumed(w, coroutine.resume(w.co, slot))
end

local function run_now(fn, ...)
  local n = select("#", ...)
  assert(n <= 2, "rlm.util: run_now takes at most two arguments")
  return run_argv(fn, n, ...)
end

-- fn(...) in the calling coroutine; finish(ok, results... | false,
-- message). The arguments travel as varargs, not in a table.
local run_job
if yieldable_pcall then
  run_job = function(fn, finish, ...)
    return finish(xpcall(fn, traceback, ...))
  end
else
  run_job = function(fn, finish, ...)
    return finish(true, fn(...))
  end
end

-- One call's state, and the function that ends it: c(ok, results...)
-- calls c.on_end(c.ctx, ok, results...) the first time only. A callable
-- table, not a closure per call.
local Call = {
  __call = function(c, ...)
    if not c.ended then
      c.ended = true
      return c.on_end(c.ctx, ...)
    end
  end,
}

-- call(fn, on_end, ctx, ...): fn(...) under an adapter, as described above.
local function call(fn, on_end, ctx, ...)
  local c = setmetatable({ ended = false, on_end = on_end, ctx = ctx }, Call)
  local co = coroutine.create(run_job)
  local ok, err = coroutine.resume(co, fn, c, ...)
  if not ok then
    return c(false, traceback(co, tostring(err)))
  end
end

-- A callback whose results are wanted here and now (on_event, cost.usd,
-- validate; at most two arguments): returns true, results... or false,
-- message. Yields pass through.
function M.call_protected(f, ...)
  return run_now(f, ...)
end

-- What a model callback's return means (see invoke): once(ok, text, usage).
local function returned(once, ok, ...)
  if not ok then
    return once(false, tostring((...)))
  end
  local n, text, second = select("#", ...), ...
  if text ~= nil then
    once(true, text, second)
  elseif n >= 2 and type(second) == "string" then
    once(false, second)
  end -- nothing returned: done() will come
end

-- A model callback (root_llm, llm_query, llm_query_batch) or a tool:
-- fn(arg, done) and finish(ok, text, usage) exactly once. fn may
--   return text[, usage] (or raise, or return nil, "message");
--   yield (see above), then return as above;
--   return nothing, and call done(text[, usage]) or done(nil, "message")
--     later: from anything of the host's loop under an adapter; under
--     run() and step() (pass_yields), before it returns or while a yield
--     it passed out is pending, or the call is taken as returning nil.
function M.invoke(fn, arg, finish, pass_yields)
  local finished = false
  local function once(ok, a, b)
    if not finished then
      finished = true
      finish(ok, a, b)
    end
  end
  local function done(text, usage)
    if text == nil then
      once(false, usage ~= nil and tostring(usage) or "the callback called done() without a result")
    else
      once(true, text, usage)
    end
  end
  if not pass_yields then
    return call(fn, returned, once, arg, done)
  end
  returned(once, run_argv(fn, 2, arg, done))
  once(true, nil) -- it returned nothing and called no done(): "returned nil"
end

-- Appends the items of each list to dst; returns dst.
-- A table decoded from JSON as a list: keys 1..n only (cjson makes [] an
-- empty table, so an empty table is both a list and a dict).
function M.is_json_array(v)
  if type(v) ~= "table" then
    return false
  end
  local n = #v
  for k in pairs(v) do
    if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then
      return false
    end
  end
  return true
end

-- A table decoded from JSON as a dict: string keys only.
function M.is_json_object(v)
  if type(v) ~= "table" then
    return false
  end
  for k in pairs(v) do
    if type(k) ~= "string" then
      return false
    end
  end
  return true
end

function M.append(dst, ...)
  for i = 1, select("#", ...) do
    for _, v in ipairs((select(i, ...))) do
      dst[#dst + 1] = v
    end
  end
  return dst
end

-- Where the rlm modules live (this file is rlm/base/util.lua), so the
-- driver can be found next to them.
function M.module_dir()
  local source = debug.getinfo(1, "S").source
  local path = source:sub(1, 1) == "@" and source:sub(2) or source
  return path:match("^(.*)/[^/]*/[^/]*$") or (path:find("/") and "." or "..")
end

-- The whole of a file: its bytes, or nil, why and the errno (io.open's).
function M.read_file(path)
  local f, msg, code = io.open(path, "rb")
  if not f then
    return nil, msg, code
  end
  local s = f:read("*a")
  f:close()
  return s
end

-- A word for sh, in single quotes (a quote within as '\'').
function M.shell_quote(word)
  return "'" .. tostring(word):gsub("'", "'\\''") .. "'"
end

-- A list of words for sh, each quoted, joined by spaces.
function M.shell_words(list)
  local out = {}
  for i, w in ipairs(list) do
    out[i] = M.shell_quote(w)
  end
  return table.concat(out, " ")
end

-- true, or false and why when the reason is not that the file is missing
-- (EMFILE, EACCES: a file that is there but cannot be opened).
function M.file_exists(path)
  local f, msg, code = io.open(path, "rb")
  if f then
    f:close()
    return true
  end
  if code == 2 then -- ENOENT
    return false
  end
  return false, msg
end

-- n bytes from the kernel's random source, as 2n hex digits; nil and why
-- when they cannot be read.
function M.random_hex(n)
  local f, err = io.open("/dev/urandom", "rb")
  if not f then
    return nil, "reading /dev/urandom: " .. tostring(err)
  end
  local bytes = f:read(n)
  f:close()
  if not bytes or #bytes ~= n then
    return nil, "reading /dev/urandom: too few bytes"
  end
  return (bytes:gsub(".", function(c)
    return ("%02x"):format(c:byte())
  end))
end

return M
