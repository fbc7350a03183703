-- k8s/sessions.lua ROOT RUN PODS TEMPLATE: make k8s-e2e's sessions, run
-- inside the cluster's namespaces by k8s/inside, the pods made here by
-- rlm.sandbox.pods from TEMPLATE (docs/backends.md's, as k8s/pod-template
-- adapts it). Three paths in one run, each with all its sessions open at
-- once, the claim (Session.new plus the first step) of each timed, then
-- K8S_E2E_STEPS (default 200) steps of each session in rounds (one step
-- of each in turn), then K8S_E2E_ALONE_STEPS (default 1000) of the first
-- session alone, the others open and idle, and as many again once the
-- others are closed, with where the node's CPU went meanwhile
-- (node_sample):
--   local bubblewrap          K8S_E2E_SESSIONS (default 10) sessions
--   warm pod, kubectl exec -i K8S_E2E_SESSIONS sessions over PODS pods of a
--                             pool, `kubectl exec -i POD -c sandbox --
--                             rlm-keeper` each (the kubeconfig in KUBECONFIG)
--   warm pool, direct stream  K8S_E2E_POOL_SESSIONS (default 100) sessions,
--                             each on a pod of its own claimed from a warm
--                             pool: a TCP stream to its keeper, no process
-- and the host's memory for each path's streams (this process's resident
-- size with all open less before, and the kubectl processes it holds).
-- Then a pool session whose pod is deleted (--grace-period=0 --force)
-- mid-step: the time to its sandbox_lost. Prints one table; every session
-- ends, every pool is closed.
local root, run, pods_n, template = arg[1], arg[2], tonumber(arg[3]), arg[4]
local common = require("bench.common")
local core = require("rlm.core")
local pods = require("rlm.sandbox.pods")

local N = tonumber(os.getenv("K8S_E2E_SESSIONS") or "10")
local P = tonumber(os.getenv("K8S_E2E_POOL_SESSIONS") or "100")
local STEPS = tonumber(os.getenv("K8S_E2E_STEPS") or "200")
local ALONE = tonumber(os.getenv("K8S_E2E_ALONE_STEPS") or "1000")
-- A far side that answers no ping within this is lost: the default, 10
-- s. A keeper killed with its pod closes its socket, which ends the
-- session at once whatever this is; 1000 ms (found within 1.5 s a pod
-- whose network goes without a FIN or RST) lost a live session here at a
-- load of 60 to 100 ("the far side answered no ping for 1000 ms").
local PING_TIMEOUT_MS = 10000

local env = common.env({ root = root, tmpdir = run .. "/sessions", scratch = run .. "/scratch" })
os.execute("mkdir -p " .. common.quote(env.tmpdir) .. " " .. common.quote(env.scratch))

local function say(fmt, ...)
  io.stdout:write("k8s-e2e: ", fmt:format(...), "\n")
  io.stdout:flush()
end

