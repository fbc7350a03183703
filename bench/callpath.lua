-- How many Lua calls, and through how many files, one run() with one
-- llm_query takes (issue 40): a scripted root model writes one code block
-- that calls llm_query, then gives FINAL; a "call" hook counts every Lua
-- function entered (C functions left out) from Session.new to run()'s
-- return, the files they live in, and how often the next call is in
-- another file than the last. The sandbox's start is counted with the rest:
-- it is part of the run.
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/5.4/?.so;;" lua5.4 bench/callpath.lua
-- prints "calls N files N changes N (to llm_query N, then to the second
-- root call N, then N)"; with -v, the calls per file.
-- The count varies by some tens from run to run: how often the engine
-- wakes while the sandbox starts depends on the machine's timing.
local rlm = require("rlm")

local verbose = arg and arg[1] == "-v"
local answers = {
  "```repl\nx = llm_query(\"q\")\n```",
  "FINAL(done)",
}

local here = debug.getinfo(1, "S").short_src
local calls, files, changes, last = 0, {}, 0, nil
local function hook()
  local info = debug.getinfo(2, "S")
  if info.what == "C" or info.short_src == here then
    return -- C, or this file's mock model and coroutine wrapper
  end
  local src = info.short_src
  calls = calls + 1
  files[src] = (files[src] or 0) + 1
  if last and src ~= last then
    changes = changes + 1
  end
  last = src
end

-- The count when the llm_query callback was called and when the root model
-- was called the second time: the middle part is the sub-call's answer
-- going back to the driver and the exec's end, which does not depend on
-- the start's timing.
local turn, at_query, at_second = 0, nil, nil
local tmpdir = os.getenv("TMPDIR") or "/tmp"
local opts = {
  context = "",
  root_llm = function()
    turn = turn + 1
    if turn == 2 then
      at_second = calls
    end
    return answers[math.min(turn, #answers)]
  end,
  llm_query = function(prompt)
    at_query = calls
    return prompt
  end,
  sandbox = { tmpdir = tmpdir },
}

-- The engine, the loop of run() and the callbacks run in coroutines of
-- their own: each gets the hook too.
local create = coroutine.create
coroutine.create = function(fn) -- luacheck: ignore 122
  local co = create(fn)
  debug.sethook(co, hook, "c")
  return co
end

debug.sethook(hook, "c")
local s = rlm.Session.new(opts)
local result, err = s:run()
debug.sethook()
coroutine.create = create -- luacheck: ignore 122
s:close()
assert(result, err and err.message)
assert(result.answer == "done", result.answer)

local n, names = 0, {}
for src, count in pairs(files) do
  n = n + 1
  names[#names + 1] = { src, count }
end
print(("calls %d files %d changes %d (to llm_query %d, then to the second root call %d, then %d)")
  :format(calls, n, changes, at_query, at_second - at_query, calls - at_second))
if verbose then
  table.sort(names, function(a, b)
    return a[2] > b[2]
  end)
  for _, f in ipairs(names) do
    print(("%6d %s"):format(f[2], f[1]))
  end
end
