-- bench/main.lua ROOT TMP: runs every figure (bench/<figure>.lua), prints the
-- table and writes bench/RESULTS.md. Started by bench/run, which sets the
-- module paths. BENCH_TINY=1 runs the tiny sizes the spec uses (and then
-- leaves RESULTS.md alone); BENCH_ONLY=name,name runs some figures only.
local root, tmp = arg[1], arg[2]
package.path = root .. "/?.lua;" .. package.path
local common = require("bench.common")

local tiny = os.getenv("BENCH_TINY") == "1"

local function sh(cmd)
  local p = io.popen(cmd)
  local out = p and p:read("*a") or ""
  if p then
    p:close()
  end
  return (out:gsub("%s+$", ""))
end

local function loadavg()
  return (common.read_file("/proc/loadavg") or "?"):match("^(%S+ %S+ %S+)") or "?"
end

local function machine()
  local cpuinfo = common.read_file("/proc/cpuinfo") or ""
  local meminfo = common.read_file("/proc/meminfo") or ""
  return {
    { "nproc", sh("nproc") },
    { "CPU", cpuinfo:match("model name%s*:%s*([^\n]+)") or "?" },
    { "kernel", sh("uname -sr") },
    { "memory", ("%.1f GB total, %.1f GB available at start"):format(
      tonumber(meminfo:match("MemTotal:%s*(%d+)") or 0) / 2 ^ 20,
      tonumber(meminfo:match("MemAvailable:%s*(%d+)") or 0) / 2 ^ 20) },
    { "load average at start", loadavg() },
    { "tmpdir's filesystem", sh("findmnt -n -o FSTYPE,SOURCE -T " .. common.quote(tmp)) },
    { "date", os.date("!%Y-%m-%d %H:%M UTC") },
    { "software", ("%s, %s, %s"):format(_VERSION, sh("python3 -V 2>&1"), sh("bwrap --version")) },
  }
end

local function result(row)
  if row.met == true then
    return "MET"
  elseif row.met == false then
    return "NOT MET"
  elseif row.target then
    return "no floor"
  end
  return "-"
end

-- The terminal: two lines a row, the figure with its ratio and verdict, then
-- its floor.
local function print_row(row)
  print(("%-2s %-62s %-30s n=%-6s %-13s %-22s %s"):format(row.figure, row.name, row.text or "-",
    tostring(row.n or "-"), row.ratio_text or "", row.target or "", result(row)))
  if row.floor then
    print(("     floor: %-55s %-30s n=%s"):format(row.floor.name, row.floor.text, tostring(row.floor.n)))
  elseif row.floor_missing or row.no_floor then
    print("     floor: " .. (row.floor_missing or row.no_floor))
  end
  if row.note then
    print("     note: " .. row.note)
  end
end

local function cell(s)
  return (tostring(s or ""):gsub("|", "\\|"))
end

local METHOD = [[
## How the figures are measured

Times are medians over the samples (n), with p99 where there are 100 samples or
more; every floor is measured in the same run, and the ratio is the figure
against it (for speeds, figure speed / floor speed). MB is 2^20 bytes. The
root model is a scripted stand-in that answers at once (figure 11's takes 50
or 300 ms); the REPL, the sandbox and the sub-calls are real.

Figures 2 and 3 run pinned to one CPU (`taskset`; rlm, its sandbox and the
floors alike): a request/response exchange never runs both ends at once, and
unpinned, a pipe round trip on this 2-vCPU VM costs 6 to 45 us depending on
where the scheduler puts the two ends. The unpinned figures are shown too.

1. **Cold start**: `Session.new` + the first `step()` (answer `x = 1`): spawn,
   hello, configure, self-test, context load, one exec. Floor: the real
   bubblewrap command line (`rlm.core.sandbox_argv`, binds from the same
   interpreter probe) running `bench/echo_driver.py` instead of the driver,
   from spawn to its answer to one line, from a plain C host
   (`bench/floor_pingpong.c`). Samples alternate floor and rlm in rounds. The
   session's teardown is not timed, nor the floor's, and each sample starts
   once the last one's sandbox is reaped, as each of the floor's does (its
   helper reaps a child before the next); the back-to-back figure, each
   start right after the last one's close, is shown beside it. The phases (medians of
   the same samples): rlm.engine.boot's `start_times` (the host's clock around the
   spawn and each reply, bubblewrap's exec from the keeper thread, and the
   driver's `CLOCK_MONOTONIC` stamps in its hello, `configured`,
   `self_test_result` and `ready`); beside each, the floor's part where the
   floor does the same (`floor_pingpong phases`: the spawn to the exec, the
   exec to the echo driver's first line, that to its hello, one line's
   round trip). The phases do not add up to the total exactly: the host's
   reading of each reply sits between them.
