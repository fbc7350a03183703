-- rlm.sandbox.pods, the warm pool of Kubernetes pods, without a cluster:
-- kubectl is spec/helpers/fake_kubectl.py over a directory of objects
-- (kubectl is not ours; make k8s-e2e runs the pool on a real cluster).
-- Pinned: the argv of each kubectl, the manifests (a Secret per pod, its
-- token mounted, the labels of pool, host and machine), a claim that
-- runs no process, a release that deletes pod and Secret and refills, a
-- sweep that removes only this pool's pods whose host is proven gone on
-- this machine, and the errors (kubectl missing, a create refused, a pod
-- never Ready) as sandbox_unavailable naming what failed.
local H = require("helpers")
local json = require("rlm.base.json")
local names = require("rlm.sandbox.container_names")
local pods = require("rlm.sandbox.pods")

local FAKE = os.getenv("PWD") .. "/spec/helpers/fake_kubectl.py"
local TEMPLATE = {
  apiVersion = "v1",
  kind = "Pod",
  metadata = { name = "rlm-sandbox-1", labels = { ["app.kubernetes.io/name"] = "rlm-sandbox" } },
  spec = {
    restartPolicy = "Never",
    containers = { { name = "sandbox", image = "localhost/rlm-sandbox:test",
      command = { "rlm-keeper", "--listen", "0.0.0.0:7070", "--token-file", "/var/run/rlm/token" },
      volumeMounts = { { name = "tmp", mountPath = "/tmp" } } } },
    volumes = { { name = "tmp", emptyDir = { medium = "Memory" } } },
  },
}

local dir

local function setenv(mode)
  -- The fake reads its directory and mode from the environment that
  -- core.helper passes on: the kubectl argv is `env ... fake`.
  return { "env", "FAKE_KUBECTL_DIR=" .. dir, "FAKE_KUBECTL_MODE=" .. (mode or "ok"), FAKE }
end

