-- The container backends (docs/backends.md): sandbox = { backend =
-- "podman" | "docker", image = ... }, the engine's command line built by
-- rlm.sandbox.container and run through the exec backend's stream; pools
-- over containers; claim/release with a stand-in that makes a container of
-- its own. Real containers of the image `make image` builds, in a Podman
-- store of this spec's own (spec/helpers/podman.lua), removed at the end.
--
-- Where Podman or the image's tarball is missing, the cases that need them
-- are pending with the reason; under CI (CI=true) that is a failure.
local rlm = require("rlm")
local core = require("rlm.core")
local cjson = require("cjson")
local H = require("helpers")
local P = require("helpers.podman")
local container = require("rlm.sandbox.container")
local util = require("rlm.base.util")

local CI = os.getenv("CI") == "true"
local VERSION = rlm._VERSION:match("^rlm (%S+)$")
local TAR = os.getenv("RLM_SPEC_IMAGE_TAR") or ("build/rlm-sandbox-" .. VERSION .. ".tar")
local IMAGE = "localhost/rlm-sandbox:" .. VERSION
-- The prefix of this spec's container names; the store is the spec's own.
local NAME = "rlm-spec"

local store, why

-- The podman backend on the spec's store, with what this host needs
-- (docs/backends.md, "What this machine needs"); extra overrides.
local function podman(extra)
  local sb = { backend = "podman", global_args = store.global, runtime = store.runtime, ulimits = P.ULIMITS,
    name = NAME }
  for k, v in pairs(extra or {}) do
    sb[k] = v
  end
  return sb
end

local function opts(o)
  o = o or {}
  o.sandbox = o.sandbox or podman()
  return H.opts(o)
end