2. **Step round trip**: `s:step()` timed in Lua, many steps in one session.
   Floor: `floor_pingpong` writing one short JSON-like line to
   `python3 -I -S bench/echo_driver.py` over a pipe and reading the echo.
   Floor chunks and step chunks take turns, in 10 rounds. Flat steps: each
   round's median step over the median of the floor chunk just before it;
   the median of that over the last 3 rounds against the first 3 (a single
   window's median swings with the shared machine's load, both ways; a
   copy of the history per step reads 3.4x, a copy of its list 1.5x).
3. **llm_query round trip**: one exec calls `llm_query("q")` in a loop; each
   call is timed inside the REPL with `time.perf_counter_ns`. The Lua callback
   returns its prompt, and every 1,000 calls first runs a chunk of both
   floors (those 10 calls are left out of the samples). Floors: the pipe
   ping-pong of figure 2, and `bench/tcp_echo.py` (client and echo server
   processes on 127.0.0.1, a new connection per request): what the trip
   costs beside a bare pipe, not targets. The target is against the cost of
   what the call stands for: a sub-call to a hosted model waits 100 ms or
   more, and the round trip must stay under 0.1% of that (100 us). (A
   second reading and writing of the lone call's lines, in C and Python,
   saved some 12 us a call here, 25.8 us against 38 us at a pipe floor of
   14.6 us; it went for one path, issue 40. With run() a loop over poll()
   and reply() too, 47 us against 26.5 us before issue 40, its closing note.)
