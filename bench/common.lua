-- What the benchmarks share: statistics, /proc readers, the floor helpers
-- (bench/floor_pingpong.c and the small Python scripts beside it) and the
-- sessions every figure starts. Runs on Lua 5.1, 5.3, 5.4 and LuaJIT.
local core = require("rlm.core")
local cjson = require("cjson")
local rlm = require("rlm")

local M = {}

-- In the order bench/run reports them; each is the module bench.<name>.
M.FIGURES = { "cold_start", "step", "llm_query", "context", "watchdog", "host_cost", "concurrency", "start_gap",
  "tools", "pool", "first_step", "tokens", "container", "jitter", "exec", "long_run", "podman", "journal" }

M.now_ms = core.now_ms
M.MB = 2 ^ 20

-- The scripted root model's answer when a step should cost as little as a
-- step can.
M.TRIVIAL = "```repl\nx = 1\n```"

-- Statistics ------------------------------------------------------------------

local function sorted(xs)
  local s = {}
  for i = 1, #xs do
    s[i] = xs[i]
  end
  table.sort(s)
  return s
end

-- The q-quantile by nearest rank (p99 of 100 samples is the 99th smallest).
function M.quantile(xs, q)
  local s = sorted(xs)
  return s[math.max(1, math.ceil(q * #s))]
end

function M.median(xs)
  local s, n = sorted(xs), #xs
  if n % 2 == 1 then
    return s[(n + 1) / 2]
  end
  return (s[n / 2] + s[n / 2 + 1]) / 2
end

function M.summary(xs)
  return { median = M.median(xs), p99 = M.quantile(xs, 0.99), n = #xs }
end

-- A slice of a list, for "the first 100 steps" and the like.
function M.slice(xs, i, j)
  local out = {}
  for k = math.max(1, i), math.min(#xs, j) do
    out[#out + 1] = xs[k]
  end
  return out
end

-- Shell and files ---------------------------------------------------------------

M.quote = require("rlm.base.util").shell_quote

-- What the root model is sent, as figures 12 and 16 count it ------------------

-- Words: runs of characters that are not white space (no tokenizer: the
-- same measure for any model, and for the reference's prompt).
-- n made-up documents of k words each ("Document 0. invoice refund ..."),
-- the same for the same seed: the long runs' context.
function M.documents(n, k, seed)
  local out, x = {}, seed
  local words = { "invoice", "refund", "shipment", "outage", "contract", "renewal", "audit", "backup",
    "latency", "quota" }
  for i = 1, n do
    local parts = {}
    for j = 1, k do
      x = (x * 75 + 74) % 65537
      parts[j] = words[x % #words + 1]
    end
    out[i] = ("Document %d. "):format(i - 1) .. table.concat(parts, " ")
  end
  return out
end

function M.words(s)
  local n = 0
  for _ in s:gmatch("%S+") do
    n = n + 1
  end
  return n
end

-- One root call's messages counted into sent ({ calls =, bytes =, words = }):
-- its bytes, returned too.
function M.count_sent(sent, messages)
  local bytes = 0
  for _, m in ipairs(messages) do
    bytes = bytes + #m.content
    sent.words = sent.words + M.words(m.content)
  end
  sent.calls, sent.bytes = sent.calls + 1, sent.bytes + bytes
  return bytes
end

local function command(argv)
  local parts = {}
  for i, a in ipairs(argv) do
    parts[i] = M.quote(a)
  end
  return table.concat(parts, " ")
end

-- Runs argv (a list, no shell syntax) and returns its standard output. Lua
-- 5.1 cannot tell the exit status, so callers check what was printed.
function M.capture(argv)
  local p = assert(io.popen(command(argv), "r"))
  local out = p:read("*a")
  p:close()
  return out
end

function M.exists_on_path(name)
  local out = M.capture({ "sh", "-c", 'command -v "$0" || true', name })
  return out:match("%S") ~= nil
end

function M.read_file(path)
  local f = io.open(path, "rb")
  if not f then
    return nil
  end
  local data = f:read("*a")
  f:close()
  return data
end

function M.write_file(path, data)
  local f = assert(io.open(path, "wb"))
  assert(f:write(data))
  assert(f:close())
end

function M.mkdtemp(base)
  local dir = M.capture({ "mktemp", "-d", (base or "/tmp") .. "/rlm-bench.XXXXXX" }):gsub("%s+$", "")
  assert(dir ~= "", "mktemp -d failed")
  return dir
end

function M.remove_tree(path)
  os.execute("rm -rf " .. M.quote(path))
end

-- /proc -----------------------------------------------------------------------

-- This Lua process's pid: /proc/self opened from here is us.
function M.self_pid()
  return tonumber(M.read_file("/proc/self/stat"):match("^(%d+)"))
end

-- A field of /proc/<pid>/status in kB ("self" for this process), or nil.
function M.status_kb(pid, key)
  local s = M.read_file("/proc/" .. pid .. "/status")
  return s and tonumber(s:match("\n" .. key .. ":%s*(%d+)"))
end

-- The children of every thread of pid: rlm.core starts each sandbox from
-- a thread of its own.
function M.children(pid)
  local out = {}
  local tasks = M.capture({ "ls", "/proc/" .. pid .. "/task" })
  for tid in tasks:gmatch("%d+") do
    for p in (M.read_file(("/proc/%d/task/%s/children"):format(pid, tid)) or ""):gmatch("%d+") do
      out[#out + 1] = tonumber(p)
    end
  end
  return out
end

function M.comm(pid)
  return ((M.read_file("/proc/" .. pid .. "/comm") or ""):gsub("%s+$", ""))
end

-- The outer bubblewrap of each sandbox this process runs.
function M.sandboxes()
  local out = {}
  for _, p in ipairs(M.children(M.self_pid())) do
    if M.comm(p) == "bwrap" then
      out[#out + 1] = p
    end
  end
  return out
end

-- Anonymous plus shared memory over a process tree, in bytes: what the
-- watchdog (csrc/watchdog.c) sums.
function M.tree_rss(pid)
  local total = ((M.status_kb(pid, "RssAnon") or 0) + (M.status_kb(pid, "RssShmem") or 0)) * 1024
  for _, c in ipairs(M.children(pid)) do
    total = total + M.tree_rss(c)
  end
  return total
end

-- Pins this process, and every process it starts from now on, to one CPU.
-- Returns a function that undoes it, or nil and why. A request/response
-- exchange never runs both ends at once, so one CPU costs it nothing; what
-- pinning takes out is this VM's wake-ups of a sleeping vCPU, which cost a
-- pipe round trip anywhere from 6 to 45 us here, depending on where the
-- scheduler happens to put the two ends.
function M.pin()
  if not M.exists_on_path("taskset") then
    return nil, "taskset not found"
  end
  local pid = tostring(M.self_pid())
  local list = M.capture({ "taskset", "-p", "-c", pid }):match("list:%s*(%S+)")
  local cpu = list and list:match("(%d+)$")
  if not cpu then
    return nil, "taskset did not say which CPUs this process may use"
  end
  M.capture({ "taskset", "-p", "-c", cpu, pid })
  return function()
    M.capture({ "taskset", "-p", "-c", list, pid })
  end
end

-- Whether Session.new knows an option (it raises on one it does not).
-- Nothing starts: the sandbox waits for the first step.
function M.has_option(name, value)
  local function f()
    return ""
  end
  local ok, err = pcall(rlm.Session.new, { root_llm = f, llm_query = f, [name] = value })
  return ok or not tostring(err):match("unknown option")
end

-- The environment every figure gets -------------------------------------------

-- env{root=, tmpdir=, scratch=, size="full"|"tiny"}: root is the checkout,
-- tmpdir holds session workdirs, scratch the benchmarks' own files.
function M.env(o)
  local env = { root = o.root, tmpdir = o.tmpdir, scratch = o.scratch, size = o.size or "full" }
  -- The interpreter the sandbox runs is the real file behind `python3` (a
  -- pyenv shim is a shell script): the floors run that same file.
  env.python = M.capture({ "python3", "-I", "-c",
    "import os, sys; print(os.path.realpath(sys.executable))" }):gsub("%s+$", "")
  assert(env.python:sub(1, 1) == "/", "python3 did not say where it lives")
  return env
end

function M.sizes(env, table_)
  return table_[env.size] or error("unknown size " .. tostring(env.size))
end

function M.path(env, name)
  return env.root .. "/bench/" .. name
end

-- Builds floor_pingpong once per env. Returns its path, or nil and why.
function M.helper(env)
  if env.helper == nil then
    if not M.exists_on_path("cc") then
      env.helper, env.helper_missing = false, "cc not found"
    else
      local exe = env.scratch .. "/floor_pingpong"
      local log = M.capture({ "sh", "-c", 'cc -O2 -o "$0" "$1" 2>&1 && echo built',
        exe, M.path(env, "floor_pingpong.c") })
      if log:match("built%s*$") then
        env.helper = exe
      else
        env.helper, env.helper_missing = false, "cc failed: " .. log
      end
    end
  end
  return env.helper or nil, env.helper_missing
end

local function numbers(out)
  local xs = {}
  for n in out:gmatch("%d+") do
    xs[#xs + 1] = tonumber(n)
  end
  return xs
end

-- floor(env, mode, n, argv) -> samples in ms | nil, why. See floor_pingpong.c.
-- floor_pingpong's command line: MODE N, the files argv.opens asks it to
-- open in each child (FD=PATH, see sandbox_echo_argv), then argv.
function M.floor_command(exe, mode, n, argv)
  local cmd = { exe, mode, tostring(n) }
  for _, o in ipairs(argv.opens or {}) do
    cmd[#cmd + 1] = o
  end
  cmd[#cmd + 1] = "--"
  for _, a in ipairs(argv) do
    cmd[#cmd + 1] = a
  end
  return cmd
end

function M.floor(env, mode, n, argv)
  local exe, why = M.helper(env)
  if not exe then
    return nil, why
  end
  local ns = numbers(M.capture(M.floor_command(exe, mode, n, argv)))
  if #ns ~= n then
    error(("floor_pingpong %s printed %d samples, not %d"):format(mode, #ns, n))
  end
  for i = 1, #ns do
    ns[i] = ns[i] / 1e6
  end
  return ns
end

-- The echo driver run outside the sandbox, as the pipe floors do.
function M.echo_argv(env, extra)
  return { env.python, "-I", "-S", M.path(env, "echo_driver.py"), extra }
end

-- The real sandbox's command line (csrc/sandbox.c, through
-- rlm.core.sandbox_argv) with the bench's echo driver in place of
-- repl_driver.py, and the binds the real sandbox gets from the same probe.
-- As the real spawn does, the driver is copied in (--perms 0444 --file FD
-- at /rlm/repl_driver.py) from a descriptor opened afresh for each child:
-- argv.opens = { "FD=PATH" }, for floor_pingpong (M.floor_command). The
-- real sandbox's other file, the package's zip, is the driver's own and is
-- left out, as is the driver's staging (as root) and its uid.
local ECHO_FD = 5
function M.sandbox_echo_argv(env, workdir)
  if not env.sandbox_ro then
    -- The same probe, with the modules the real one imports.
    local sandbox = require("rlm.sandbox.bwrap")
    local argv = { env.python, "-I", env.root .. "/python/probe.py" }
    for _, m in ipairs(sandbox.default_modules) do
      argv[#argv + 1] = m
    end
    local info = cjson.decode(M.capture(argv))
    if type(info.interpreter) ~= "string" then
      info.interpreter = nil
    end
    env.sandbox_ro, env.sandbox_python = sandbox.readonly_paths(info), info.executable
  end
  local argv = core.sandbox_argv({
    bwrap = core.find_program("bwrap"),
    python = env.sandbox_python,
    driver = M.path(env, "echo_driver.py"),
    workdir = workdir,
    ro = env.sandbox_ro,
  })
  -- The seccomp filter's descriptor is rlm.core's own (a memfd it hands the
  -- child); without it the floor is, if anything, a little cheaper.
  local driver = M.path(env, "echo_driver.py")
  local out, i, copied = { opens = { ECHO_FD .. "=" .. driver } }, 1, false
  while i <= #argv do
    if argv[i] == "--seccomp" or argv[i] == "--seccomp-fd" then
      i = i + 2
    elseif argv[i] == "--ro-bind" and argv[i + 1] == driver then
      for _, a in ipairs({ "--perms", "0444", "--file", tostring(ECHO_FD), argv[i + 2] }) do
        out[#out + 1] = a
      end
      i = i + 3
      copied = true
    else
      out[#out + 1] = argv[i]
      i = i + 1
    end
  end
  if not copied then
    error("the sandbox's command line binds no " .. driver)
  end
  return out
end

-- Runs a bench script with the interpreter the sandbox uses and decodes the
-- JSON it prints last.
function M.python_json(env, script, args)
  local argv = { env.python, "-I", "-S", M.path(env, script) }
  for _, a in ipairs(args or {}) do
    argv[#argv + 1] = tostring(a)
  end
  local out = M.capture(argv)
  local last = out:match("([^\n]+)\n*$")
  local ok, v = pcall(cjson.decode, last or "")
  if not ok or type(v) ~= "table" then
    error(script .. " printed no JSON: " .. out:sub(1, 300))
  end
  return v
end

-- Sessions ----------------------------------------------------------------------

local function echo(prompt)
  return prompt
end

-- A session whose sub-model echoes and whose root model answers from a
-- script: opts.answers = {first, second, ...}, the last repeated (default:
-- TRIVIAL every time); opts.answer = a is {a}. Other opts override.
function M.session_opts(env, opts)
  local answers, turn = { M.TRIVIAL }, 0
  local o = {
    context = "",
    root_llm = function()
      turn = turn + 1
      return answers[math.min(turn, #answers)]
    end,
    llm_query = echo,
    step_timeout_ms = 120000,
  }
  for k, v in pairs(opts or {}) do
    if k == "answer" then
      answers = { v }
    elseif k == "answers" then
      answers = v
    else
      o[k] = v
    end
  end
  -- The sessions' workdirs go under env.tmpdir, whatever else their
  -- sandbox option says.
  local sandbox = { tmpdir = env.tmpdir }
  for k, v in pairs(o.sandbox or {}) do
    sandbox[k] = v
  end
  o.sandbox = sandbox
  return o
end

-- Session.new plus the first step: (session, ms, the step's entry). Raises
-- if the step fails.
function M.start(env, opts)
  local o = M.session_opts(env, opts)
  local t0 = M.now_ms()
  local s = rlm.Session.new(o)
  local entry, err = s:step()
  local ms = M.now_ms() - t0
  if not entry then
    s:close()
    error("the first step failed: " .. tostring(err))
  end
  return s, ms, entry
end

-- Closes session s and waits (up to 5 s) until its sandbox's launcher is
-- reaped: close() only hands the sandbox to its keeper thread, whose kill
-- and reaping (and the kernel's teardown of the sandbox's namespaces, some
-- 4 ms of CPU here) would otherwise overlap whatever the caller times next.
-- The floor's helper reaps each of its sandboxes before its next sample.
function M.close_reaped(s)
  local pid = s.sandbox.driver and s.sandbox.driver:pid() or 0
  s:close()
  local t0 = M.now_ms()
  while pid > 0 and M.now_ms() - t0 < 5000 do
    local stat = M.read_file("/proc/" .. pid .. "/stat")
    if not stat or stat == "" or stat:match("^%d+ %b() Z") then
      break -- reaped, or exited and about to be
    end
    local ws = core.waitset()
    ws:wait(1)
    ws:close()
  end
end

-- Blocks this thread for ms (a poll with nothing to wait on): what a
-- blocking HTTP client does to the host while a model thinks.
function M.sleep(ms)
  local ws = core.waitset()
  ws:wait(ms)
  ws:close()
end

-- Closes s and waits (up to max_ms) until rlm.core's teardown of it is
-- over: the local backend's sandbox reaped, a stream's far side ended, a
-- container's client gone.
function M.close_settled(s, max_ms)
  s:close()
  local t0 = M.now_ms()
  while core.teardowns() > 0 and M.now_ms() - t0 < max_ms do
    M.sleep(1)
  end
end

-- The CPU time (ms) the processes of a sandbox have used, from
-- /proc/<pid>/schedstat (nanoseconds on the CPU).
function M.tree_cpu_ms(drv)
  local total = 0
  for _, pid in ipairs(drv and drv:tree() or {}) do
    local f = io.open("/proc/" .. pid .. "/schedstat", "r")
    local ns = f and tonumber((f:read("*l") or ""):match("^(%d+)"))
    if f then
      f:close()
    end
    total = total + (ns or 0)
  end
  return total / 1e6
end

-- How long a pool's idle sandboxes must have used no CPU for the pool to
-- count as settled: past their self-test, a driver warms up its first
-- step's parts (its modules, the compiler) while it waits, and a sample
-- that takes one before then would count that warm-up as its own.
local QUIET_MS = 30

-- Waits until every sandbox of the pool has run its self-test (`want` of
-- them, all by default: one fewer while a root session's own replacement
-- is still owed) and its warm-up: a pool at rest, as a server's is between
-- requests.
function M.settle_pool(pool, want)
  local t0 = M.now_ms()
  while true do
    local st = pool:stats()
    if st.ready >= (want or pool.size) and st.starting == 0 then
      break
    end
    if M.now_ms() - t0 > 60000 then
      error("the pool did not refill within 60 s")
    end
    M.sleep(5)
  end
  local function idle_cpu()
    local total = 0
    for _, entry in ipairs(pool.idle) do
      total = total + M.tree_cpu_ms(entry.drv)
    end
    return total
  end
  local last, since = idle_cpu(), M.now_ms()
  while M.now_ms() - since < QUIET_MS and M.now_ms() - t0 < 60000 do
    M.sleep(5)
    local now = idle_cpu()
    if now ~= last then
      last, since = now, M.now_ms()
    end
  end
end

-- A take from pool plus its first step, then its close: (ms, the host
-- thread's CPU ms over the take). Raises if the take started cold.
function M.warm_take(env, pool)
  local c0 = core.thread_cpu_ms()
  local s, ms = M.start(env, { pool = pool })
  local cpu = core.thread_cpu_ms() - c0
  assert(s.sandbox.start == "warm", "a sample started cold")
  s:close()
  return ms, cpu
end

-- One step that must succeed: ms.
function M.step(s)
  local t0 = M.now_ms()
  local entry, err = s:step()
  local ms = M.now_ms() - t0
  if not entry then
    error("a step failed: " .. tostring(err))
  end
  if entry.error then
    error("the step's code raised: " .. entry.error)
  end
  return ms, entry
end

-- Result rows --------------------------------------------------------------------
--
-- A row is one line of the table:
--   figure, name        which figure and what was measured
--   value, unit, p99, n the median (p99 where there is one) and the samples
--   text                the value as shown ("38.1 ms, p99 52.0")
--   floor = { name, value, text, n } | nil; without one, floor_missing says
--                       why it could not be measured (a tool is missing), or
--                       no_floor why there is none
--   ratio, ratio_text   value against the floor, read the way the target is
--   target, met         the target's text and whether it was met (nil: none)
--   note                anything else worth a sentence

function M.fmt_ms(s)
  if not s then
    return "-"
  end
  local t = ("%.3g ms"):format(s.median)
  if s.p99 and s.n and s.n >= 100 then
    t = t .. (", p99 %.3g"):format(s.p99)
  end
  return t
end

function M.fmt_us(s)
  local t = ("%.1f us"):format(s.median * 1000)
  if s.p99 and s.n >= 100 then
    t = t .. (", p99 %.1f"):format(s.p99 * 1000)
  end
  return t
end

-- A timing row: lower is better; ratio = value / floor, met when ratio <= max.
function M.time_row(r)
  local row = {
    figure = r.figure, name = r.name, unit = "ms", value = r.stats.median, p99 = r.stats.p99,
    n = r.stats.n, text = (r.fmt or M.fmt_ms)(r.stats), note = r.note,
  }
  if r.floor then
    row.floor = { name = r.floor_name, value = r.floor.median, n = r.floor.n,
      text = (r.fmt or M.fmt_ms)(r.floor) }
    row.ratio = row.value / row.floor.value
    row.ratio_text = ("%.2fx"):format(row.ratio)
  else
    row.floor_missing = r.floor_missing
  end
  if r.max_ratio then
    row.target = ("<= %gx floor"):format(r.max_ratio)
    if row.ratio then
      row.met = row.ratio <= r.max_ratio
    end
  end
  return row
end

function M.context_row(figure, name, value, unit, text, n, note)
  return { figure = figure, name = name, value = value, unit = unit, text = text, n = n,
    note = note, context = true }
end

return M
