-- Issue 41's proof on the command line: bin/rlm --journal, killed with
-- SIGKILL at ten points of a 20-turn scripted run with sub-calls, then
-- finished by bin/rlm --resume: the same answer each time, and no request
-- made again whose answer the journal could hold. Against the fake server
-- (spec/helpers/fake_openai.py), which answers by what a request asks (its
-- rules, so that a request asked again gets the same answer), holds a
-- chosen request (hold_ms: the CLI is then known to wait on it, for the
-- kill), and records each request's key, arrival and answer times.
local H = require("helpers")
local F = require("helpers.fake_openai")
local socket = require("socket")
local util = require("rlm.base.util")
local cjson = require("cjson")

local root = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/[^/]*$") or "."
local BIN = root .. "/bin/rlm"
local LUA = os.getenv("RLM_SPEC_LUA") or "lua5.4"
local q = util.shell_quote

-- Set while wt-8's engine side (rlm.Session.resume) has not landed: the
-- spec's cases are then pending, with this reason. nil: they run.
local PENDING = nil

local TURNS = 20
local QUESTION = "Join the answers of the scripted run, issue 41."
local HOLD_MS = 60000 -- far longer than any kill takes to land

local function prompt(t, k)
  return ("sub t%d q%d"):format(t, k)
end

local function answer(t, k)
  return ("ans t%d q%d"):format(t, k)
end

-- Printed at a turn's end: the next root request's last message holds it,
-- and the fake answers that request by it.
local function marker(t)
  return ("<<turn %d done>>"):format(t)
end

