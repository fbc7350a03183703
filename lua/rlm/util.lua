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

-- Calls f(...) in a coroutine of its own and passes any yield through to
-- whoever resumed us, so user callbacks may yield (to an outer scheduler, an
-- OpenResty cosocket, Neovim's loop) on every Lua, 5.1 included, while their
-- errors are still caught. Returns true, results... or false, message; a
-- yield with no coroutine to pass it to is that message.
function M.call_protected(f, ...)
  local co = coroutine.create(function(...)
    return f(...) -- f may be a callable table
  end)
  local res = pack(coroutine.resume(co, ...))
  while true do
    if not res[1] then
      return false, debug.traceback(co, tostring(res[2]))
    end
    if coroutine.status(co) == "dead" then
      return true, unpack(res, 2, res.n)
    end
    local back
    if M.can_yield() then
      back = pack(coroutine.yield(unpack(res, 2, res.n)))
    else
      back = pack(M.NO_YIELD)
    end
    if back[1] == M.NO_YIELD then
      return false, "the callback yielded, and nothing can resume it here (run() outside a coroutine, "
        .. "or on_event/cost_usd under an adapter): " .. debug.traceback(co)
    end
    res = pack(coroutine.resume(co, unpack(back, 1, back.n)))
  end
end

-- Appends the items of each list to dst; returns dst.
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
