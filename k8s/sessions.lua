-- k8s/sessions.lua ROOT RUN PODS: make k8s-e2e's sessions, run inside the
-- cluster's namespaces by k8s/inside once the pods rlm-sandbox-1..PODS are
-- Ready. The local backend (bubblewrap beside the host) and the exec
-- backend through `kubectl exec -i POD -c sandbox -- rlm-keeper` (the
-- kubeconfig from KUBECONFIG), in the same run: N sessions of each
-- (K8S_E2E_SESSIONS, default 10) opened one after another and held open at
-- once, the pods taken in turn; the claim (Session.new plus the first
-- step) of each timed; then K8S_E2E_STEPS (default 200) steps of each
-- session, in rounds over all of them; and the host's memory per session
-- while all are open: for the pods, the resident size of each session's
-- kubectl. Prints one table and ends every session.
local root, run, pods = arg[1], arg[2], tonumber(arg[3])
local common = require("bench.common")

local N = tonumber(os.getenv("K8S_E2E_SESSIONS") or "10")
local STEPS = tonumber(os.getenv("K8S_E2E_STEPS") or "200")

local env = common.env({ root = root, tmpdir = run .. "/sessions", scratch = run .. "/scratch" })
os.execute("mkdir -p " .. common.quote(env.tmpdir) .. " " .. common.quote(env.scratch))

local function say(fmt, ...)
  io.stdout:write("k8s-e2e: ", fmt:format(...), "\n")
  io.stdout:flush()
end

local function kubectl_rss_kb()
  local out = {}
  for _, p in ipairs(common.children(common.self_pid())) do
    if common.comm(p) == "kubectl" then
      out[#out + 1] = common.status_kb(p, "VmRSS")
    end
  end
  return out
end

local function measure(label, sandbox_of)
  local sessions, claims, steps = {}, {}, {}
  local ok, err = pcall(function()
    for i = 1, N do
      local s, ms = common.start(env, { sandbox = sandbox_of(i), max_iterations = STEPS + 2 })
      sessions[i], claims[i] = s, ms
    end
    for _ = 1, STEPS do
      for _, s in ipairs(sessions) do
        steps[#steps + 1] = common.step(s)
      end
    end
  end)
  local rss = kubectl_rss_kb()
  local first = sessions[1] and sessions[1].sandbox.driver
  local made = first and first.hello and first.hello.sandbox
  for _, s in ipairs(sessions) do
    common.close_settled(s, 10000)
  end
  if not ok then
    error(label .. ": " .. tostring(err), 0)
  end
  return { label = label, claims = claims, steps = steps, rss = rss, made = made }
end

local function pod_sandbox(i)
  local pod = ("rlm-sandbox-%d"):format((i - 1) % pods + 1)
  return { backend = "exec", argv = { "kubectl", "exec", "-i", pod, "-c", "sandbox", "--", "rlm-keeper" } }
end

local rows = {
  measure("local bubblewrap", function()
    return nil
  end),
  measure("warm pod, `kubectl exec -i`", pod_sandbox),
}

say("%d sessions of each open at once (on %d pods), %d steps of each", N, pods, STEPS)
print("| path | claim → first step p50 (p90) | step round trip p50 (p90) | host memory per session |")
print("|---|---|---|---|")
for _, r in ipairs(rows) do
  local mem = "—"
  if #r.rss > 0 then
    local total = 0
    for _, kb in ipairs(r.rss) do
      total = total + kb
    end
    mem = ("kubectl %.1f MB p50 (%d of them, %.0f MB in all)"):format(common.median(r.rss) / 1024, #r.rss,
      total / 1024)
  end
  print(("| %s (sandbox: %s) | %.1f ms (%.1f) | %.0f µs (%.0f) | %s |"):format(r.label, tostring(r.made or "local"),
    common.median(r.claims), common.quantile(r.claims, 0.9), common.median(r.steps) * 1000,
    common.quantile(r.steps, 0.9) * 1000, mem))
end
