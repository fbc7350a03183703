-- kubectl as rlm.sandbox.pods runs it: a client's argv (its program found
-- on PATH, a namespace), a command run to its end through a wait function
-- (blocking, or a coroutine's that yields while the command has nothing
-- to say), and a command started and left to run (a delete nobody waits
-- on). Each command is an rlm.core helper: a process per call, none held.
local core = require("rlm.core")
local helpers = require("rlm.sandbox.helper")
local util = require("rlm.base.util")

local M = {}

-- What a kubectl may print (a sweep's list of a big namespace).
M.MAX_OUTPUT = 16 * 2 ^ 20

local Client = {}
Client.__index = Client

-- Waits on the thread for the helper's next event, polling.
function M.blocking_wait(helper)
  while true do
    local kind, a, b, c = helper:poll(100)
    if kind then
      return kind, a, b, c
    end
  end
end

-- A coroutine's wait: what the helper has now, else a yield (of the
-- helper) to whoever drives the coroutine, which resumes it with an event
-- it read itself (one waiting for it) or with nothing (look again).
function M.stepwise_wait(helper)
  while true do
    local kind, a, b, c = helper:poll(0)
    if kind then
      return kind, a, b, c
    end
    kind, a, b, c = coroutine.yield(helper)
    if kind then
      return kind, a, b, c
    end
  end
end

-- prefix: the argv before the command ({ "kubectl", "--kubeconfig", ... });
-- namespace: nil for the kubeconfig's.
function M.new(prefix, namespace)
  return setmetatable({ prefix = prefix, namespace = namespace }, Client)
end

-- The argv for args, or nil and why (the program is not on PATH).
function Client:argv(args)
  local argv = util.append({}, self.prefix)
  local program = core.find_program(argv[1])
  if not program then
    return nil, ("%s was not found (option 'kubectl')"):format(argv[1])
  end
  argv[1] = program
  if self.namespace then
    util.append(argv, { "--namespace", self.namespace })
  end
  return util.append(argv, args)
end

-- Starts args, killed after ms: the helper, or nil and why.
function Client:start(args, ms)
  local argv, err = self:argv(args)
  local helper
  if argv then
    helper, err = core.helper(argv, math.floor(ms), M.MAX_OUTPUT)
  end
  if not helper then
    return nil, ("%s cannot run (%s)"):format(self.prefix[1], tostring(err))
  end
  return helper, argv
end

-- Runs args to its end within ms, its events read through wait: its
-- lines and stderr; or nil, why, and the lines it printed (it did not
-- start, exited with a status, printed too much, was killed at ms).
function Client:run(args, ms, wait)
  local helper, argv = self:start(args, ms)
  if not helper then
    return nil, argv
  end
  local lines, status, stderr = helpers.drain(helper, wait, ("it did not end within %.0f ms and was killed"):format(ms))
  local command = table.concat(argv, " "):sub(1, 300)
  if not lines then
    return nil, ("%s: %s"):format(command, status), stderr
  end
  stderr = stderr:gsub("%s+$", "")
  if status ~= 0 then
    return nil, ("%s: exit %d%s"):format(command, status, stderr ~= "" and ": " .. stderr:sub(-600) or ""), lines
  end
  return lines, stderr
end

-- Runs args (a `get --watch`) until on_line(line) returns true for one
-- of its lines, then kills it: true; or nil and why (it ended, failed or
-- reached ms first).
function Client:watch(args, ms, wait, on_line)
  local helper, argv = self:start(args, ms)
  if not helper then
    return nil, argv
  end
  local why
  while true do
    local kind, a, b, d = wait(helper)
    if kind == "line" then
      if on_line(a) then
        break
      end
    else
      if kind == "exit" then
        why = ("it ended (exit %d)%s"):format(helpers.status(a, b),
          d and d:match("%S") and ": " .. d:gsub("%s+$", ""):sub(-600) or "")
      elseif kind == "timeout" then
        why = ("it did not see them within %.0f ms"):format(ms)
      else
        why = kind == "failed" and tostring(a) or "it printed too much"
      end
      break
    end
  end
  helper:close()
  if why then
    return nil, ("%s: %s"):format(table.concat(argv, " "):sub(1, 300), why)
  end
  return true
end

-- Names per delete (core.helper takes 256 arguments).
local NAMES_PER_DELETE = 200

local function delete_args(list, i)
  local args = { "delete", "--wait=false", "--ignore-not-found" }
  for j = i, math.min(i + NAMES_PER_DELETE - 1, #list) do
    util.append(args, { "pod/" .. list[j], "secret/" .. list[j] })
  end
  return args
end

-- Deletes the pods and Secrets of the names list, to the commands' end:
-- true, or nil and the first why.
function Client:delete(list, ms, wait)
  local err
  for i = 1, #list, NAMES_PER_DELETE do
    local ok, why = self:run(delete_args(list, i), ms, wait)
    err = err or (not ok and why or nil)
  end
  return not err, err
end

-- Starts the delete of the first names of list, left to run: the helper
-- (or nil and why), and the names it did not take.
function Client:start_delete(list, ms)
  local rest = {}
  for i = NAMES_PER_DELETE + 1, #list do
    rest[#rest + 1] = list[i]
  end
  local helper, why = self:start(delete_args(list, 1), ms)
  return helper, why, rest
end

-- Reads what a started helper has said without waiting: nil while it
-- runs; when it has ended, true, or false and why.
function M.ended(helper)
  local kind, a, b, d = helper:poll(0)
  while kind == "line" do
    kind, a, b, d = helper:poll(0)
  end
  if not kind then
    return nil
  end
  if kind == "exit" and a == 0 and b == 0 then
    return true
  end
  return false, ("%s %s"):format(kind, tostring(kind == "exit" and (d or a) or a))
end

return M
