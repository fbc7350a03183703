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

local function run_job(fn, args, finish)
  if yieldable_pcall then
    return finish(xpcall(function()
      return fn(unpack(args, 1, args.n)) -- fn may be a callable table
    end, debug.traceback))
  end
  return finish(true, fn(unpack(args, 1, args.n)))
end

-- A worker runs one call after another: after each it yields DONE and
-- waits for the next. A coroutine per call costs its allocation (a Lua
-- state and its stack) on every llm_query.
local function worker(fn, args, finish)
  while true do
    run_job(fn, args, finish)
    -- An idle worker holds nothing of its last call.
    fn, args, finish = nil, nil, nil -- luacheck: ignore 311
    fn, args, finish = coroutine.yield(DONE)
  end
end

local function call(fn, args, on_end, pass_yields)
  local ended = false
  local function finish(...)
    if not ended then
      ended = true
      on_end(...)
    end
  end
  -- Only when pass_yields does this function resume the coroutine to the
  -- end, and so sees DONE: a callback that waits on the host's loop is
  -- resumed by that loop, which must see its coroutine end.
  local co
  if pass_yields and MAX_IDLE_WORKERS > 0 then
    co = table.remove(workers) or coroutine.create(worker)
  else
    co = coroutine.create(run_job)
  end
  local res = pack(coroutine.resume(co, fn, args, finish))
  while true do
    if not res[1] then
      return finish(false, debug.traceback(co, tostring(res[2])))
    end
    if pass_yields and res[2] == DONE and ended and coroutine.status(co) == "suspended" then
      if #workers < MAX_IDLE_WORKERS then
        workers[#workers + 1] = co
      end
      return
    end
    if ended or not pass_yields or coroutine.status(co) == "dead" then
      return
    end
    local back
    if M.can_yield() then
      back = pack(coroutine.yield(unpack(res, 2, res.n)))
    else
      back = pack(M.NO_YIELD)
    end
    if back[1] == M.NO_YIELD then
      return finish(false, "the callback yielded, and nothing can resume it here (run() outside a coroutine, "
        .. "or on_event/cost_usd under an adapter): " .. debug.traceback(co))
    end
    res = pack(coroutine.resume(co, unpack(back, 1, back.n)))
  end
end

-- A callback whose results are wanted here and now (on_event, cost_usd):
-- returns true, results... or false, message. Yields pass through.
function M.call_protected(f, ...)
  local out
  call(f, pack(...), function(...)
    out = pack(...)
  end, true)
  return unpack(out, 1, out.n)
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
  call(fn, pack(arg, done), function(ok, ...)
    if not ok then
      return once(false, tostring((...)))
    end
    local n, text, second = select("#", ...), ...
    if text ~= nil then
      once(true, text, second)
    elseif n >= 2 and type(second) == "string" then
      once(false, second)
    end -- nothing returned: done() will come
  end, pass_yields)
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
