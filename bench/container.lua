-- Figure 11, the container boundary: `podman run` of the sandbox image
-- (make image) with the flags docs/backends.md gives, each sample a new
-- container, timed from the spawn of podman to the first line its process
-- writes (floor_pingpong's `hello` mode; the container is ended and reaped
-- before the next sample, untimed), beside the same process started on
-- the host: python3 (the echo driver) to its hello; rlm-keeper to its
-- hello, where the image holds it; and `podman run true` to its exit,
-- which counts the engine's whole cost (--rm's removal too), beside
-- /bin/true. Samples alternate with their floor's, so that a noisy
-- neighbour lands on both. Where Podman or the image is missing, one row
-- says so.
local common = require("bench.common")
local P = require("spec.helpers.podman")
local rlm = require("rlm")

local M = {}

local SIZES = {
  full = { rounds = 5, per_round = 2 },
  tiny = { rounds = 1, per_round = 1 },
}

local MEMORY = 256 * 2 ^ 20
local PIDS = 64

local function append(out, list)
  for _, w in ipairs(list) do
    out[#out + 1] = w
  end
  return out
end

local function note_row(name, note)
  return { figure = "13", name = name, text = "-", note = note }
end

-- n samples of floor_pingpong mode over argv (ms), appended to into; nil
-- and why when they could not be taken (a container that did not start).
local function sample(env, mode, n, argv, into)
  local ok, ms, why = pcall(common.floor, env, mode, n, argv)
  if not ok or not ms then
    return nil, ok and why or tostring(ms)
  end
  append(into, ms)
  return true
end

function M.run(env)
  local size = common.sizes(env, SIZES)
  local podman = P.find()
  if not podman then
    return { note_row("podman run to the first line", "podman is not installed (make image installs it)") }
  end
  local global, why = P.global_flags()
  if not global then
    return { note_row("podman run to the first line", why) }
  end
  local image = "localhost/rlm-sandbox:" .. rlm._VERSION:match("^rlm (%S+)$")
  local listed = common.capture({ "sh", "-c", 'env -u LD_PRELOAD "$0" image exists "$1" && echo yes', podman,
    image })
  if not listed:match("yes") then
    return { note_row("podman run to the first line", image .. " is not in this user's Podman store (make image)") }
  end
  local seccomp = env.root .. "/build/rlm-seccomp.json"
  if not common.read_file(seccomp) then
    seccomp = env.scratch .. "/rlm-seccomp.json"
    common.capture({ "env", "-u", "LD_PRELOAD", "python3", env.root .. "/sandbox/image/seccomp.py",
      "/usr/share/containers/seccomp.json", seccomp })
  end
  -- floor_pingpong gives its children PATH and no more: rootless Podman
  -- needs HOME too.
  local function podman_run(extra, command)
    local argv = { "/usr/bin/env", "HOME=" .. (os.getenv("HOME") or "/"), podman }
    append(argv, global)
    append(argv, { "run", "-i", "--rm" })
    append(argv, P.ulimit_flags())
    append(argv, P.boundary_flags(MEMORY, PIDS))
    append(argv, extra)
    argv[#argv + 1] = image
    return append(argv, command)
  end
  local has_keeper = common.capture({ "sh", "-c", 'env -u LD_PRELOAD "$0" image inspect --format '
    .. "'{{.Config.Cmd}}' \"$1\"", podman, image }):find("rlm-keeper", 1, true) ~= nil
  local host_keeper = env.root .. "/build/rlm-keeper"
  local has_host_keeper = common.read_file(host_keeper) ~= nil

  local echo = common.path(env, "echo_driver.py")
  local cases = {
    { name = "podman run to python3's first line (the echo driver's hello)", mode = "hello",
      argv = podman_run({ "-v", echo .. ":/opt/echo_driver.py:ro" },
        { "/usr/bin/python3", "-I", "-S", "/opt/echo_driver.py" }),
      floor_name = "the echo driver on the host (python3 -I -S), spawn to its hello",
      floor_argv = { env.python, "-I", "-S", echo } },
    { name = "podman run to rlm-keeper's hello (with bubblewrap's flags)", mode = "hello",
      skip = not has_keeper and "the image has no rlm-keeper (csrc/rlm_keeper.c is not on this branch yet)",
      argv = podman_run(P.bwrap_flags(seccomp), {}),
      floor_name = "build/rlm-keeper on the host, spawn to its hello",
      floor_argv = has_host_keeper and { host_keeper, "--driver-dir", env.root .. "/python" } or nil },
    { name = "podman run true, spawn to exit (the engine's whole cost, --rm's removal too)", mode = "exit",
      argv = podman_run({}, { "/bin/true" }), floor_name = "/bin/true on the host, spawn to exit",
      floor_argv = { "/bin/true" } },
  }
  local rows = {}
  for _, case in ipairs(cases) do
    if case.skip then
      rows[#rows + 1] = note_row(case.name, case.skip)
    else
      local real, floor, floor_missing = {}, {}, nil
      for _ = 1, size.rounds do
        local ok, err = sample(env, case.mode, size.per_round, case.argv, real)
        if not ok then
          return { note_row(case.name, err) }
        end
        if case.floor_argv then
          local _, ferr = sample(env, case.mode, size.per_round, case.floor_argv, floor)
          floor_missing = ferr
        else
          floor_missing = "build/rlm-keeper is not built here"
        end
      end
      rows[#rows + 1] = common.time_row({
        figure = "13", name = case.name, stats = common.summary(real),
        floor = #floor > 0 and common.summary(floor) or nil, floor_missing = floor_missing,
        floor_name = case.floor_name,
        note = "each sample a new container: " .. table.concat(global, " ")
          .. (#global > 0 and " " or "") .. "run -i --rm, the boundary's flags (docs/backends.md)",
      })
    end
  end
  return rows
end

return M