local function calls()
  local out = {}
  for line in (H.read_file(dir .. "/log") or ""):gmatch("[^\n]+") do
    local args = {}
    for a in (line .. "\t"):gmatch("([^\t]*)\t") do
      args[#args + 1] = a
    end
    out[#out + 1] = args
  end
  return out
end

-- The objects in the fake cluster: { ["pod/NAME"] = manifest, ... }.
local function objects()
  local out = {}
  for f in H.sh("ls " .. dir):gmatch("%S+") do
    local kind, name = f:match("^(%a+)%.(.+)%.json$")
    if kind then
      out[kind .. "/" .. name] = json.decode(H.read_file(dir .. "/" .. f))
    end
  end
  return out
end

local function count(t)
  local n = 0
  for _ in pairs(t) do
    n = n + 1
  end
  return n
end

local function new(o)
  o = o or {}
  o.template = o.template or TEMPLATE
  o.kubectl = o.kubectl or setenv(o.mode)
  o.name = o.name or "spec"
  o.mode = nil
  return assert(pods.new(o))
end

describe("rlm.sandbox.pods", function()
  before_each(function()
    dir = H.sh("mktemp -d /tmp/rlm-pods.XXXXXX"):gsub("%s+$", "")
  end)
  after_each(function()
    H.sh("rm -rf " .. dir)
  end)

  it("fills a batch with one create and one watch, a Secret of a token per pod", function()
    local pool = new({ size = 3 })
    assert.equal(3, pool:fill(3))
    local c = calls()
    assert.same({ "get", "create", "get" }, { c[1][1], c[2][1], c[3][1] })
    assert.equal(3, #c)
    assert.same({ "create", "-o", "name", "-f" }, { c[2][1], c[2][2], c[2][3], c[2][4] })
    assert.same({ "get", "pods", "-l", "rlm.sandbox/host=" .. pool.host .. ",rlm.sandbox/batch=1", "--watch", "-o",
      "jsonpath={.metadata.name} {.status.podIP} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}" },
      c[3])
    local objs = objects()
    assert.equal(6, count(objs))
    local tokens = {}
    for key, o in pairs(objs) do
      local kind, name = key:match("^(%a+)/(.+)$")
      local labels = o.metadata.labels
      assert.equal("spec", labels["rlm.sandbox/pool"])
      assert.equal(pool.host, labels["rlm.sandbox/host"])
      assert.equal(pool.machine, labels["rlm.sandbox/machine"])
      assert.truthy(name:match("^spec%-" .. pool.host:gsub("%-", "%%-") .. "%-%d+$"))
      if kind == "secret" then
        assert.truthy(o.stringData.token:match("^" .. ("%x"):rep(32) .. "$"))
        assert.is_nil(tokens[o.stringData.token])
        tokens[o.stringData.token] = true
        assert.truthy(objs["pod/" .. name])
      else
        assert.equal("rlm-sandbox", labels["app.kubernetes.io/name"])
        assert.same({ name = "rlm-token", secret = { secretName = name, defaultMode = 292 } }, o.spec.volumes[2])
        assert.same({ name = "rlm-token", mountPath = "/var/run/rlm", readOnly = true },
          o.spec.containers[1].volumeMounts[2])
        assert.same(TEMPLATE.spec.containers[1].command, o.spec.containers[1].command)
      end
    end
    assert.equal(3, pool:stats().idle)
    assert.truthy(pool:close())
    assert.same({}, objects())
  end)

  -- A host on a loop gives the pool a wait that yields (docs/backends.md,
  -- "Waiting"): here luv's, which resumes the pool's coroutine when a
  -- kubectl's loop has something (its descriptor readable) or its timer is
  -- due. A timer of the loop ticks meanwhile: it must have ticked while
  -- the pods were made (with the default wait, which blocks the thread,
  -- it would not).
  it("fills, claims and releases under a luv loop that goes on running while kubectl works", function()
    local L = require("helpers.luv")
    if not L then
      return pending("luv is not installed")
    end
    local uv = L.uv
    local function wait(helper)
      while true do
        local kind, a, b, c = helper:poll(0)
        if kind then
          return kind, a, b, c
        end
        local co, woken = coroutine.running(), false
        local p, t = assert(uv.new_poll(helper:fd())), assert(uv.new_timer())
        local function wake()
          if not woken then
            woken = true
            p:stop()
            p:close()
            t:close()
            assert(coroutine.resume(co))
          end
        end
        p:start("r", wake)
        local ms = helper:timeout()
        t:start(ms >= 0 and ms or 1000, 0, wake)
        coroutine.yield()
      end
    end
    local pool = new({ size = 2, wait = wait })
    local ticks, out = 0, {}
    local ticker = assert(uv.new_timer())
    ticker:start(5, 5, function()
      ticks = ticks + 1
    end)
    local co = coroutine.create(function()
      out.filled = pool:fill(2)
      out.ticks = ticks
      out.claim, out.name = pool:claim()
      pool:release(out.name)
      out.closed = pool:close()
      out.done = true
    end)
    assert(coroutine.resume(co))
    L.run_until(function()
      return out.done
    end, 60000)
    ticker:stop()
    ticker:close()
    uv.run("nowait")
    assert.equal(2, out.filled)
    assert.is_true(out.ticks > 0, "the loop's timer never ticked while the pods were made")
    assert.truthy(out.claim and out.claim.host and out.claim.token)
    assert.truthy(out.closed)
    assert.same({}, objects())
  end)

  it("claims a Ready pod's address and token without a process, and releases it with a delete", function()
    local pool = new({ size = 2 })
    assert.equal(2, pool:fill(2))
    local before = #calls()
    local connect, handle = pool:claim({ depth = 0 })
    assert.equal(before, #calls()) -- no kubectl for a warm claim
    assert.equal(7070, connect.port)
    assert.truthy(connect.host:match("^10%.9%.0%.%d$"))
    assert.equal(objects()["secret/" .. handle].stringData.token, connect.token)
    assert.truthy(pool:release(handle))
    -- the delete and the refill run in the background: stats() moves them on
    local t0 = os.time()
    while (pool:stats().idle < 2 or pool:stats().deleting > 0) and os.time() - t0 < 60 do
      H.sh("sleep 0.05")
    end
    assert.equal(2, pool:stats().idle)
    -- one delete of the pod and its Secret, one refill (create, watch)
    local after, delete = {}, nil
    for i, c in ipairs(calls()) do
      if i > before then
        after[#after + 1] = c[1] == "get" and "watch" or c[1]
        delete = c[1] == "delete" and c or delete
      end
    end
    table.sort(after)
    assert.same({ "create", "delete", "watch" }, after)
    assert.same({ "delete", "--wait=false", "--ignore-not-found", "pod/" .. handle, "secret/" .. handle }, delete)
    assert.is_nil(objects()["pod/" .. handle])
    assert.is_nil(objects()["secret/" .. handle])
    assert.truthy(pool:close())
    assert.same({}, objects())
  end)

  it("deletes the pods of many releases with one kubectl at a time", function()
    local pool = new({ size = 3 })
    assert.equal(3, pool:fill(3))
    local handles = {}
    for i = 1, 3 do
      local _, handle = pool:claim({ depth = 0 })
      handles[i] = handle
    end
    pool:resize(0) -- no refill
    local before = #calls()
    for _, handle in ipairs(handles) do
      assert.truthy(pool:release(handle))
    end
    local t0 = os.time()
    while pool:stats().deleting > 0 and os.time() - t0 < 60 do
      H.sh("sleep 0.05")
    end
    local deletes = {}
    for i, c in ipairs(calls()) do
      if i > before then
        deletes[#deletes + 1] = table.concat(c, " ")
      end
    end
    -- the first release's delete runs; the next two wait for it, then go as one
    assert.same({ "delete --wait=false --ignore-not-found pod/" .. handles[1] .. " secret/" .. handles[1],
      ("delete --wait=false --ignore-not-found pod/%s secret/%s pod/%s secret/%s"):format(handles[2], handles[2],
        handles[3], handles[3]) }, deletes)
    assert.same({}, objects())
    assert.truthy(pool:close())
  end)

  it("hands the exec backend a claim and a release", function()
    local pool = new({ size = 1 })
    assert.equal("exec", pool.sandbox.backend)
    local connect, handle = pool.sandbox.claim({ depth = 0 })
    assert.truthy(connect.token and handle)
    assert.truthy(pool.sandbox.release(handle))
    pool:resize(0)
    assert.truthy(pool:close())
    assert.same({}, objects())
  end)

  -- rows: the name's host, its machine label, whether the sweep removes it
  -- (this process is the live host: names.owner() is its boot, pid, start)
  local o = assert(names.owner())
  local cases = {
    { "a host of this machine whose pid runs with another start time", o.boot, o.pid, "1", "ours", true },
    { "a host of this machine's earlier boot", "0badb00f", o.pid, o.start, "ours", true },
    { "a live host of this machine (this process)", o.boot, o.pid, o.start, "ours", false },
    { "another machine's host (whatever its pid shows here)", "0badb00f", o.pid, "1", "mffffffffffffffff", false },
  }
  for _, case in ipairs(cases) do
    it((case[6] and "sweeps the pod and Secret of " or "keeps the pod and Secret of ") .. case[1], function()
      local pool = new()
      local name = ("spec-%s-%s-%s-abcdef-1"):format(case[2], case[3], case[4])
      local machine = case[5] == "ours" and pool.machine or case[5]
      for _, kind in ipairs({ "Pod", "Secret" }) do
        local f = assert(io.open(("%s/%s.%s.json"):format(dir, kind:lower(), name), "w"))
        f:write(json.encode({ kind = kind, metadata = { name = name, labels = {
          ["rlm.sandbox/pool"] = "spec", ["rlm.sandbox/machine"] = machine } } }))
        f:close()
      end
      -- another pool's, of a dead host of this machine: never listed
      local other = ("other-%s-%s-1-abcdef-1"):format(o.boot, o.pid)
      local f = assert(io.open(("%s/pod.%s.json"):format(dir, other), "w"))
      f:write(json.encode({ kind = "Pod", metadata = { name = other, labels = {
        ["rlm.sandbox/pool"] = "other", ["rlm.sandbox/machine"] = pool.machine } } }))
      f:close()
      local gone = assert(pool:sweep())
      assert.same(case[6] and { name } or {}, gone)
      local objs = objects()
      assert.equal(not case[6], objs["pod/" .. name] ~= nil)
      assert.equal(not case[6], objs["secret/" .. name] ~= nil)
      assert.truthy(objs["pod/" .. other])
    end)
  end

  -- rows: what fails, the mode or kubectl, what the error says
  local failures = {
    { "kubectl missing", {}, "no%-kubectl was not found %(option .kubectl.%)" },
    { "a create refused", { mode = "create-fails" }, "creating 2 pods of pool spec: .*admission webhook" },
    { "a pod never Ready", { mode = "never-ready", ready_timeout_ms = 10000 },
      "pod spec%-[%x%-]+%-%d+ %(and 1 more of 2%) not Ready with an address: .*did not see them within 10000 ms" },
  }
  for _, case in ipairs(failures) do
    it("fails with sandbox_unavailable when " .. case[1] .. ", leaving no object", function()
      local o2 = { size = 2 }
      for k, v in pairs(case[2]) do
        o2[k] = v
      end
      if case[1] == "kubectl missing" then
        o2.kubectl = { dir .. "/no-kubectl" }
      end
      local pool = new(o2)
      local ok, err = pool:fill(2)
      assert.is_nil(ok)
      assert.equal("sandbox_unavailable", err.kind)
      assert.truthy(err.message:match(case[3]), err.message)
      local connect, why = pool:claim({ depth = 0 })
      assert.is_nil(connect)
      assert.truthy(why:match(case[3]), why)
      pool:close()
      assert.same({}, objects())
    end)
  end

  it("raises on misuse, naming the option", function()
    assert.has_error(function()
      pods.new({ template = TEMPLATE, sise = 2 })
    end, "rlm.sandbox.pods: unknown option 'sise'")
    assert.has_error(function()
      pods.new({ template = TEMPLATE, name = "Bad_Name" })
    end, "rlm.sandbox.pods: option 'name' must be 1 to 40 of a-z, 0-9 and '-'")
    assert.has_error(function()
      pods.new({ template = TEMPLATE, size = 0 })
    end, "rlm.sandbox.pods: option 'size' must be a positive integer")
    assert.has_error(function()
      pods.new({})
    end, "rlm.sandbox.pods: option 'template' must be a file's path or a pod as a table")
  end)
end)