4. **Context load**: (`Session.new` + first step with the context) less
   (the same with a 1-byte context), medians of interleaved samples. The
   first exec prints `len(context)`, which is checked. Floor: write the bytes
   to a file from Lua, then `bench/context_floor.py decode` maps it and decodes it
   into a `str` (timed inside, so without Python's start). Both write to the
   same filesystem: tmpfs (`/dev/shm`) when it has 3 GB free, else tmpdir's,
   or `BENCH_CONTEXT_DIR`; each timed sample starts after `sync` (not timed),
   and the two take turns going first, so that neither pays for the other's
   writeback. Memory: the sandboxed interpreter's RssAnon, polled every 1 ms
   by `bench/memwatch.py` during one more session; the floor is
   `context_floor.py decode`'s RssAnon after decoding. The JSON rows send the same
   bytes, `cjson.encode`d, as one line to `bench/context_floor.py sink`, outside rlm.
   The 1 GB case runs when MemAvailable > 6 GB, unless `BENCH_SKIP_1GB=1`.
5. **Memory limit**: `b.append(bytearray(1 << 20))` in an endless loop
   under `max_rss_bytes` = 256 MB: the poll alone (`memory_cgroup = false`
   where that option exists) every 10 and 50 ms, then the default setup (a
   memory cgroup where the host may make one, beside the 50 ms poll); the
   note says which mechanism ended each sample. Overshoot: `err.peak -
   err.limit`. Time to kill: from the start of the step to the
   `memory_limit` error. References: the allocation rate of the same loop
   (bounded, in a fresh sandbox) times the poll interval, and the time that
   rate needs to fill the limit from the sandbox's memory before the loop.
6. **Host cost**: this Lua process's VmRSS after a warm-up session, then with
   50 sessions open (each after one step), after garbage collection; the
   Lua heap's share is shown. Start: 100 sessions one after another, each kept
   open until all are started; the floor is 100 x the figure 1 floor's median,
   measured again here.
7. **Concurrent sub-calls**: one session driven by the luv adapter; each
   step's code times `llm_query_batched` of 64 prompts inside the REPL, and
   each prompt is answered by a callback that finishes 50 ms later on a luv
   timer. With `max_concurrent_sub_calls = 64` all are in flight at once;
   the default 8 is shown beside it. Floor: 64 timers of 50 ms started
   together on the same loop, measured by the root model's callback just
   before it asks for each batch. Beside it, what a nested session costs:
   `rlm_query` of a child whose root model answers `FINAL(context)` at
   once, timed in the REPL (spawn, self-test, context, one turn, teardown),
   one after another and as `rlm_query_batched` of 8; the floor is figure
   1's (bubblewrap with the same binds, spawn to first answer).
9. **Host tool round trip**: one exec calls a host tool `add(i, y=1)` (a Lua
   function) 1,000 times, each call timed inside the REPL with
   `time.perf_counter_ns`; ten such execs take turns with ten execs of 1,000
   `llm_query("q")` calls in the same session, which are the floor.
10. **Warm pool** (`rlm.Pool`, size 8): `Session.new{pool = p}` plus the
   first step (`x = 1`) when the pool holds self-tested sandboxes (it is let
   refill before each sample, and come to rest: its idle sandboxes' CPU
   time unchanged for 30 ms, their warm-up over, as a server's pool is
   between requests); target ≤ 2 ms median, shown with its p90
   beside the cold start of figure 1 measured in the same run and figure
   1's floor. Then nested sessions drawing from the pool, timed in the REPL:
   one `rlm_query`, and `rlm_query_batched` of 8 from one exec. The batch's
   floor is the least time the machine's CPUs allow for it: its CPU time
   (medians: the host's thread from the root model's answer to the step's
   end less the pool's refill, the 8 nested sandboxes from their take to
   their close, the root's sandbox) as max(the host's thread, all of it /
   the CPUs), since the host's thread serves the 8 one after another;
   target ≤ 1.5x that floor (the note gives it against one nested session
   too). Last, the same one and 8 with each nested session's code sleeping
   20 ms in its sandbox before its answer: with work that does not need the
   CPUs, the batch's sessions run side by side; target ≤ 1.3x one such
   nested session.
11. **The first answer with a model that takes its time**: from
   `rlm.Session.new` to the end of the first step (`x = 1`) when the root
   model answers after 50 ms and after 300 ms: under `step()`, a stand-in
   that blocks (a wait on nothing, as a blocking HTTP client blocks the
   host); under the luv adapter, one that returns and answers through
   `done` from a luv timer (started from the loop's present time), where
   the first step's end is the root model's second call. Each from a cold
   start and from a pool of 1 taken warm (let refill and come to rest before
   each sample), in 10 rounds of one sample of every case. Floor: max(start,
   model latency) + one step, with the start (`Session.new` to the host's
   last check of the sandbox, `start_times.checked`) and the step (from
   there to the first step's end) the medians of samples taken the same way
   in the same rounds with a model that answers at once, and the latency the
   stand-in's own, timed inside it; target ≤ 1.1x: the model's first call
   overlapping the sandbox's start. The note gives the sum start + latency +
   step, what an engine that starts the sandbox before it calls the model
   costs.
12. **What the root model reads**: one run of a fixed scripted task
   (`bench/tokens.lua`: 600 support tickets as a list of dicts, the
   question which product has the most refund requests; 5 root turns: look,
   filter with code, `llm_query_batched` over the hits in batches of 50
   answered by a stand-in sub-model, count, `FINAL`), counting what the
   root model is sent: the contents of every message (system prompt and
   history) of every root call, summed, in bytes and in words (runs of
   characters that are not white space; no tokenizer). Beside it our system
   prompt alone, and the reference implementation's (alexzhang13/rlm's
   `rlm/utils/prompts.py`, as its `build_rlm_system_prompt` sends it by
   default), counted the same way once from the commit the note names (its
   text is not in this repository). The counts are deterministic: n = 1.
13. **The container** (`make image`; docs/backends.md): `podman run -i --rm`
   of the sandbox image with the boundary's flags, each sample a new
   container, from the spawn of podman to the first line its process
   writes (`floor_pingpong hello`; the container is ended and reaped before
   the next sample, untimed): python3 running the echo driver, and
   rlm-keeper (with bubblewrap's flags) where the image holds it, each
   beside the same program started on the host; and `podman run true` to
   its exit (the engine's whole cost, `--rm`'s removal too) beside
   `/bin/true`. No target: the figure says what a container costs a cold
   start.
14. **A batch under 429s** (`bench/jitter.lua`): 64 calls in one
   `llm_query_batch` of `rlm.llm.openai` over LuaSocket, all side by side,
   against `bench/rate_limited.py`, which answers 8 requests per 100 ms
   window and a 429 without `Retry-After` to the rest, so the client's
   backoff (retry_base_ms 100) decides when they come back: with full jitter
   (the default) and without (`jitter = false`), median of 3. Beside each:
   the requests sent, and the most that reached the server within 10 ms
   after the first 64 (which go at once either way). Floor: the same 64
   paced by a client that reads the server's clock once and sends 8 at the
   start of each window, never refused. No target: the figure is the
   difference between the two rows.
15. **The exec backend** (`sandbox = { backend = "exec", argv = ... }`,
   rlm-keeper at the far end of a byte stream, on this machine): through
   `sh -c 'cat | rlm-keeper | cat'` (processes that only copy bytes, as a
   remote transport's do) and over a direct pipe to `build/rlm-keeper`,
   beside the local backend in the same run. Cold start as figure 1's
   (`Session.new` + the first step), the three taking turns in rounds of
   5, each sample once rlm.core's teardown of the last one is over
   (`core.teardowns()`); the keeper's probe cache (`--cache`) is filled by
   a first session, shown on its own, as an image's build fills it. The
   phases are medians of ms from `Session.new`: the keeper's hello read by
   the host, the driver's first line (its `CLOCK_MONOTONIC` stamp; the far
   side is this machine), its hello, `ready` and the host's checks. Step
   round trip as figure 2's, one session per backend, pinned to one CPU,
   in 5 rounds each after a chunk of both pipe floors: `floor_pingpong`
   with the echo driver directly and through `cat | ... | cat`. And over
   TCP to `rlm-keeper --listen` on 127.0.0.1 (`sandbox.connect`, issue
   42's direct path), each sample's keeper listening before its
   `Session.new`, as a warm pod's is: its cold start is a claim to the
   first step.
16. **A long run** (`bench/long_run.lua`): one scripted task of 30 root
   turns over 40 documents (at each turn the stand-in root model prints
   600 characters of one document and has the sub-model read 8 of them with
   `llm_query_batched`, a window moving 3 documents a turn, the notes kept
   in a variable of the turn; the last turn answers from turns 1, 2 and 5's
   variables), run four ways. What the root model is sent, summed over the
   run's root calls and counted as figure 12 counts it (bytes, and words:
   runs of characters that are not white space), with `compact = {
   at_tokens = 8000, keep_turns = 4 }` (a digest), and with `summary =
   "model"` (the summary calls' input counted in), each beside the same
   run without compaction, the floor; the note gives the largest single
   call against the bound. Then the sub-calls paid with `sub_call_cache =
   true` beside the same run without it (the floor), and the distinct
   prompts, the least any cache pays. No target: deterministic, n = 1.
17. **The podman backend** (`sandbox = { backend = "podman" }`,
   `bench/podman.lua`): the image `make image` builds, imported into a
   Podman store of the figure's own, each sandbox a new container (`run -i
   --rm --log-driver=passthrough` and the boundary's flags), beside the
   local backend in the same run. Cold start as figure 1's, the two taking
   turns in rounds of 2, each sample once rlm.core's teardown of the last
   one is over (the client exited, `--rm` done), with its phases (ms from
   `Session.new`: the keeper's hello read, `ready`, the checks) and the
   first session of each on its own (the interpreter probe; the engine's
   first `ps` and first container). Step round trip as figure 15's, one
   session each, pinned to one CPU, 5 rounds taking turns; target 2x, as
   the exec backend's. A warm take (`Session.new{pool}` + the first step
   from a pool of one, let settle before each) beside the same take from a
   pool of the local backend; no target.
18. **The journal's size per step** (`bench/journal.lua`, issue 41,
   docs/durability.md): one scripted task of 20 root turns, each printing
   600 characters of a document and asking the sub-model for 3 summaries
   (`llm_query`); its records made as a session will write them (the
   engine does not write a journal yet: they are built from what the run's
   callbacks see) and written to a file store in the scratch directory. A
   step's entry (the messages it added, the answers its code received) is
   the figure, the median over the steps before the answer's; its floor is
   what it carries, the messages' contents and the answers' texts, so the
   ratio is the format's overhead. The note has the head, the bytes
   written per step with the answers' entries and the head, the whole
   journal, and the time of a write (fsync'd). No target: deterministic
   but for the times, n = the steps.
]]

-- One row of RESULTS.md's table.
local function table_row(row)
  local res = result(row)
  if row.met ~= nil then
    res = "**" .. res .. "**"
  end
  return ("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"):format(cell(row.figure), cell(row.name),
    cell(row.text), cell(row.n), cell(row.floor and row.floor.name or row.floor_missing or row.no_floor),
    cell(row.floor and row.floor.text), cell(row.ratio_text), cell(row.target), res, cell(row.note))
end

local function write_results(path, rows, info, seconds)
  local out = {}
  local function add(s)
    out[#out + 1] = s
  end
  add("# rlm benchmark results\n")
  add("Written by `bench/run`; run it again to refresh this file. The machine is shared and")
  add("noisy: read each figure against its floor, measured in the same run.\n")
  add("## Machine\n")
  for _, kv in ipairs(info) do
    add(("- %s: %s"):format(kv[1], kv[2]))
  end
  add(("- load average at the end: %s"):format(loadavg()))
  add(("- duration of the run: %.0f s\n"):format(seconds))
  add("## Figures\n")
  add("| # | figure | median | n | floor | floor median | ratio | target | result | notes |")
  add("|---|---|---|---|---|---|---|---|---|---|")
  local met, total = 0, 0
  for _, row in ipairs(rows) do
    if row.met ~= nil then
      total = total + 1
      met = met + (row.met and 1 or 0)
    end
    add(table_row(row))
  end
  add(("\n%d of %d targets met.\n"):format(met, total))
  add(METHOD)
  common.write_file(path, table.concat(out, "\n"))
  return met, total
end

local only = {}
for name in (os.getenv("BENCH_ONLY") or ""):gmatch("[%w_]+") do
  only[name] = true
end

local info = machine()
local env = common.env({
  root = root, tmpdir = tmp .. "/sessions", scratch = tmp .. "/scratch", size = tiny and "tiny" or "full",
})
os.execute("mkdir -p " .. common.quote(env.tmpdir) .. " " .. common.quote(env.scratch))

print(("rlm benchmarks (%s sizes): %s, nproc %s, %s"):format(env.size, info[2][2], info[1][2], info[3][2]))
local t0 = common.now_ms()
local rows = {}
for _, name in ipairs(common.FIGURES) do
  if next(only) == nil or only[name] then
    local t = common.now_ms()
    local figure_rows = require("bench." .. name).run(env)
    io.stderr:write(("[%s: %.1f s]\n"):format(name, (common.now_ms() - t) / 1000))
    for _, row in ipairs(figure_rows) do
      print_row(row)
      rows[#rows + 1] = row
    end
    collectgarbage()
  end
end
local seconds = (common.now_ms() - t0) / 1000

if tiny or next(only) ~= nil then
  print(("\n(%.0f s; partial or tiny run: bench/RESULTS.md left as it was)"):format(seconds))
  if os.getenv("BENCH_ROWS") then
    -- The run's rows as RESULTS.md would hold them (to update some rows).
    print(("\n(load average at the end: %s)"):format(loadavg()))
    for _, row in ipairs(rows) do
      print(table_row(row))
    end
  end
else
  local met, total = write_results(root .. "/bench/RESULTS.md", rows, info, seconds)
  print(("\n%d of %d targets met in %.0f s; wrote bench/RESULTS.md"):format(met, total, seconds))
end
