-- rlm.llm.transport.luasocket_loop: how the LuaSocket transport waits on
-- its sockets. Outside gather() a wait is a socket.select on one socket,
-- and the caller blocks. Inside gather() each task runs in a coroutine of
-- its own: a wait yields to the scheduler, which selects over every waiting
-- socket and resumes the ones ready, so that a batch's calls run side by
-- side on one thread (cqueues' shape: the yield says what to wait for, the
-- loop does the waiting).
local socket = require("socket")
local unpack = require("rlm.base.util").unpack

local M = {}

-- Tasks in flight at once, at most: select()'s sets hold descriptors below
-- FD_SETSIZE (1024), and the host has others.
M.MAX_IN_FLIGHT = 256

local WAIT = {} -- what a task yields to the scheduler
local tasks = setmetatable({}, { __mode = "k" }) -- the coroutines gather runs

local function in_task()
  local co = coroutine.running()
  return co ~= nil and tasks[co] == true
end

-- How often a wait calls its idle function (the command line's status
-- line redraws its clock from it while a model call is out).
M.IDLE_S = 0.25

-- Waits until sock is ready to read (mode "r") or write ("w"), or the
-- deadline (socket.gettime() seconds) passes: true, or nil, "timeout".
-- idle, when given, is called every IDLE_S seconds of the wait.
function M.wait(sock, mode, deadline, idle)
  if in_task() then
    return coroutine.yield(WAIT, sock, mode, deadline, idle)
  end
  local set = { sock }
  while true do
    local left = deadline - socket.gettime()
    if left <= 0 then
      return nil, "timeout"
    end
    local r, w = socket.select(mode == "r" and set or nil, mode == "w" and set or nil,
      idle and math.min(left, M.IDLE_S) or left)
    if (r and r[1]) or (w and w[1]) then
      return true
    end
    if idle then
      idle()
    end
  end
end

-- Sleeps, letting the other tasks run inside gather().
function M.sleep(seconds)
  if in_task() then
    coroutine.yield(WAIT, nil, nil, socket.gettime() + seconds)
    return
  end
  socket.sleep(seconds)
end

-- Runs each of tasks (functions) in a coroutine of its own, side by side,
-- at most limit (default MAX_IN_FLIGHT) at once, and returns when all have
-- ended: a table of index -> message for those that raised. A yield that
-- is not a wait (an outer scheduler's: a cosocket, a coroutine-aware
-- client) is passed to whoever resumed gather, and its answer handed back.
function M.gather(list, limit)
  limit = limit or M.MAX_IN_FLIGHT
  local failed, waiting = {}, {} -- co -> { index, sock, mode, deadline }
  local live, next_index = 0, 1

  local function resume(co, index, ...)
    local r = { n = 0 }
    local function keep(...)
      r = { n = select("#", ...), ... }
    end
    keep(coroutine.resume(co, ...))
    while true do
      if not r[1] then
        failed[index] = tostring(r[2])
        live = live - 1
        return
      elseif coroutine.status(co) == "dead" then
        live = live - 1
        return
      elseif r[2] == WAIT then
        waiting[co] = { index = index, sock = r[3], mode = r[4], deadline = r[5], idle = r[6] }
        return
      end
      keep(coroutine.resume(co, coroutine.yield(unpack(r, 2, r.n))))
    end
  end

  while next_index <= #list or live > 0 do
    while next_index <= #list and live < limit do
      local index, fn = next_index, list[next_index]
      next_index = next_index + 1
      local co = coroutine.create(fn)
      tasks[co] = true
      live = live + 1
      resume(co, index)
    end
    if live == 0 then
      break
    end
    -- Those whose time is up go first: a sleep ends, a wait times out.
    local now, soonest = socket.gettime(), math.huge
    local due, recvt, sendt, by_sock, idles = {}, {}, {}, {}, {}
    for co, w in pairs(waiting) do
      if w.idle then
        idles[w.idle] = true
      end
      if w.deadline <= now then
        due[#due + 1] = co
      else
        soonest = math.min(soonest, w.deadline)
        if w.sock then
          by_sock[w.sock] = co
          local set = w.mode == "w" and sendt or recvt
          set[#set + 1] = w.sock
        end
      end
    end
    if #due > 0 then
      for _, co in ipairs(due) do
        local w = waiting[co]
        waiting[co] = nil
        if w.sock then
          resume(co, w.index, nil, "timeout")
        else
          resume(co, w.index, true)
        end
      end
    elseif #recvt + #sendt == 0 then
      socket.sleep(soonest - now)
    else
      local r, w = socket.select(recvt, sendt, next(idles) and math.min(soonest - now, M.IDLE_S) or soonest - now)
      for idle in pairs(idles) do
        idle()
      end
      local ready = {}
      for _, set in ipairs({ r or {}, w or {} }) do
        for _, sock in ipairs(set) do
          ready[#ready + 1] = by_sock[sock]
        end
      end
      for _, co in ipairs(ready) do
        local wt = waiting[co]
        if wt then
          waiting[co] = nil
          resume(co, wt.index, true)
        end
      end
    end
  end
  return failed
end

return M
