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

local pack, unpack = M.pack, M.unpack

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

-- What a callback's yield gets back when there is no one to pass it to:
-- call_protected then fails the call.
M.NO_YIELD = setmetatable({}, { __tostring = function()
  return "rlm.NO_YIELD"
end })

-- pcall and xpcall can be yielded across everywhere but on PUC Lua 5.1.
local yieldable_pcall = not (_VERSION == "Lua 5.1" and rawget(_G, "jit") == nil)

-- The one way a user callback is called (every host, every callback): fn
-- runs with args in a coroutine of its own (under run() and step(), one
-- that ran an earlier call and ended it: see worker), what it raises is caught with
-- a traceback, and on_end(ok, results... | false, message) is called once,
-- when it returns. A yield of fn:
--   pass_yields: passed on to whoever resumed us (run() inside a scheduler's
--     coroutine, cqueues, an OpenResty request), and its answer handed back;
--     when nothing may yield there, the call fails (NO_YIELD);
--   otherwise: fn stays suspended until what it waits on (a timer, a
--     socket of the host's loop) resumes it; on_end comes then.
-- On PUC Lua 5.1, a raise after such an outside resume reaches that resumer.
local DONE = {} -- what a worker yields when its call is over
local workers = {} -- idle workers, for the next call (a few at most)
-- Not on LuaJIT: there an idle worker kept a finished call's session
-- reachable (its sandbox outlived close-by-GC in the specs), and a
-- coroutine costs it little to make.
local MAX_IDLE_WORKERS = rawget(_G, "jit") and 0 or 4

-- fn(...) in the calling coroutine; finish(ok, results... | false,
-- message). The arguments travel as varargs, not in a table.
local run_job
if yieldable_pcall then
  local traceback = debug.traceback
  run_job = function(fn, finish, ...)
    return finish(xpcall(fn, traceback, ...)) -- fn may be a callable table
  end
else
  run_job = function(fn, finish, ...)
    return finish(true, fn(...))
  end
end

-- A worker runs one call after another: after each it yields DONE and
-- waits for the next. A coroutine per call costs its allocation (a Lua
-- state and its stack) on every llm_query. An idle worker holds nothing of
-- its last call: the call's values live in run_job's frame only.
local function worker(...)
  run_job(...)
  while true do
    run_job(coroutine.yield(DONE))
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

local NO_RESUMER = "the callback yielded, and nothing can resume it here (run() outside a coroutine, "
  .. "or on_event/cost_usd under an adapter): "

-- What call() does with one resume's results (varargs: no table per
-- resume): the call ended, raised, or yielded (passed on when pass_yields).
local resumed
local function yielded_back(co, c, first, ...)
  if first == M.NO_YIELD then
    return c(false, NO_RESUMER .. debug.traceback(co))
  end
  return resumed(co, c, coroutine.resume(co, first, ...))
end

resumed = function(co, c, ok, ...)
  if not ok then
    return c(false, debug.traceback(co, tostring((...))))
  end
  if c.pass_yields and ... == DONE and c.ended and coroutine.status(co) == "suspended" then
    if #workers < MAX_IDLE_WORKERS then
      workers[#workers + 1] = co
    end
    return
  end
  if c.ended or not c.pass_yields or coroutine.status(co) == "dead" then
    return
  end
  if not M.can_yield() then
    return c(false, NO_RESUMER .. debug.traceback(co))
  end
  return yielded_back(co, c, coroutine.yield(...))
end

-- call(fn, on_end, ctx, pass_yields, ...): fn(...) as described above;
-- on_end(ctx, ok, results... | false, message) once.
local function call(fn, on_end, ctx, pass_yields, ...)
  local c = setmetatable({ ended = false, on_end = on_end, ctx = ctx, pass_yields = pass_yields }, Call)
  -- Only when pass_yields does this function resume the coroutine to the
  -- end, and so sees DONE: a callback that waits on the host's loop is
  -- resumed by that loop, which must see its coroutine end.
  local co
  if pass_yields and MAX_IDLE_WORKERS > 0 then
    co = table.remove(workers) or coroutine.create(worker)
  else
    co = coroutine.create(run_job)
  end
  return resumed(co, c, coroutine.resume(co, fn, c, ...))
end

-- A callback whose results are wanted here and now (on_event, cost_usd):
-- returns true, results... or false, message. Yields pass through.
function M.call_protected(f, ...)
  local out
  call(f, function(_, ...)
    out = pack(...)
  end, nil, true, ...)
  return unpack(out, 1, out.n)
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

-- A model callback (root_llm, llm_query, llm_query_batch): fn(arg, done)
-- and finish(ok, text, usage) exactly once. fn may
--   return text[, usage] (or raise, or return nil, "message");
--   yield (see call above), then return as above;
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
  call(fn, returned, once, pass_yields, arg, done)
  if pass_yields then
    once(true, nil) -- it returned nothing and called no done(): "returned nil"
  end
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

-- Where this file lives, so the driver can be found next to the modules.
function M.module_dir()
  local source = debug.getinfo(1, "S").source
  return (source:sub(1, 1) == "@" and source:sub(2) or source):match("^(.*)/[^/]*$") or "."
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

return M