-- Turn t's code, as the root model writes it. The prompts and markers are
-- made by P and M in the REPL, so that no code the conversation quotes
-- holds one. Turns by t % 4: 1, one llm_query; 2, a batch of three; 3, an
-- llm_query then a batch of two; 0, an llm_query (turn 8's code then
-- sleeps: a kill point with no call out). Turn 19 joins the answers, turn
-- 20 answers with FINAL_VAR.
local function code_of(t)
  local lines = {}
  if t == 1 then
    lines[1] = 'acc = []\ndef P(t, k):\n    return "sub t%d q%d" % (t, k)\n'
      .. 'def M(t):\n    print("<<turn %d done>>" % t)'
  end
  local kind = t % 4
  if kind == 2 then
    lines[#lines + 1] = ("acc.extend(llm_query_batched([P(%d, 1), P(%d, 2), P(%d, 3)]))"):format(t, t, t)
  else
    lines[#lines + 1] = ("acc.append(llm_query(P(%d, 1)))"):format(t)
  end
  if kind == 3 then
    lines[#lines + 1] = ("acc.extend(llm_query_batched([P(%d, 2), P(%d, 3)]))"):format(t, t)
  end
  if t == 8 then
    lines[#lines + 1] = "import time\ntime.sleep(1.5)"
  end
  if t == TURNS - 1 then
    lines[#lines + 1] = 'result = "|".join(acc)'
  end
  lines[#lines + 1] = ("M(%d)"):format(t)
  return table.concat(lines, "\n")
end

-- The answer the run gives: every sub-call's answer, in the order asked.
local function expected_answer()
  local out = {}
  for t = 1, TURNS - 1 do
    local n = t % 4 == 2 and 3 or t % 4 == 3 and 3 or 1
    for k = 1, n do
      out[#out + 1] = answer(t, k)
    end
  end
  return table.concat(out, "|")
end

-- The fake's rules: a root request by the marker of the turn before (the
-- first by the question), a sub-call by its prompt; each key in `hold`
-- held on its first request.
local function rules(hold)
  local held = {}
  for _, key in ipairs(hold or {}) do
    held[key] = true
  end
  local out = { { match = QUESTION, content = F.fence(code_of(1)) } }
  for t = 2, TURNS do
    out[#out + 1] = { match = marker(t - 1), content = t == TURNS and "FINAL_VAR(result)" or F.fence(code_of(t)) }
  end
  for t = 1, TURNS - 1 do
    for k = 1, 3 do
      out[#out + 1] = { match = prompt(t, k), content = answer(t, k) }
    end
  end
  for _, r in ipairs(out) do
    r.usage = { 10, 5 }
    r.hold_ms = held[r.match] and HOLD_MS or nil
  end
  return out
end

local srv, scratch

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then
    return ""
  end
  local s = f:read("*a")
  f:close()
  return s
end

local runs = 0

-- The pids of the spec's bin/rlm processes and, taken as each was killed,
-- their descendants (its sandbox): after each test, none may live.
local tracked = {}

local function alive(pid)
  local status = os.execute("kill -0 " .. pid .. " 2>/dev/null")
  return status == true or status == 0
end

-- pid's descendants, as /proc lists each process's children.
local function descendants(pid, out)
  out = out or {}
  for kid in H.sh("cat /proc/" .. pid .. "/task/*/children 2>/dev/null"):gmatch("%d+") do
    out[#out + 1] = tonumber(kid)
    descendants(kid, out)
  end
  return out
end

local function strays()
  local out = {}
  for _, pid in ipairs(tracked) do
    if alive(pid) then
      out[#out + 1] = pid
    end
  end
  return out
end

-- Starts bin/rlm in the background with args after the endpoint's flags;
-- returns { pid =, out =, err =, rc =, log =, started = }. Not a child of
-- this process: the shell that waits for it writes its status to rc.
local function start(args)
  runs = runs + 1
  local base = ("%s/run%d"):format(scratch, runs)
  local words = { "--base-url", srv.url, "--model", "fake-root", "--sub-model", "fake-sub",
    "--max-iterations", "25", "--quiet", "--log", base .. ".jsonl" }
  for _, a in ipairs(args) do
    words[#words + 1] = a
  end
  for i, w in ipairs(words) do
    words[i] = q(w)
  end
  local env = { "env", "-u", "RLM_BASE_URL", "-u", "RLM_MODEL", "-u", "RLM_SUB_MODEL", "-u", "RLM_API_KEY_ENV",
    "-u", "RLM_PROVIDER", "-u", "OPENAI_API_KEY", "TMPDIR=" .. H.tmpdir }
  local inner = ("%s %s %s %s >%s 2>%s </dev/null & echo $! >%s; wait $!; echo $? >%s"):format(
    table.concat(env, " "), LUA, BIN, table.concat(words, " "), q(base .. ".out"), q(base .. ".err"),
    q(base .. ".pid"), q(base .. ".rc"))
  local h = { out = base .. ".out", err = base .. ".err", rc = base .. ".rc", log = base .. ".jsonl",
    started = socket.gettime() }
  os.execute(("sh -c %s >/dev/null 2>&1 &"):format(q(inner)))
  local deadline = socket.gettime() + 30
  repeat
    h.pid = tonumber(slurp(base .. ".pid"))
    if not h.pid then
      socket.sleep(0.01)
    end
  until h.pid or socket.gettime() > deadline
  assert(h.pid, "bin/rlm did not start")
  tracked[#tracked + 1] = h.pid
  return h
end

-- Waits for h's exit; returns its status, stdout and stderr.
local function finish(h, timeout)
  local deadline = socket.gettime() + (timeout or 240)
  local code
  repeat
    code = tonumber(slurp(h.rc))
    if not code then
      socket.sleep(0.05)
    end
  until code or socket.gettime() > deadline
  assert(code, "bin/rlm did not end in time: " .. slurp(h.err))
  return code, slurp(h.out), slurp(h.err)
end

-- Polls the fake's log until cond(requests, h) holds; then SIGKILLs h
-- (unless spare) and waits for it to be gone. Returns the requests as they
-- stood once it was (what the journal could hold is among them).
local function kill_when(h, cond, what, spare)
  local deadline = socket.gettime() + 120
  while not cond(srv:brief_requests(), h) do
    assert(socket.gettime() < deadline, "the kill point never came: " .. what .. "\n" .. slurp(h.err))
    assert(not tonumber(slurp(h.rc)), "bin/rlm ended before the kill point (" .. what .. "):\n" .. slurp(h.err))
    socket.sleep(0.02)
  end
  if spare then
    return srv:brief_requests()
  end
  for _, pid in ipairs(descendants(h.pid)) do
    tracked[#tracked + 1] = pid
  end
  os.execute("kill -KILL " .. h.pid)
  local gone = socket.gettime() + 10
  while alive(h.pid) and socket.gettime() < gone do
    socket.sleep(0.01)
  end
  assert.is_false(alive(h.pid))
  return srv:brief_requests()
end

local function find(reqs, key)
  for _, r in ipairs(reqs) do
    if r.key == key then
      return r
    end
  end
end

-- Kill conditions, by the fake's log.
local function arrived(...)
  local keys = { ... }
  return function(reqs)
    for _, key in ipairs(keys) do
      if not find(reqs, key) then
        return false
      end
    end
    return true
  end
end

local function both(a, b)
  return function(reqs, h)
    return a(reqs, h) and b(reqs, h)
  end
end

local function answered(key)
  return function(reqs)
    local r = find(reqs, key)
    return r ~= nil and r.answered ~= nil
  end
end

-- The run's log (--log) has the sub_query event of this prompt: its
-- answer reached the code; a little after it, the code runs on.
local function logged_sub_query(key, after_s)
  local seen
  return function(_, h)
    if not seen and slurp(h.log):find('"prompt":"' .. key .. '"', 1, true) then
      seen = socket.gettime()
    end
    return seen ~= nil and socket.gettime() - seen >= after_s
  end
end

-- The ten kill points: what the CLI is doing, the keys the fake holds
-- (their first request is not answered for a minute), when the kill
-- lands (one condition a kill: a point of two kills is killed again
-- after its first resume), and the keys the resume may ask again: the
-- calls out at the kill, and a batch's calls whose siblings were out (a
-- batch's answers reach the code together). Every other request answered
-- before a kill must not be made again.
local POINTS = {
  { "during the first root call, before any answer", hold = { QUESTION },
    kills = { arrived(QUESTION) }, again = { QUESTION } },
  { "during root call 2: step 1 ended, its answers in", hold = { marker(1) },
    kills = { arrived(marker(1)) }, again = { marker(1) } },
  { "mid-step 3, its llm_query out", hold = { prompt(3, 1) },
    kills = { arrived(prompt(3, 1)) }, again = { prompt(3, 1) } },
  { "mid-step 6, one call of its batch out, the other two answered", hold = { prompt(6, 2) },
    kills = { both(arrived(prompt(6, 2)), both(answered(prompt(6, 1)), answered(prompt(6, 3)))) },
    again = { prompt(6, 1), prompt(6, 2), prompt(6, 3) } },
  { "mid-step 7, its llm_query answered, the batch after it out", hold = { prompt(7, 3) },
    kills = { both(arrived(prompt(7, 3)), answered(prompt(7, 2))) }, again = { prompt(7, 2), prompt(7, 3) } },
  { "mid-step 8, its code running after its llm_query's answer, no call out", hold = {},
    kills = { logged_sub_query(prompt(8, 1), 0.3) }, again = {} },
  { "during root call 12, deep in the run", hold = { marker(11) },
    kills = { arrived(marker(11)) }, again = { marker(11) } },
  { "mid-step 14, two of its batch's three calls out", hold = { prompt(14, 1), prompt(14, 3) },
    kills = { both(arrived(prompt(14, 1), prompt(14, 3)), answered(prompt(14, 2))) },
    again = { prompt(14, 1), prompt(14, 2), prompt(14, 3) } },
  { "twice: during root call 16, then the resumed run mid-step 17, its llm_query out",
    hold = { marker(15), prompt(17, 1) },
    kills = { arrived(marker(15)), arrived(prompt(17, 1)) }, again = { marker(15), prompt(17, 1) } },
  { "during the last root call (the FINAL reply): step 19 ended", hold = { marker(19) },
    kills = { arrived(marker(19)) }, again = { marker(19) } },
}

local function journal_files(dir)
  local names = {}
  for n in H.sh("ls -A " .. q(dir)):gmatch("[^\n]+") do
    names[#names + 1] = n
  end
  return names
end

local figures = {}

-- When h's sandbox was ready (its --log's sandbox_ready, wall-clock
-- seconds), or nil.
local function sandbox_ready(h)
  for line in slurp(h.log):gmatch("[^\n]+") do
    local ok, ev = pcall(cjson.decode, line)
    if ok and type(ev) == "table" and ev.type == "sandbox_ready" then
      return ev.ts
    end
  end
end

describe("bin/rlm --journal and --resume", function()
  local context_file, expected

  setup(function()
    srv = F.start()
    scratch = H.scratch("rlm-resume-spec")
    context_file = scratch .. "/context.txt"
    local f = assert(io.open(context_file, "wb"))
    f:write("the scripted run reads nothing of its context\n")
    f:close()
    expected = expected_answer()
  end)

  teardown(function()
    srv:stop()
    if scratch then
      H.remove_scratch(scratch)
    end
    if #figures > 0 then
      io.stderr:write("\ncli_resume_spec (" .. LUA .. "): from the resume's start, its sandbox ready, "
        .. "then its first request (after the replay)\n")
      for _, line in ipairs(figures) do
        io.stderr:write("  ", line, "\n")
      end
    end
  end)

  after_each(function()
    local left = H.settled(strays, function(pids)
      return #pids == 0
    end)
    for _, pid in ipairs(left) do -- a failed test's run: ended here, by its pid
      os.execute("kill -KILL " .. pid)
    end
    tracked = {}
    assert.are.same({}, left)
    assert.are.same({ srv.pid }, H.settled_children(1))
    -- A run killed while its sandbox started leaves the canary socket the
    -- self-test planted (K1): the next start of any rlm sweeps it once it
    -- is 5 s old (csrc/canary.c, SWEEP_MIN_AGE). Nothing else may be left.
    local left_files = {}
    for _, name in ipairs(H.workdirs()) do
      if not name:find("^%.rlm%-canary%-%x+%.sock$") then
        left_files[#left_files + 1] = name
      end
    end
    assert.are.same({}, left_files)
  end)

  local function journal_dir(name)
    local dir = scratch .. "/" .. name
    os.execute("mkdir -m 0700 " .. q(dir))
    return dir
  end

  local function args_of(dir, extra)
    local a = { "--journal", dir, "--context", context_file }
    for _, e in ipairs(extra or {}) do
      a[#a + 1] = e
    end
    a[#a + 1] = QUESTION
    return a
  end

  describe("says in one line why a run cannot be journaled or resumed", function()
    -- one row a case: the args (DIR: a journal directory of the spec's),
    -- how DIR is made, the exit status, what the one line says (plain)
    local cases = {
      { { "--resume", "abc" }, nil, 2, "rlm: --resume needs --journal DIR, the directory the run was journaled in" },
      { { "--resume", "../x", "--journal", "DIR" }, "0700", 2, 'rlm: --resume wants a session id as rlm printed it '
        .. '(1 to 64 of A-Z a-z 0-9 _ -), got "../x"' },
      { { "--journal", "/tmp" }, nil, 22, "rlm: journal_error: --journal /tmp: journal directory /tmp is not this "
        .. "user's alone" },
      { { "--journal", "DIR" }, "0777", 22, "is not this user's alone" },
      { { "--journal", "DIR/entry" }, "file", 22, "Not a directory" },
      { { "--resume", "0123456789abcdef", "--journal", "DIR" }, "0700", 22, "rlm: journal_error: no journal of "
        .. "session 0123456789abcdef: expired, deleted (its run ended) or never written (exit 22)" },
    }
    for i, case in ipairs(cases) do
      it(("%d for %s"):format(case[3], table.concat(case[1], " ")), function()
        if PENDING and case[1][1] == "--resume" and case[3] ~= 2 then
          return pending(PENDING)
        end
        local dir = scratch .. "/refused" .. i
        if case[2] == "file" then
          os.execute("mkdir -m 0700 " .. q(dir) .. " && touch " .. q(dir .. "/entry"))
        elseif case[2] then
          os.execute("mkdir -m " .. case[2] .. " " .. q(dir))
        end
        local args = {}
        for j, a in ipairs(case[1]) do
          args[j] = a:gsub("^DIR", dir)
        end
        args[#args + 1] = "--context"
        args[#args + 1] = context_file
        args[#args + 1] = QUESTION
        srv:script({}, rules())
        local code, out, err = finish(start(args))
        assert.are.equal(case[3], code, err)
        assert.are.equal("", out)
        assert.is_truthy(err:find(case[4], 1, true), err)
        assert.are.equal(case[3] == 2 and 2 or 1, select(2, err:gsub("\n", "")), err) -- usage adds "Try"
        assert.are.same({}, srv:brief_requests())
      end)
    end

    it("23 naming the process while the run lives, 25 for another question; once killed, it resumes at once",
      function()
        if PENDING then
          return pending(PENDING)
        end
        srv:script({}, rules({ marker(2) }))
        local dir = journal_dir("held")
        local args = args_of(dir)
        local h = start(args)
        local before = kill_when(h, arrived(marker(2)), "root call 3", true) -- not killed yet
        local sandbox = descendants(h.pid)
        assert.is_true(#sandbox > 0, "the CLI has no sandbox process")
        for _, pid in ipairs(sandbox) do
          tracked[#tracked + 1] = pid
        end
        local id = slurp(h.err):match("rlm %-%-resume (%S+) %-%-journal")
        local resume = { "--resume", id }
        for _, a in ipairs(args) do
          resume[#resume + 1] = a
        end
        local code, out, err = finish(start(resume))
        assert.are.equal(23, code, err)
        assert.are.equal("", out)
        assert.matches(("^rlm: lease_held: session %s is held by rlm pid %d on %%S+ %%(boot %%x+, start %%d+%%) "
          .. "%%(fence 1%%) until %%d+: it may be taken over then %%(exit 23%%)\n$"):format(id, h.pid), err)
        assert.are.equal(#before, #srv:brief_requests())
        os.execute("kill -KILL " .. h.pid)
        assert.are.same({}, H.settled(strays, function(left) -- the sandbox dies with it
          return #left == 0
        end))
        local other = { "--resume", id, "--journal", dir, "--context", context_file, "Another question?" }
        code, out, err = finish(start(other))
        assert.are.equal(25, code, err)
        assert.are.equal("", out)
        assert.matches("^rlm: context_mismatch: session " .. id .. " was recorded with another query or context", err)
        assert.are.equal(1, select(2, err:gsub("\n", "")), err)
        local t0 = socket.gettime()
        code, out, err = finish(start(resume))
        assert.are.equal(0, code, err)
        assert.are.equal(expected .. "\n", out)
        assert.is_true(socket.gettime() - t0 < 25, "the dead run's lease was waited out")
      end)
  end)

  it("runs the scripted run whole with --journal: its answer, each request once, no entry left", function()
    if PENDING then
      return pending(PENDING)
    end
    srv:script({}, rules())
    local dir = journal_dir("whole")
    local code, out, err = finish(start(args_of(dir)))
    assert.are.equal(0, code, err)
    assert.are.equal(expected .. "\n", out)
    local id = err:match("rlm %-%-resume (%S+) %-%-journal")
    assert.is_truthy(id, "no resume line on stderr: " .. err)
    assert.matches("^rlm: journal: session " .. id:gsub("%-", "%%-") .. "; if this run is killed, finish it with: "
      .. "rlm %-%-resume " .. id:gsub("%-", "%%-") .. " %-%-journal " .. dir:gsub("%p", "%%%0")
      .. " and the same %-%-context files, QUESTION and flags\n$", err)
    local count = {}
    for _, r in ipairs(srv:brief_requests()) do
      assert.is_string(r.key, "a request no rule answered")
      count[r.key] = (count[r.key] or 0) + 1
      assert.are.equal(1, count[r.key], r.key .. " asked twice")
    end
    assert.are.same({ ".lock" }, journal_files(dir)) -- the store's flock, no entry
  end)

  it("keeps the journal of a run stopped by Ctrl-C (SIGINT), says how to finish it, and finishes it", function()
    if PENDING then
      return pending(PENDING)
    end
    srv:script({}, rules())
    local dir = journal_dir("sigint")
    local args = args_of(dir)
    local h = start(args)
    -- Step 8's code sleeps after its llm_query's answer: run() waits on the
    -- sandbox, where a SIGINT ends the wait at once.
    local before = kill_when(h, logged_sub_query(prompt(8, 1), 0.3), "mid-step 8", true)
    for _, pid in ipairs(descendants(h.pid)) do
      tracked[#tracked + 1] = pid
    end
    os.execute("kill -INT " .. h.pid)
    local code, out, err = finish(h, 60)
    assert.are.equal(20, code, err)
    assert.are.equal("", out)
    local id = err:match("rlm %-%-resume (%S+) %-%-journal")
    local pat = id:gsub("%-", "%%-")
    assert.matches("\nrlm: cancelled: interrupted %(SIGINT%)[^\n]*\nrlm: journal: session " .. pat .. " kept; finish it "
      .. "with: rlm %-%-resume " .. pat .. " %-%-journal " .. dir:gsub("%p", "%%%0")
      .. " and the same %-%-context files, QUESTION and flags\n$", err)
    local kept = journal_files(dir)
    assert.is_true(#kept >= 9, table.concat(kept, " ")) -- the lease, the head, steps 1 to 7, step 8's answer
    local resume = { "--resume", id }
    for _, a in ipairs(args) do
      resume[#resume + 1] = a
    end
    local t0 = socket.gettime()
    code, out, err = finish(start(resume))
    assert.are.equal(0, code, err)
    assert.are.equal(expected .. "\n", out)
    assert.is_true(socket.gettime() - t0 < 25, "the interrupted run's lease was waited out")
    -- Nothing answered before the SIGINT was asked again.
    local count = {}
    for _, r in ipairs(srv:brief_requests()) do
      count[r.key] = (count[r.key] or 0) + 1
    end
    for _, r in ipairs(before) do
      if r.answered then
        assert.are.equal(1, count[r.key], r.key .. " asked again")
      end
    end
    for _, name in ipairs(journal_files(dir)) do
      assert.matches("^%.", name, "journal entry left: " .. name)
    end
  end)

  for i, point in ipairs(POINTS) do
    it(("K%d, killed %s: resumed, the same answer, nothing recorded asked again"):format(i, point[1]), function()
      if PENDING then
        return pending(PENDING)
      end
      srv:script({}, rules(point.hold))
      local dir = journal_dir("k" .. i)
      local args = args_of(dir)
      local may_again = {}
      for _, key in ipairs(point.again) do
        may_again[key] = true
      end
      local answered_before, id = {}, nil
      -- A resume's requests, once it ended or was killed: none of what
      -- the journal could hold; and its time to its first request.
      local function check_resume(h, n, after)
        assert.is_true(#after > #h.before, "the resume asked nothing: " .. slurp(h.err))
        for j = #h.before + 1, #after do
          local key = after[j].key
          assert.is_string(key, "a request no rule answered")
          assert.is_nil(answered_before[key], ("%s was asked again after the kill %s"):format(key, point[1]))
        end
        figures[#figures + 1] = ("K%-4s %-72s %5.2f s %5.2f s"):format(i .. (#point.kills > 1 and "." .. n or ""),
          point[1]:sub(1, 72), (sandbox_ready(h) or 0 / 0) - h.started, after[#h.before + 1].t - h.started)
      end
      local h = start(args)
      for n, cond in ipairs(point.kills) do
        local before = kill_when(h, cond, point[1])
        if h.before then
          check_resume(h, n - 1, before)
        end
        id = id or slurp(h.err):match("rlm %-%-resume (%S+) %-%-journal")
        assert.is_truthy(id, "no resume line on stderr: " .. slurp(h.err))
        -- What the journal could hold: every answer the server wrote
        -- before the kill, but for the calls out then (and their batch).
        for _, r in ipairs(before) do
          if r.answered and not may_again[r.key] then
            answered_before[r.key] = true
          end
        end
        local resume_args = { "--resume", id }
        for _, a in ipairs(args) do
          resume_args[#resume_args + 1] = a
        end
        h = start(resume_args)
        h.before = before
      end
      local code, out, err = finish(h)
      check_resume(h, #point.kills, srv:brief_requests())
      assert.are.equal(0, code, err)
      assert.are.equal(expected .. "\n", out)
      -- Each request at most twice over the runs, once unless it was out
      -- at a kill.
      local count = {}
      for _, r in ipairs(srv:brief_requests()) do
        count[r.key] = (count[r.key] or 0) + 1
        assert.is_true(count[r.key] <= (may_again[r.key] and 2 or 1), r.key .. " asked " .. count[r.key] .. " times")
      end
      -- The finished run deleted its entries (a killed writer's temporary
      -- file is left for store:sweep(), docs/durability.md).
      for _, name in ipairs(journal_files(dir)) do
        assert.matches("^%.", name, "journal entry left: " .. name)
      end
    end)
  end
end)
