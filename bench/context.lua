-- Figure 4, context load: a big ASCII string context, from the Lua string to
-- ready in the REPL. The load is Session.new plus the first step with the big
-- context, less the same with a one-byte context (both measured here,
-- interleaved), so that the sandbox's start is not counted. The floor writes
-- the bytes to a file from Lua and maps and decodes it into a str in Python
-- (context_floor.py decode), timed inside. Memory: the driver's peak RssAnon, polled
-- by memwatch.py during one more session, against 1.2 x context + 50 MB.
-- For contrast, the same bytes as one JSON line over a pipe (context_floor.py sink).
local common = require("bench.common")
local cjson = require("cjson")

local M = {}

local MB = common.MB

local SIZES = {
  full = { cases = { { mb = 100, samples = 7 }, { mb = 1024, samples = 5, big = true } }, json_mb = 100 },
  tiny = { cases = { { mb = 1, samples = 1 } }, json_mb = 1 },
}

local FLOOR_NAME = "write a file from Lua + mmap and decode it to a str in python"

-- The first exec proves the context arrived whole.
local ANSWER = "```repl\nprint(len(context))\n```"

-- Whether the 1 GB case runs: by default only with room for the Lua string,
-- the page cache's copy and the driver's str at once.
local function big_case_allowed()
  if os.getenv("BENCH_SKIP_1GB") == "1" then
    return false, "skipped: BENCH_SKIP_1GB=1"
  end
  local avail = tonumber((common.read_file("/proc/meminfo") or ""):match("MemAvailable:%s*(%d+)"))
  if not avail or avail * 1024 < 6 * 2 ^ 30 then
    return false, ("skipped: MemAvailable %.1f GB < 6 GB"):format((avail or 0) / 2 ^ 20)
  end
  return true
end