local function kubectls()
  local out = {}
  for _, p in ipairs(common.children(common.self_pid())) do
    if common.comm(p) == "kubectl" then
      out[#out + 1] = common.status_kb(p, "VmRSS")
    end
  end
  return out
end

local function rss_kb()
  collectgarbage()
  collectgarbage()
  return common.status_kb(common.self_pid(), "VmRSS")
end

local function uptime()
  return tonumber(common.read_file("/proc/uptime"):match("^(%S+)"))
end

-- Where the node's CPU goes while the steps run: the daemons' (their
-- /proc/PID/stat, by name; comm is cut at 15 bytes), the pods' cgroups
-- (cpuacct) and their CFS quota's throttling (cpu.stat, summed over the
-- kubelet's tree), this process's, and the load average.
local TICK_MS = 1000 / (tonumber(common.capture({ "getconf", "CLK_TCK" }):match("%d+")) or 100)
local DAEMONS = { kubelet = "kubelet", ["kube-apiserver"] = "apiserver", etcd = "etcd",
  containerd = "containerd", ["containerd-shim"] = "shims" }
local CG = "/sys/fs/cgroup/%s/rlm-k8s-e2e/kubepods"

local function node_sample()
  local at = { ms = common.now_ms(), cpu = { host = 0 }, periods = 0, throttled = 0, throttled_ms = 0 }
  for pid in common.capture({ "ls", "/proc" }):gmatch("%d+") do
    local name = DAEMONS[common.comm(pid)]
    if name == "shims" then
      at.shims_n = (at.shims_n or 0) + 1
    end
    local stat = (name or pid == tostring(common.self_pid())) and common.read_file("/proc/" .. pid .. "/stat")
    -- utime and stime: the 14th and 15th fields, the 12th and 13th after comm's ")"
    local u, sy = (stat or ""):match("%) %S+" .. (" %S+"):rep(10) .. " (%d+) (%d+)")
    if u then
      name = name or "host"
      at.cpu[name] = (at.cpu[name] or 0) + (tonumber(u) + tonumber(sy)) * TICK_MS
    end
  end
  at.pods_ms = (tonumber(common.read_file(CG:format("cpuacct") .. "/cpuacct.usage")) or 0) / 1e6
  local stats = common.capture({ "find", CG:format("cpu"), "-mindepth", "3", "-maxdepth", "3", "-name", "cpu.stat",
    "-exec", "cat", "{}", "+" })
  for k, v in stats:gmatch("(%S+) (%d+)") do
    if k == "nr_periods" then
      at.periods = at.periods + tonumber(v)
    elseif k == "nr_throttled" then
      at.throttled = at.throttled + tonumber(v)
    elseif k == "throttled_time" then
      at.throttled_ms = at.throttled_ms + tonumber(v) / 1e6
    end
  end
  at.load = common.read_file("/proc/loadavg"):match("^(%S+)")
  return at
end

-- What the node did between two samples, as a sentence.
local function node_between(a, b)
  local secs = (b.ms - a.ms) / 1000
  local parts = {}
  for _, name in ipairs({ "host", "kubelet", "apiserver", "etcd", "containerd", "shims" }) do
    parts[#parts + 1] = ("%s %.0f%%"):format(name, ((b.cpu[name] or 0) - (a.cpu[name] or 0)) / 10 / secs)
  end
  parts[#parts + 1] = ("the pods' cgroups %.0f%%"):format((b.pods_ms - a.pods_ms) / 10 / secs)
  return ("%.1f s; CPU (%% of one): %s; pods' CFS periods %d, throttled %d (%.0f ms); load %s"):format(secs,
    table.concat(parts, ", "), b.periods - a.periods, b.throttled - a.throttled, b.throttled_ms - a.throttled_ms,
    b.load)
end

-- Waits (up to 180 s) until the node is quiet again once sessions closed:
-- their pods' deletes and teardowns over (no pod's shim gone within the
-- last second, the daemons and the pods' cgroups under a tenth of one CPU
-- over it; a shim that exits takes its CPU time with it). Returns the
-- seconds.
local function settle()
  local t0, a = common.now_ms(), node_sample()
  while common.now_ms() - t0 < 180000 do
    common.sleep(1000)
    local b = node_sample()
    local busy = b.pods_ms - a.pods_ms
    for _, name in ipairs({ "kubelet", "apiserver", "etcd", "containerd" }) do
      busy = busy + (b.cpu[name] or 0) - (a.cpu[name] or 0)
    end
    if b.shims_n == a.shims_n and busy / (b.ms - a.ms) < 0.1 then
      break
    end
    a = b
  end
  return (common.now_ms() - t0) / 1000
end

-- The steps, taken three ways: in rounds over the open sessions (one step
-- of each in turn: every step on another session than the last, the
-- others' heartbeats between), then ALONE steps of the first session alone,
-- the others open and idle, and ALONE more once the others are closed
-- (what the path costs on a node that runs nothing else of ours), the node
-- quiet again first.
local function measure(label, n, sandbox_of, before_close)
  local sessions, claims, steps, alone, lone = {}, {}, {}, {}, {}
  local rss0 = rss_kb()
  local node = {}
  local ok, err = pcall(function()
    for i = 1, n do
      local s, ms = common.start(env, { sandbox = sandbox_of(i), max_iterations = STEPS + 2 * ALONE + 2 })
      sessions[i], claims[i] = s, ms
    end
    local a = node_sample()
    for _ = 1, STEPS do
      for _, s in ipairs(sessions) do
        steps[#steps + 1] = common.step(s)
      end
    end
    local b = node_sample()
    for _ = 1, ALONE do
      alone[#alone + 1] = common.step(sessions[1])
    end
    local c = node_sample()
    node.rounds, node.alone = node_between(a, b), node_between(b, c)
  end)
  local rss = rss_kb() - rss0
  local held = kubectls()
  local first = sessions[1] and sessions[1].sandbox.driver
  local made = first and first.hello and first.hello.sandbox
  if before_close then
    before_close()
  end
  for i = 2, #sessions do
    common.close_settled(sessions[i], 10000)
  end
  if ok and sessions[1] then
    ok, err = pcall(function()
      node.settled = settle()
      local c = node_sample()
      for _ = 1, ALONE do
        lone[#lone + 1] = common.step(sessions[1])
      end
      node.lone = node_between(c, node_sample())
    end)
  end
  if sessions[1] then
    common.close_settled(sessions[1], 10000)
  end
  if not ok then
    error(label .. ": " .. tostring(err), 0)
  end
  say("%s: %d sessions open at once, %d steps in rounds, %d of one alone, %d of it the only one left", label, n,
    #steps, #alone, #lone)
  say("%s, the node in the rounds: %s", label, node.rounds)
  say("%s, the node in the steps alone: %s", label, node.alone)
  say("%s, the node in the steps of the only one left (quiet %.1f s after the others closed): %s", label,
    node.settled or 0, node.lone)
  return { label = label, claims = claims, steps = steps, alone = alone, lone = lone, rss = rss, held = held,
    made = made, n = n }
end

local function pool_of(name, size)
  local pool = assert(pods.new({ template = template, name = name, size = size, ready_timeout_ms = 900000,
    command_timeout_ms = 900000 }))
  local t0 = common.now_ms()
  local made, err = pool:fill(size)
  if not made then
    error(name .. ": " .. tostring(err), 0)
  end
  say("pool %s: %d pods Ready in %.1f s (one create, one watch)", name, made, (common.now_ms() - t0) / 1000)
  return pool
end

-- A pod deleted mid-step, while the pool's other sessions are open (the
-- node steady): the session of the pool's spare pod runs a step that
-- sleeps 30 s, and its pod is deleted 1 s into it; the time from the
-- delete to the step's end, and how it ended.
local function delete_mid_step(pool, rows, problems)
  local claimed
  local spare = { backend = "exec", ping_timeout_ms = PING_TIMEOUT_MS, claim = function(info)
    local c, name = pool:claim(info)
    claimed = name
    return c, name
  end, release = pool.sandbox.release }
  local s = common.start(env, { sandbox = spare, answers = { common.TRIVIAL,
    "```repl\nimport time\ntime.sleep(30)\n```" } })
  pool:resize(0)
  local kubectl = assert(core.find_program("kubectl"))
  local helper = assert(core.helper({ "/bin/sh", "-c", 'sleep 1; cat /proc/uptime; exec "$0" delete pod "$1" '
    .. "--grace-period=0 --force >/dev/null 2>&1", kubectl, claimed }, 60000, 65536))
  local t0 = common.now_ms()
  local entry, serr = s:step()
  local t_end, step_ms = uptime(), common.now_ms() - t0
  local t_delete
  while true do
    local kind, a = helper:poll(100)
    if kind == "line" then
      t_delete = t_delete or tonumber(a:match("^(%S+)"))
    elseif kind ~= nil then
      break
    end
  end
  helper:close()
  local kind = entry and (entry.error and "the step's code raised" or "the step returned")
    or (type(serr) == "table" and serr.kind or tostring(serr))
  local lost_s = t_delete and t_end - t_delete
  rows.deleted = { kind = kind, lost_s = lost_s, step_ms = step_ms, pod = claimed,
    message = type(serr) == "table" and serr.message or nil }
  common.close_settled(s, 10000)
  if kind ~= "sandbox_lost" or not lost_s or lost_s > 2 then
    problems[#problems + 1] = "the deleted pod's session"
  end
end

local rows = {}
local problems = {}
local pools = {}
local ok, err = pcall(function()
  rows[#rows + 1] = measure("local bubblewrap", N, function()
    return nil
  end)

  -- The kubectl exec path: pods of the same template, claimed (their
  -- listening keepers never reached), each a kubectl exec -i into it.
  pools.exec = pool_of("rlm-exec", pods_n)
  local names = {}
  for i = 1, pods_n do
    local _, name = assert(pools.exec:claim())
    names[i] = name
  end
  rows[#rows + 1] = measure("warm pod, `kubectl exec -i`", N, function(i)
    local pod = names[(i - 1) % pods_n + 1]
    return { backend = "exec", argv = { "kubectl", "exec", "-i", pod, "-c", "sandbox", "--", "rlm-keeper" } }
  end)
  pools.exec:resize(0)
  for _, name in ipairs(names) do
    pools.exec:release(name)
  end
  while pools.exec:stats().deleting > 0 do -- the deletes reaped before the next path counts kubectls
    common.sleep(50)
  end

  -- The native path: a pod per session from a warm pool, and one spare
  -- for the pod deleted mid-step.
  pools.native = pool_of("rlm-e2e", P + 1)
  local sandbox = { backend = "exec", ping_timeout_ms = PING_TIMEOUT_MS, claim = pools.native.sandbox.claim,
    release = pools.native.sandbox.release }
  rows[#rows + 1] = measure("warm pool, direct stream to the keeper", P, function()
    return sandbox
  end, function()
    pools.native:resize(1) -- the spare stays; the releases below refill nothing
    delete_mid_step(pools.native, rows, problems)
  end)

end)
for _, name in ipairs({ "exec", "native" }) do
  if pools[name] then
    local cok, cerr = pools[name]:close()
    local st = pools[name]:stats()
    say("pool %s closed: %s; %d made, %d claimed, %d failed, %d deletes failed%s", pools[name].name,
      cok and "ok" or tostring(cerr), st.made, st.claimed, st.failed, st.release_failed,
      st.last_error and (" (last: " .. st.last_error .. ")") or "")
  end
end
if not ok then
  error(err, 0)
end

local function mb(kb)
  return kb / 1024
end

say("%d sessions of the local and the kubectl exec path (on %d pods), %d of the pool's, %d steps of each in"
  .. " rounds, %d alone and %d the only one left", N, pods_n, P, STEPS, ALONE, ALONE)
print("| path (sandbox in the pod) | sessions open at once | claim → first step p50 (p90) | step round trip p50 (p90),"
  .. " in rounds over all open | step round trip p50 (p90), one session alone, the others open and idle"
  .. " | the same, the others closed | host memory for all their streams |")
print("|---|---|---|---|---|---|---|")
for _, r in ipairs(rows) do
  local mem = ("host RSS +%.1f MB"):format(mb(r.rss))
  if #r.held > 0 then
    local total = 0
    for _, kb in ipairs(r.held) do
      total = total + kb
    end
    mem = mem .. ("; %d kubectl held, %.1f MB p50, %.0f MB in all"):format(#r.held, mb(common.median(r.held)),
      mb(total))
  else
    mem = mem .. "; 0 kubectl held"
  end
  print(("| %s (%s) | %d | %.1f ms (%.1f) | %.0f µs (%.0f) | %.0f µs (%.0f) | %.0f µs (%.0f) | %s |"):format(r.label,
    tostring(r.made or "local"), r.n, common.median(r.claims), common.quantile(r.claims, 0.9),
    common.median(r.steps) * 1000, common.quantile(r.steps, 0.9) * 1000, common.median(r.alone) * 1000,
    common.quantile(r.alone, 0.9) * 1000, common.median(r.lone) * 1000, common.quantile(r.lone, 0.9) * 1000, mem))
end
local d = rows.deleted
say("pod %s deleted (--grace-period=0 --force) mid-step: the step ended with %s %s after the delete began"
  .. " (%.2f s after the step began)%s", tostring(d.pod), d.kind, d.lost_s and ("%.2f s"):format(d.lost_s)
  or "(no time)", d.step_ms / 1000, d.message and (": " .. d.message) or "")
if problems[1] then
  say("FAILED: %s", table.concat(problems, ", "))
  os.exit(1)
end