-- The pids whose command line mentions text (the store's directory is in
-- every command line of ours: the clients, their removers, conmon), this
-- process's shell excepted.
local function processes_with(text)
  local out = {}
  local p = assert(io.popen("ls /proc"))
  local listing = p:read("*a")
  p:close()
  for pid in listing:gmatch("%d+") do
    local f = io.open("/proc/" .. pid .. "/cmdline", "rb")
    local cmdline = f and f:read("*a") or ""
    if f then
      f:close()
    end
    if cmdline:find(text, 1, true) and not cmdline:find("/proc", 1, true) then
      out[#out + 1] = tonumber(pid)
    end
  end
  return out
end

-- Waits up to 20 s for the store to hold no container and no process of
-- ours to run: a container goes when its keeper ends and the client's
-- --rm (or the remover) has removed it, moments after close().
local function settled_empty()
  local t0 = core.now_ms()
  local names, procs
  repeat
    names, procs = store:containers(), processes_with(store.dir .. "/root")
    if names[1] == nil and procs[1] == nil then
      break
    end
    H.sh("sleep 0.1")
  until core.now_ms() - t0 > 20000
  return names, procs
end

local function it_podman(name, fn)
  it(name, function()
    if not store then
      return pending(why)
    end
    fn()
  end)
end

-- A container the spec runs itself on the store, detached: its name.
local function detached(name, command)
  local out = store:run(util.append({ "run", "-d", "--rm", "--name", name }, P.ulimit_flags(),
    { "--network=none", "--read-only", "--cap-drop=ALL", "--security-opt", "no-new-privileges" },
    P.bwrap_flags(container.default_profile()), { IMAGE }, command))
  assert.matches("^%x+$", out)
  return name
end

describe("the podman backend", function()
  setup(function()
    store, why = P.store(TAR, IMAGE)
    if not store and CI then
      error(why)
    end
    if store and store.rootless then
      -- Rootless on cgroup v1, Podman drops --memory and --pids-limit with
      -- a word (docs/backends.md).
      local out = H.sh(store:cmd({ "run", "--rm", "--memory", "64m", "--ulimit", "nofile=1024:1024", IMAGE,
        "true" }) .. " </dev/null 2>&1")
      store.limits_ignored = out:find("Resource limits are not supported and ignored", 1, true) ~= nil
    end
  end)

  teardown(function()
    if store then
      store:teardown()
    end
  end)

  after_each(function()
    if store then
      local names, procs = settled_empty()
      if names[1] then
        -- This case's failure only: the next case starts clean.
        store:run(util.append({ "rm", "-f", "-t", "0" }, names))
      end
      assert.are.same({}, names)
      assert.are.same({}, procs)
    end
    H.assert_clean()
  end)

  it("defaults to the image make image builds", function()
    assert.equals(IMAGE, container.IMAGE)
  end)

  -- The profile the backend gives by default ships with rlm (beside the
  -- modules once installed), made by sandbox/image/seccomp.py from
  -- Podman's own, as make image makes build/rlm-seccomp.json.
  it("ships the seccomp profile sandbox/image/seccomp.py makes of Podman's", function()
    local version = H.sh("dpkg-query -W -f='${Version}' golang-github-containers-common 2>/dev/null")
    if version ~= "0.50.1+ds1-4" then
      return pending("sandbox/rlm-seccomp.json was made from containers-common 0.50.1+ds1-4's profile, this host "
        .. "has " .. (version ~= "" and version or "none"))
    end
    local out = H.tmpdir .. "-seccomp.json"
    assert.equals("", H.sh("env -u LD_PRELOAD python3 sandbox/image/seccomp.py /usr/share/containers/seccomp.json "
      .. out .. " 2>&1"))
    local made = H.read_file(out)
    os.remove(out)
    assert.equals(made, H.read_file("sandbox/rlm-seccomp.json"))
    assert.equals(os.getenv("PWD") .. "/lua/rlm/../../sandbox/rlm-seccomp.json", container.default_profile())
  end)

  it_podman("survives a step timeout with its variables", function()
    local result, err = H.run(opts({
      step_timeout_ms = 500,
      root_llm = H.script({ H.fence("kept = 42"), H.fence("import time\nwhile True: time.sleep(0.01)"),
        H.fence("FINAL(str(kept))") }),
    }))
    assert.is_nil(err)
    assert.equals("42", result.answer)
    assert.matches("KeyboardInterrupt", result.history[2].error)
  end)

  -- (After a first session: libuv's process-wide signal pipe is made by
  -- the first loop of the process, and stays.)
  it_podman("answers over a 5 MB context with an llm_query, and leaves no container or process behind", function()
    local result, err
    H.assert_no_leaks(function()
      result, err = H.run(opts({
        context = ("0123456789abcde\n"):rep(5 * 2 ^ 16),
        root_llm = H.script({ H.fence("n = len(context)\nprint(llm_query('size ' + str(n)))"),
          H.fence("FINAL(str(n))") }),
      }))
    end)
    assert.is_nil(err)
    assert.equals("5242880", result.answer)
    assert.equals("echo: size 5242880\n", result.history[1].stdout)
    assert.equals(1, result.sub_calls)
    assert.same({ "podman", "bubblewrap" }, { result.sandbox.backend, result.sandbox.mode })
    assert.matches("^rlm%-spec%-%x+%-%d+%-%d+%-%x+%-%d+$", result.sandbox.container)
  end)

  it_podman("ends with memory_limit when the REPL allocates past max_rss_bytes", function()
    local _, err = H.run(opts({
      max_rss_bytes = 200 * 2 ^ 20,
      root_llm = H.script({ H.fence("x = bytearray(800 * 2**20)\nprint(len(x))") }),
    }))
    assert.equals("memory_limit", err.kind)
    assert.equals(200 * 2 ^ 20, err.limit)
  end)

  -- What the engine was asked for, as it reports the running container.
  it_podman("starts the container with the boundary's flags", function()
    local host
    local s
    s = rlm.Session.new(opts({
      max_rss_bytes = 256 * 2 ^ 20,
      sandbox = podman({ pids_limit = 100, extra_args = { "--label", "rlm.spec=flags" } }),
      root_llm = H.script({ H.fence("print(llm_query('x'))"), H.fence("FINAL('ok')") }),
      llm_query = function()
        host = cjson.decode(store:run({ "inspect", s.sandbox.driver.container }))[1]
        return "ok"
      end,
    }))
    local result, err = s:run()
    s:close()
    assert.is_nil(err, err and err.message)
    assert.equals("ok", result.answer)
    local hc = host.HostConfig
    local memory = 256 * 2 ^ 20 + 64 * 2 ^ 20 -- max_rss_bytes and the keeper's headroom
    if store.limits_ignored then
      memory = 0
    end
    assert.same({ memory, memory, store.limits_ignored and 0 or 100 }, { hc.Memory, hc.MemorySwap, hc.PidsLimit })
    assert.same({ "none", true, true, "passthrough" }, { hc.NetworkMode, hc.ReadonlyRootfs, hc.AutoRemove,
      hc.LogConfig.Type })
    assert.same({ "no-new-privileges", "seccomp=" .. container.default_profile() }, hc.SecurityOpt)
    assert.is_true(#hc.CapDrop >= 14) -- every capability Podman grants by default
    assert.equals("flags", host.Config.Labels["rlm.spec"])
    assert.equals(IMAGE, host.ImageName)
    assert.same({ "/usr/local/bin/rlm-keeper" }, host.Config.Cmd)
  end)

  -- A keeper that stops answering (SIGSTOP) keeps its container running
  -- after the client's stdin ends: the remover removes it by its name once
  -- the host's teardown has killed the client.
  it_podman("removes a stuck container: sandbox_lost at ping_timeout_ms, then nothing left", function()
    local s
    s = rlm.Session.new(opts({
      step_timeout_ms = 120000,
      sandbox = podman({ ping_timeout_ms = 1000 }),
      root_llm = H.script({ H.fence("print(llm_query('now'))\nimport time\ntime.sleep(60)") }),
      llm_query = function()
        local pid = store:run({ "inspect", "--format", "{{.State.Pid}}", s.sandbox.driver.container })
        os.execute("kill -STOP " .. assert(tonumber(pid), pid))
        return "ok"
      end,
    }))
    local _, err = s:run()
    s:close()
    assert.equals("sandbox_lost", err.kind)
    assert.matches("answered no ping for 1000 ms", err.message, 1, true)
  end)

  -- A host killed (SIGKILL) while its keeper is stuck leaves its container:
  -- the next host's first start with the same prefix removes it, and no
  -- container of a host that still runs, nor one not named by rlm.
  it_podman("removes, at a Lua state's first start, the containers of its prefix whose host is gone", function()
    local prefix = NAME .. "-dead"
    local script = H.tmpdir .. "-dying.lua"
    local f = assert(io.open(script, "w"))
    f:write(([[
local rlm = require("rlm")
local s
s = rlm.Session.new({ context = "x", step_timeout_ms = 120000,
  sandbox = { tmpdir = %q, backend = "podman", global_args = { %s }, runtime = %s, ulimits = { nofile = 1024, nproc = 1024 },
    name = %q },
  root_llm = function() return "```repl\nprint(llm_query('now'))\nimport time\ntime.sleep(60)\n```" end,
  llm_query = function()
    io.stdout:write(s.sandbox.driver.container, "\n")
    io.stdout:flush()
    os.execute("kill -STOP $(%s inspect --format '{{.State.Pid}}' " .. s.sandbox.driver.container .. ")")
    os.execute("kill -9 " .. io.open("/proc/self/stat"):read("*a"):match("^%%d+"))
  end })
s:run()
]]):format(H.tmpdir, "'" .. table.concat(store.global, "', '") .. "'", store.runtime and ("%q"):format(store.runtime)
      or "nil", prefix, "cd " .. store.dir .. " && " .. store.podman .. " " .. table.concat(store.all, " ")))
    f:close()
    local dead = H.sh(("cd %s && %s %s 2>/dev/null"):format(os.getenv("PWD"), H.lua_name(), script))
    os.remove(script)
    assert.matches("^" .. prefix:gsub("%-", "%%-") .. "%-", dead)
    -- The host is gone, its container stays (its keeper stopped).
    assert.is_true(H.settled(function()
      return store:containers()
    end, function(names)
      return names[1] == dead
    end)[1] == dead)
    -- Beside it: a container named as ours by this process (alive), and
    -- one whose name only starts with the prefix.
    local boot = dead:match("^" .. prefix:gsub("%-", "%%-") .. "%-(%x+)%-")
    local start = H.read_file("/proc/" .. H.pid() .. "/stat"):match("^.*%)%s(.*)$")
      :match(("%S+%s+"):rep(19) .. "(%S+)")
    local me = ("%s-%s-%d-%s-ffffff-1"):format(prefix, boot, H.pid(), start)
    finally(function()
      store:run({ "rm", "-f", "-t", "0", "--ignore", dead, me, prefix .. "-other" })
    end)
    detached(me, { "sleep", "600" })
    detached(prefix .. "-other", { "sleep", "600" })
    local result, err = H.run(opts({ sandbox = podman({ name = prefix }) }))
    assert.is_nil(err)
    assert.equals("done", result.answer)
    -- (the session's own container goes moments after its close)
    local expected = { me, prefix .. "-other" }
    table.sort(expected)
    assert.same(expected, H.settled(function()
      return store:containers()
    end, function(names)
      return #names <= 2
    end))
  end)

  it_podman("keeps warm containers in a pool: two taken by three sessions, the third cold", function()
    local pool = assert(rlm.Pool.new({ size = 2, sandbox = H.sandbox(podman()) }))
    -- Vetted through the stream (the pool's checks that need no session).
    local stats = H.settled(function()
      return pool:stats()
    end, function(st)
      return st.ready == 2
    end)
    assert.equals(2, stats.ready)
    -- The pool's option in other words is the pool's; another image is not.
    rlm.Session.new(H.opts({ pool = pool, sandbox = podman({ image = IMAGE, pids_limit = 128 }) })):close()
    local ok, e = pcall(rlm.Session.new, H.opts({ pool = pool, sandbox = podman({ image = "other:1" }) }))
    assert.is_false(ok)
    assert.matches("option 'sandbox.image' differs from the pool's", e, 1, true)
    local sessions = {}
    for i = 1, 3 do
      sessions[i] = rlm.Session.new(H.opts({ pool = pool, context = "context " .. i,
        root_llm = H.script({ H.fence("print(llm_query(context))"), H.fence("FINAL(context.upper())") }) }))
      sessions[i]:poll() -- its start: a take, or a cold start
    end
    local counts = pool:stats()
    assert.same({ 2, 1 }, { counts.taken, counts.cold })
    for i, s in ipairs(sessions) do
      local result, err = s:run()
      s:close()
      assert.is_nil(err, err and err.message)
      assert.equals("CONTEXT " .. i, result.answer)
      assert.equals(i <= 2 and "warm" or "cold", s.sandbox.start)
    end
    pool:close()
  end)

  -- sandbox.claim / sandbox.release on the exec backend, with a stand-in
  -- for a Kubernetes SandboxClaim: the claim starts a container of its own
  -- (podman run -d ... sleep) and gives `podman exec -i` into it as the
  -- stream; the release removes it.
  local function stand_in(log)
    local n = 0
    return {
      backend = "exec",
      claim = function(info)
        n = n + 1
        local name = ("%s-claim-%d"):format(NAME, n)
        detached(name, { "sleep", "infinity" })
        log[#log + 1] = { "claim", name, info.depth, info.pool or false }
        return util.append({ "sh", "-c", 'cd "$0" && exec "$@"', store.dir, store.podman }, store.all,
          { "exec", "-i", name, "/usr/local/bin/rlm-keeper" }), name
      end,
      release = function(name)
        log[#log + 1] = { "release", name }
        store:run({ "rm", "-f", "-t", "0", name })
        return true
      end,
    }
  end

  it_podman("claims a sandbox for a session and releases it at close(): the claimed container is gone", function()
    local log = {}
    local result, err = H.run(opts({ sandbox = stand_in(log), context = "claimed",
      root_llm = H.script({ H.fence("FINAL(context)") }) }))
    assert.is_nil(err, err and err.message)
    assert.equals("claimed", result.answer)
    assert.equals("exec", result.sandbox.backend)
    assert.same({ { "claim", NAME .. "-claim-1", 0, false }, { "release", NAME .. "-claim-1" } }, log)
  end)

  it_podman("claims a pool's sandboxes and releases each, taken or idle", function()
    local log = {}
    local pool = assert(rlm.Pool.new({ size = 1, sandbox = H.sandbox(stand_in(log)) }))
    assert.same({ { "claim", NAME .. "-claim-1", 0, true } }, log)
    local result, err = H.run({ pool = pool, context = "pooled", root_llm = H.script({ H.fence("FINAL(context)") }) })
    assert.is_nil(err, err and err.message)
    assert.equals("pooled", result.answer)
    pool:close()
    local released = {}
    for _, entry in ipairs(log) do
      if entry[1] == "release" then
        released[#released + 1] = entry[2]
      end
    end
    table.sort(released)
    -- the taken one, at its session's close; its replacement, at the pool's
    assert.same({ NAME .. "-claim-1", NAME .. "-claim-2" }, released)
    assert.equals(0, pool:stats().release_failed)
  end)

  it_podman("says what the engine says when it cannot run a container (sandbox_unavailable)", function()
    local _, err = H.run(opts({ sandbox = podman({ image = "localhost/rlm-no-such-image:0" }) }))
    assert.equals("sandbox_unavailable", err.kind)
    assert.matches("rlm-no-such-image", err.message, 1, true)
  end)

  if P.hybrid_cgroups() then
    it_podman("needs runtime = \"runc\" on this host, and says so in crun's words", function()
      -- make image installs runc, not crun: crun is optional here.
      if H.sh("command -v crun || true") == "" then
        return pending("crun is not installed (make image installs runc only): nothing to refuse this host")
      end
      local _, err = H.run(opts({ sandbox = podman({ runtime = "crun" }) }))
      assert.equals("sandbox_unavailable", err.kind)
      assert.matches("cgroups in hybrid mode not supported", err.message, 1, true)
    end)
  end
end)

describe("the docker backend", function()
  after_each(H.assert_clean)

  -- No daemon at that socket (whether or not one runs on this machine).
  it("says the engine's own words when no daemon answers (sandbox_unavailable)", function()
    if H.sh("command -v docker || true") == "" then
      return pending("the docker client is not installed")
    end
    local _, err = H.run(H.opts({ sandbox = { backend = "docker", global_args = { "-H",
      "unix://" .. H.tmpdir .. "-no-docker.sock" } } }))
    assert.equals("sandbox_unavailable", err.kind)
    assert.matches("Cannot connect to the Docker daemon", err.message, 1, true)
    assert.matches("docker ps", err.message, 1, true)
  end)

  it("names option 'sandbox.engine' when the engine's program is missing", function()
    local _, err = H.run(H.opts({ sandbox = { backend = "docker", engine = "/nonexistent/docker" } }))
    assert.equals("sandbox_unavailable", err.kind)
    assert.matches("option 'sandbox.engine'", err.message, 1, true)
  end)
end)

describe("the container backends' options", function()
  local misuse = {
    { { image = "" }, "option 'sandbox.image' must be" },
    { { image = "--privileged" }, "option 'sandbox.image' must be" },
    { { image = 5 }, "option 'sandbox.image' must be" },
    { { engine = "" }, "option 'sandbox.engine' must be" },
    { { engine = "pod\0man" }, "option 'sandbox.engine' must be" },
    { { global_args = "--root /x" }, "option 'sandbox.global_args' must be" },
    { { global_args = { "" } }, "option 'sandbox.global_args' must be" },
    { { runtime = "-x" }, "option 'sandbox.runtime' must be" },
    { { runtime = true }, "option 'sandbox.runtime' must be" },
    { { ulimits = { nofile = -1 } }, "option 'sandbox.ulimits' must be" },
    { { ulimits = { files = 10 } }, "option 'sandbox.ulimits' must be" },
    { { ulimits = { nofile = 1.5 } }, "option 'sandbox.ulimits' must be" },
    { { ulimits = { 1024 } }, "option 'sandbox.ulimits' must be" },
    { { extra_args = { "--x", 1 } }, "option 'sandbox.extra_args' must be" },
    { { extra_args = { x = "y" } }, "option 'sandbox.extra_args' must be" },
    { { name = "" }, "option 'sandbox.name' must be" },
    { { name = "-rlm" }, "option 'sandbox.name' must be" },
    { { name = "rlm x" }, "option 'sandbox.name' must be" },
    { { name = ("r"):rep(65) }, "option 'sandbox.name' must be" },
    { { seccomp_profile = true }, "option 'sandbox.seccomp_profile' must be" },
    { { seccomp_profile = "" }, "option 'sandbox.seccomp_profile' must be" },
    { { pids_limit = 8 }, "option 'sandbox.pids_limit' must be" },
    { { pids_limit = 100.5 }, "option 'sandbox.pids_limit' must be" },
    { { keeper = "rlm-keeper" }, "option 'sandbox.keeper' must be" },
    { { allow = { "none" } }, "option 'sandbox.allow' must be" },
    { { ping_timeout_ms = 10 }, "option 'sandbox.ping_timeout_ms' must be" },
    { { argv = { "sh" } }, "option 'sandbox' has no field 'argv'" },
    { { claim = print }, "option 'sandbox' has no field 'claim'" },
    { { imgae = "x" }, "did you mean 'image'?" },
  }
  for _, backend in ipairs({ "podman", "docker" }) do
    for _, case in ipairs(misuse) do
      it(("raises naming the field on %s: %s"):format(backend, case[2]), function()
        local sb = { backend = backend }
        for k, v in pairs(case[1]) do
          sb[k] = v
        end
        local ok, e = pcall(rlm.Session.new, H.opts({ sandbox = sb }))
        assert.is_false(ok)
        assert.matches(case[2], e, 1, true)
        ok, e = pcall(rlm.Pool.new, { size = 1, sandbox = sb })
        assert.is_false(ok)
        assert.matches(case[2], e, 1, true)
      end)
    end
  end
end)

-- An engine that never answers (a stand-in `podman` first on PATH whose
-- every command sleeps): the sweep's `ps` of a Lua state's first start is
-- bounded by start_timeout_ms, as the spawn's hello is.
describe("a hung container engine", function()
  after_each(H.assert_clean)

  for _, backend in ipairs({ "podman", "docker" }) do
    it(("ends a %s start at start_timeout_ms with sandbox_unavailable"):format(backend), function()
      local bin = H.tmpdir .. "-hung-" .. backend
      H.sh("mkdir -p " .. bin)
      finally(function()
        H.sh("rm -rf " .. bin)
      end)
      local f = assert(io.open(bin .. "/" .. backend, "w"))
      f:write("#!/bin/sh\nexec sleep 600\n")
      f:close()
      H.sh("chmod 755 " .. bin .. "/" .. backend)
      local t0 = core.now_ms()
      -- (the engine's program by its path: as a stand-in first on PATH is
      -- found)
      local _, err = H.run(H.opts({ sandbox = { start_timeout_ms = 1500, backend = backend,
        engine = bin .. "/" .. backend, name = "rlm-spec-hung" } }))
      local took = core.now_ms() - t0
      assert.equals("sandbox_unavailable", err.kind, err.message)
      assert.matches("did not end within sandbox.start_timeout_ms (1500 ms)", err.message, 1, true)
      assert.matches(backend .. " ps -a", err.message, 1, true)
      assert.is_true(took < 1500 + 8000, ("%.0f ms"):format(took))
    end)
  end
end)

-- A host whose OCI runtime cannot set what the engine asks (a stand-in
-- `podman` that fails its `run` in runc's or crun's words, as on this VM
-- with the defaults): the error names the fields that fix it and the
-- section of docs/backends.md that says how.
describe("a container start the host's runtime refuses", function()
  after_each(H.assert_clean)

  local rows = {
    { "runc: runc create failed: unable to start container process: error during container init: "
      .. "error setting rlimit type 7: operation not permitted", { "sandbox.ulimits", "sandbox.runtime" } },
    { "crun: cgroups in hybrid mode not supported, drop all controllers from cgroupv2", { "sandbox.runtime" } },
  }
  for i, row in ipairs(rows) do
    it(("names the fields that fix it: %s"):format(row[1]:match("[^:]*$")), function()
      local bin = H.tmpdir .. "-refused-" .. i
      H.sh("mkdir -p " .. bin)
      finally(function()
        H.sh("rm -rf " .. bin)
      end)
      local f = assert(io.open(bin .. "/podman", "w"))
      f:write(("#!/bin/sh\nif [ \"$1\" = run ]; then echo 'Error: OCI runtime error: %s' >&2; exit 126; fi\n")
        :format(row[1]))
      f:close()
      H.sh("chmod 755 " .. bin .. "/podman")
      local _, err = H.run(H.opts({ sandbox = { backend = "podman", engine = bin .. "/podman",
        name = "rlm-spec-refused" } }))
      assert.equals("sandbox_unavailable", err.kind, err.message)
      assert.matches(row[1], err.message, 1, true)
      for _, field in ipairs(row[2]) do
        assert.matches(field, err.message, 1, true)
      end
      assert.matches('(docs/backends.md, "On a host like this one")', err.message, 1, true)
    end)
  end
end)