local function make_text(bytes)
  local line = ("0123456789abcdef"):rep(4) .. "\n"
  local n = math.floor(bytes / #line)
  return line:rep(n) .. ("x"):rep(bytes - n * #line)
end

-- Each session's sandbox is reaped before the next sample (as figure 1's):
-- a driver still being torn down would take CPU from the next one, and
-- memwatch.py could find it instead of the next one's.
local function load_ms(env, context)
  local s, ms, entry = common.start(env, { context = context, answer = ANSWER, max_rss_bytes = 0 })
  common.close_reaped(s)
  local stdout = entry.stdout
  assert(stdout == #context .. "\n", "the REPL saw a context of " .. stdout)
  return ms
end

local function floor_ms(env, text)
  local path = env.scratch .. "/context-floor"
  local t0 = common.now_ms()
  common.write_file(path, text)
  local write_ms = common.now_ms() - t0
  local r = common.python_json(env, "context_floor.py", { "decode", path })
  os.remove(path)
  assert(r.chars == #text)
  return write_ms + r.ms, r.rss_anon_kb * 1024
end

-- The driver's peak RssAnon while one session loads `text`.
local function driver_peak(env, text)
  local stop = env.scratch .. "/memwatch-stop"
  local w = assert(io.popen(table.concat({ common.quote(env.python), "-I", "-S",
    common.quote(common.path(env, "memwatch.py")), common.self_pid(), "0.001", common.quote(stop) }, " ")))
  assert(w:read("*l") == "ready", "memwatch.py did not start")
  local ok, err = pcall(load_ms, env, text)
  common.write_file(stop, "")
  local report = cjson.decode(w:read("*a"))
  w:close()
  os.remove(stop)
  assert(ok, err)
  assert(report.found, "memwatch.py never saw the driver")
  return report.peak_rss_anon_kb * 1024, report.vm_hwm_kb * 1024
end

local function mb(bytes)
  return bytes / MB
end

local function speed_row(figure, name, bytes, ms, n, floor_name, floor_ms_, floor_n, min_ratio, note)
  local speed = mb(bytes) / (math.max(ms, 1e-3) / 1000)
  local floor_speed = mb(bytes) / (floor_ms_ / 1000)
  local row = {
    figure = figure, name = name, value = speed, unit = "MB/s", n = n,
    text = ("%.0f MB/s (%.0f ms)"):format(speed, ms),
    floor = { name = floor_name, value = floor_speed, n = floor_n,
      text = ("%.0f MB/s (%.0f ms)"):format(floor_speed, floor_ms_) },
    ratio = speed / floor_speed, note = note,
  }
  row.ratio_text = ("%.2fx"):format(row.ratio)
  if min_ratio then
    row.target = (">= %gx floor speed"):format(min_ratio)
    row.met = row.ratio >= min_ratio
  end
  return row
end

local function memory_row(figure, name, _bytes, peak, floor_name, floor_peak, limit, note)
  local row = {
    figure = figure, name = name, value = mb(peak), unit = "MB", n = 1,
    text = ("%.0f MB"):format(mb(peak)),
    floor = { name = floor_name, value = mb(floor_peak), n = 1, text = ("%.0f MB"):format(mb(floor_peak)) },
    ratio = peak / floor_peak, note = note,
  }
  row.ratio_text = ("%.2fx"):format(row.ratio)
  if limit then
    row.target = ("<= 1.2 x ctx + 50 MB = %.0f MB"):format(mb(limit))
    row.met = peak <= limit
  end
  return row
end

local function run_case(env, case, rows)
  local bytes = case.mb * MB
  local label = case.mb >= 1024 and ("%g GB"):format(case.mb / 1024) or ("%g MB"):format(case.mb)
  local text = make_text(bytes)
  local small, big, floor, floor_rss = {}, {}, {}, {}
  for i = 1, case.samples do
    small[i] = load_ms(env, "x")
    -- Both write the bytes to tmpdir's filesystem. Each starts with no
    -- dirty pages (sync is not timed), and they take turns going first, so
    -- that neither is throttled by the other's writeback.
    for turn = 0, 1 do
      os.execute("sync")
      if (i + turn) % 2 == 0 then
        big[i] = load_ms(env, text)
      else
        floor[i], floor_rss[i] = floor_ms(env, text)
      end
    end
  end
  local net = common.median(big) - common.median(small)
  rows[#rows + 1] = speed_row("4", "context load " .. label .. ": Lua string to ready", bytes, net,
    case.samples, FLOOR_NAME, common.median(floor), case.samples, 0.75,
    ("Session.new + first step %.0f ms, less %.0f ms with a 1-byte context")
      :format(common.median(big), common.median(small)))
  local peak, hwm = driver_peak(env, text)
  rows[#rows + 1] = memory_row("4", "driver peak RssAnon, " .. label .. " context", bytes, peak,
    "the floor process's RssAnon after decoding", common.median(floor_rss), 1.2 * bytes + 50 * MB,
    ("polled every 1 ms by memwatch.py; VmHWM (counts the mapped file) %.0f MB"):format(mb(hwm)))
  return text, { ms = common.median(floor), rss = common.median(floor_rss) }
end

-- The same bytes as one JSON string line to a python process that
-- json.loads it: cjson.encode in Lua, then the pipe and the decoding.
local function json_line(env, text, floor, rows)
  local exe, why = common.helper(env)
  if not exe then
    rows[#rows + 1] = common.context_row("4", "contrast: JSON line over a pipe", nil, nil, "-", 0,
      "skipped: " .. why)
    return
  end
  local t0 = common.now_ms()
  local line = cjson.encode(text)
  local encode_ms = common.now_ms() - t0
  -- floor_pingpong sends it from a file, read before its clock starts.
  local path = env.scratch .. "/context-json"
  common.write_file(path, line)
  line = nil -- luacheck: ignore (not held while the receiver runs)
  local out = common.capture({ exe, "send", path, "--", env.python, "-I", "-S",
    common.path(env, "context_floor.py"), "sink" })
  os.remove(path)
  local ns, reply = out:match("^(%d+)\n([^\n]*)")
  reply = cjson.decode(reply)
  assert(reply.chars == #text)
  local ms = encode_ms + tonumber(ns) / 1e6
  local label = ("%g MB"):format(#text / MB)
  rows[#rows + 1] = speed_row("4", "contrast: " .. label .. " as one JSON line over a pipe", #text, ms, 1,
    FLOOR_NAME, floor.ms, 1, nil,
    ("outside rlm: cjson.encode %.0f ms, then pipe + json.loads"):format(encode_ms))
  rows[#rows + 1] = memory_row("4", "contrast: JSON line receiver's RssAnon, " .. label, #text,
    reply.rss_anon_kb * 1024, "the floor process's RssAnon after decoding", floor.rss, nil,
    "the line and the str are both alive when json.loads returns")
end

-- Where rlm's workdirs and the floor's file go: tmpfs when it has room, so
-- that the disk's writeback is in neither figure (on this machine's ext4 a
-- lone 1 GB write took from 0.2 s to 2.5 s). BENCH_CONTEXT_DIR overrides.
local function files_base(env)
  local base = os.getenv("BENCH_CONTEXT_DIR")
  if base then
    return base
  end
  local df = common.capture({ "df", "-Pk", "/dev/shm" })
  local avail = tonumber(df:match("\n%S+%s+%d+%s+%d+%s+(%d+)"))
  return avail and avail * 1024 > 3 * 2 ^ 30 and "/dev/shm" or env.scratch
end

function M.run(env)
  local dir = common.mkdtemp(files_base(env))
  local fs = common.capture({ "findmnt", "-n", "-o", "FSTYPE", "-T", dir }):match("%S+") or "?"
  local cenv = {}
  for k, v in pairs(env) do
    cenv[k] = v
  end
  cenv.tmpdir, cenv.scratch = dir, dir
  local ok, rows = pcall(M.run_in, cenv)
  common.remove_tree(dir)
  assert(ok, rows)
  for _, row in ipairs(rows) do
    if row.value then
      row.note = (row.note and row.note .. "; " or "") .. "files on " .. fs
    end
  end
  return rows
end

function M.run_in(env)
  local size = common.sizes(env, SIZES)
  local rows = {}
  for _, case in ipairs(size.cases) do
    local allowed, why = true, nil
    if case.big then
      allowed, why = big_case_allowed()
    end
    if allowed then
      local text, floor = run_case(env, case, rows)
      if case.mb == size.json_mb then
        -- Held against the map-and-decode floor of the same size.
        json_line(env, text, floor, rows)
      end
    else
      rows[#rows + 1] = common.context_row("4", ("context load %g GB"):format(case.mb / 1024),
        nil, nil, "-", 0, why)
    end
    collectgarbage()
  end
  return rows
end

return M
