-- A warm pool of Kubernetes pods for the exec backend's `sandbox.claim`
-- and `sandbox.release` (docs/backends.md, "A warm pool of pods"): pods
-- made from a template whose container runs `rlm-keeper --listen`, each
-- with a token of its own in a Secret of the pod's name mounted at
-- /var/run/rlm/token. A claim hands out a Ready pod's { host, port, token }
-- (the exec backend connects to the keeper: no process per session); a
-- release deletes the pod and its Secret with a `kubectl delete
-- --wait=false` that nobody waits on, and starts a refill. kubectl does
-- the lifecycle: one process per batch of pods (create, then a watch), never
-- one held per session.
--
-- Names and labels say whose a pod is: <pool>-<boot>-<pid>-<start>-<token>-<n>
-- (rlm.sandbox.container_names), the labels rlm.sandbox/pool, /host and
-- /machine (a hash of the machine's id and hostname). sweep() removes the
-- pods and Secrets of this pool whose host is proven gone on this machine
-- (its pid runs no more, or the machine booted since); another machine's
-- are never this host's to judge.
--
-- Waiting: each kubectl (rlm.sandbox.kubectl) is read through opts.wait
-- (default: blocks the thread, polling); a refill after a release runs in
-- a coroutine of the pool's own, moved on without waiting at every claim,
-- release, stats() and pump().
local errors = require("rlm.base.errors")
local json = require("rlm.base.json")
local util = require("rlm.base.util")
local names = require("rlm.sandbox.container_names")
local kubectl = require("rlm.sandbox.kubectl")
local manifest = require("rlm.sandbox.pod_manifest")

local M = {}

M.POOL_LABEL = "rlm.sandbox/pool"
M.HOST_LABEL = "rlm.sandbox/host"
M.MACHINE_LABEL = "rlm.sandbox/machine"
M.BATCH_LABEL = "rlm.sandbox/batch"

local Pods = {}
Pods.__index = Pods

local function unavailable(fmt, ...)
  return nil, errors.new("sandbox_unavailable", fmt:format(...))
end

-- Starts the background delete of the names queued, unless one runs: one
-- kubectl at a time, for all the releases since the last (a hundred
-- sessions closed at once are a kubectl or two, not a hundred).
function Pods:_start_delete()
  if self.deleting[1] or not self.to_delete[1] then
    return
  end
  local helper, why
  helper, why, self.to_delete = self.kubectl:start_delete(self.to_delete, self.command_timeout_ms)
  if helper then
    self.deleting[1] = helper
  else
    self.counts.release_failed = self.counts.release_failed + 1
    self.last_error = why
  end
end

-- Deletes pods and their Secrets by name; with wait, to the command's
-- end (its error), else in the background (reaped by pump()).
function Pods:_delete(list, wait)
  if not wait then
    util.append(self.to_delete, list)
    return self:_start_delete()
  end
  local ok, err = self.kubectl:delete(list, self.command_timeout_ms, wait)
  if not ok then
    self.counts.release_failed = self.counts.release_failed + 1
    self.last_error = err
    return nil, err
  end
  return true
end

-- One batch of n pods: their Secrets and pods in one create, one watch
-- until all are Ready with an address; the Ready ones go idle. Those not
-- Ready in time are deleted, and the first is named.
function Pods:_batch(n, wait)
  if not self.pod then
    local pod, err = manifest.read_template(self.kubectl, self.template, self.command_timeout_ms, wait)
    if not pod then
      return nil, err
    end
    self.pod = pod
  end
  self.batches = self.batches + 1
  local batch = tostring(self.batches)
  local items, tokens, made = {}, {}, {}
  for i = 1, n do
    local name = names.next(self.name)
    local token, why = util.random_hex(16)
    if not token then
      return unavailable("a pod's token: %s", why)
    end
    local secret, p = manifest.sandbox(self.pod, name, token, { [M.POOL_LABEL] = self.name,
      [M.HOST_LABEL] = self.host, [M.MACHINE_LABEL] = self.machine, [M.BATCH_LABEL] = batch })
    items[#items + 1], items[#items + 2] = secret, p
    made[i], tokens[name] = name, token
  end
  -- The tokens are in this file for the create's time: mkstemp's 0600.
  -- create, not apply: the objects are new, and apply reads each first (a
  -- round trip more per object: 202 took over 60 s at a load of 60).
  local path = os.tmpname()
  local f = io.open(path, "w")
  if not f then
    os.remove(path)
    return unavailable("writing the pods' manifest %s", path)
  end
  f:write(json.encode({ apiVersion = "v1", kind = "List", items = items }))
  f:close()
  self.creating = true
  local applied, aerr = self.kubectl:run({ "create", "-o", "name", "-f", path }, self.command_timeout_ms, wait)
  self.creating = false
  os.remove(path)
  if not applied then
    self:_delete(made, wait)
    return unavailable("creating %d pods of pool %s: %s", n, self.name, aerr)
  end
  -- One watch of the batch's pods (not `kubectl wait`: 1.20's printed
  -- every one of 101 pods and then did not end), ended once each has said
  -- it is Ready with an address.
  local selector = M.HOST_LABEL .. "=" .. self.host .. "," .. M.BATCH_LABEL .. "=" .. batch
  local ready, count = {}, 0
  local _, werr = self.kubectl:watch({ "get", "pods", "-l", selector, "--watch", "-o",
    "jsonpath={.metadata.name} {.status.podIP} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}" },
    self.ready_timeout_ms, wait, function(line)
      local name, ip, status = line:match("^(%S+) (%S+) (%S+)$")
      if status == "True" and tokens[name] and not ready[name] then
        ready[name], count = ip, count + 1
      end
      return count == n
    end)
  local late = {}
  for _, name in ipairs(made) do
    if ready[name] then
      self.idle[#self.idle + 1] = { name = name, host = ready[name], token = tokens[name] }
    else
      late[#late + 1] = name
    end
  end
  self.counts.made = self.counts.made + (n - #late)
  if late[1] then
    self.counts.failed = self.counts.failed + #late
    self:_delete(late, wait)
    return unavailable("pod %s (and %d more of %d) not Ready with an address: %s", late[1], #late - 1, n,
      tostring(werr))
  end
  return n
end

-- Reaps the background deletes and moves the background refill on,
-- without waiting; with refill, starts one when the pool is below its size.
function Pods:pump(refill)
  local kept = {}
  for _, h in ipairs(self.deleting) do
    local ended, why = kubectl.ended(h)
    if ended ~= nil then
      if not ended then
        self.counts.release_failed = self.counts.release_failed + 1
        self.last_error = "kubectl delete: " .. why
      end
      h:close()
    else
      kept[#kept + 1] = h
    end
  end
  self.deleting = kept
  self:_start_delete()
  if self.refill then
    self:_resume_refill()
  end
  if refill and not self.refill and not self.closed and #self.idle < self.size then
    local n = math.min(self.batch_size, self.size - #self.idle)
    self.refill = { co = coroutine.create(function()
      return self:_batch(n, kubectl.stepwise_wait)
    end) }
    self:_resume_refill()
  end
end

function Pods:_resume_refill(...)
  local r = self.refill
  local ok, a, b = coroutine.resume(r.co, ...)
  if coroutine.status(r.co) ~= "dead" then
    r.helper = a
    return
  end
  self.refill = nil
  if not ok or not a then
    self.last_error = tostring(ok and b or a)
  end
end

-- Fills the pool to n more pods at once, in batches of batch_size, waiting
-- (opts.wait) until they are Ready: how many, or nil and err
-- (sandbox_unavailable) with the pods made before it idle in the pool.
function Pods:fill(n)
  self:_first_sweep()
  local made = 0
  while made < n do
    local got, err = self:_batch(math.min(self.batch_size, n - made), self.wait)
    if not got then
      return nil, err
    end
    made = made + got
  end
  return made
end

function Pods:_first_sweep()
  if not self.swept then
    self.swept = true
    self:sweep()
  end
end

-- claim(info): a Ready pod's { host, port, token } and its name (the
-- release's handle); from the idle pods without a process, else after the
-- refill in flight, else after a batch of its own. nil and why.
function Pods:claim()
  if self.closed then
    return nil, "the pod pool " .. self.name .. " is closed"
  end
  self:_first_sweep()
  self:pump()
  while not self.idle[1] and self.refill do
    local h = self.refill.helper
    if h then
      self:_resume_refill(self.wait(h))
    else
      self:_resume_refill()
    end
  end
  if not self.idle[1] then
    local _, err = self:fill(math.max(1, math.min(self.batch_size, self.size)))
    if not self.idle[1] then
      return nil, tostring(err and err.message or err)
    end
  end
  local p = table.remove(self.idle, 1)
  self.counts.claimed = self.counts.claimed + 1
  self.out[p.name] = true
  self:pump()
  return { host = p.host, port = self.port, token = p.token }, p.name
end

-- release(name): deletes the pod and its Secret in the background, and
-- refills. true (what the delete says comes at a later pump()).
function Pods:release(name)
  self.out[name] = nil
  self:_delete({ name })
  self:pump(true)
  return true
end

-- resize(n): keeps n pods ready from now on: the idle ones past n deleted
-- (in the background), a refill started when below (at release, pump(true)).
function Pods:resize(n)
  if type(n) ~= "number" or n < 0 or n % 1 ~= 0 then
    error("rlm.sandbox.pods: resize(n) takes an integer of 0 or more", 2)
  end
  self.size = n
  local extra = {}
  while #self.idle > n do
    extra[#extra + 1] = table.remove(self.idle).name
  end
  if extra[1] then
    self:_delete(extra)
  end
end

-- Removes the pods and Secrets of this pool whose host is proven gone on
-- this machine; returns the names removed, or nil and why.
function Pods:sweep()
  local lines, err = self.kubectl:run({ "get", "pods,secrets", "-l", M.POOL_LABEL .. "=" .. self.name, "-o",
    "jsonpath={range .items[*]}{.metadata.name} {.metadata.labels.rlm\\.sandbox/machine}{\"\\n\"}{end}" },
    self.command_timeout_ms, self.wait)
  if not lines then
    return nil, err
  end
  local ours, seen = {}, {}
  for _, line in ipairs(lines) do
    local name, machine = line:match("^(%S+) (%S+)$")
    if name and machine == self.machine and not seen[name] then
      seen[name] = true
      ours[#ours + 1] = name
    end
  end
  local gone = names.gone(self.name, ours, self.proc)
  if gone[1] then
    self:_delete(gone, self.wait)
  end
  return gone
end

-- stats(): { idle, out, made, claimed, failed, release_failed, deleting
-- (pods whose delete has not ended), last_error }.
function Pods:stats()
  self:pump()
  local out = 0
  for _ in pairs(self.out) do
    out = out + 1
  end
  local c = self.counts
  return { idle = #self.idle, out = out, made = c.made, claimed = c.claimed, failed = c.failed,
    release_failed = c.release_failed, deleting = #self.deleting + #self.to_delete, last_error = self.last_error }
end

-- Ends the pool: a refill's create waited for (what it creates is then
-- listed) and its wait killed, then every pod and Secret of this host's
-- pool deleted (by label: idle, claimed and half-made alike), waiting for
-- kubectl's answer. true, or nil and why.
function Pods:close()
  if self.closed then
    return true
  end
  self.closed = true
  while self.refill and self.creating and self.refill.helper do
    self:_resume_refill(kubectl.blocking_wait(self.refill.helper))
  end
  if self.refill and self.refill.helper then
    self.refill.helper:close()
  end
  self.refill, self.idle = nil, {}
  local ok, err = self.kubectl:run({ "delete", "pods,secrets", "--wait=false", "--ignore-not-found", "-l",
    M.POOL_LABEL .. "=" .. self.name .. "," .. M.HOST_LABEL .. "=" .. self.host }, self.command_timeout_ms, self.wait)
  for _, h in ipairs(self.deleting) do
    while kubectl.blocking_wait(h) == "line" do
    end
    h:close()
  end
  self.deleting, self.to_delete = {}, {} -- the label's delete took the queued ones
  if not ok then
    return nil, err
  end
  return true
end

local OPTIONS = { template = true, name = true, size = true, batch = true, kubectl = true, namespace = true,
  port = true, ready_timeout_ms = true, command_timeout_ms = true, wait = true, proc = true }

-- pods.new(opts) -> pool, or nil and err (this host's name cannot be
-- read). Misuse raises naming the option.
function M.new(opts)
  for k in pairs(opts) do
    if not OPTIONS[k] then
      error(("rlm.sandbox.pods: unknown option '%s'"):format(tostring(k)), 2)
    end
  end
  local t = opts.template
  if type(t) ~= "string" and type(t) ~= "table" then
    error("rlm.sandbox.pods: option 'template' must be a file's path or a pod as a table", 2)
  end
  local name = opts.name or "rlm"
  if type(name) ~= "string" or not name:match("^[a-z0-9][a-z0-9-]*$") or #name > 40 then
    error("rlm.sandbox.pods: option 'name' must be 1 to 40 of a-z, 0-9 and '-'", 2)
  end
  local prefix = opts.kubectl or { "kubectl" }
  if type(prefix) == "string" then
    prefix = { prefix }
  end
  if type(prefix) ~= "table" or type(prefix[1]) ~= "string" then
    error("rlm.sandbox.pods: option 'kubectl' must be a program or an argv list", 2)
  end
  for _, k in ipairs({ "size", "batch", "port", "ready_timeout_ms", "command_timeout_ms" }) do
    local v = opts[k]
    if v ~= nil and (type(v) ~= "number" or v < 1 or v % 1 ~= 0) then
      error(("rlm.sandbox.pods: option '%s' must be a positive integer"):format(k), 2)
    end
  end
  if opts.wait ~= nil and not util.is_callable(opts.wait) then
    error("rlm.sandbox.pods: option 'wait' must be callable", 2)
  end
  local owner = names.owner()
  if not owner then
    return unavailable("this host's boot id or its /proc/self/stat cannot be read: its pods could not be told apart")
  end
  local size = opts.size or 4
  local self = setmetatable({ name = name, template = t, size = size, batch_size = opts.batch or size,
    kubectl = kubectl.new(prefix, opts.namespace), port = opts.port or 7070,
    ready_timeout_ms = opts.ready_timeout_ms or 120000, command_timeout_ms = opts.command_timeout_ms or 60000,
    wait = opts.wait or kubectl.blocking_wait, proc = opts.proc,
    host = ("%s-%s-%s-%s"):format(owner.boot, owner.pid, owner.start, owner.token),
    machine = manifest.machine_key(owner),
    idle = {}, out = {}, deleting = {}, to_delete = {}, batches = 0,
    counts = { made = 0, claimed = 0, failed = 0, release_failed = 0 } }, Pods)
  -- The exec backend's callbacks, bound to this pool.
  self.sandbox = { backend = "exec", claim = function(info)
    return self:claim(info)
  end, release = function(handle)
    return self:release(handle)
  end }
  return self
end

return M
