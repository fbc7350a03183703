-- rlm.log: the JSON-lines trajectory writer.
local H = require("helpers")
local read = H.read_file
local log = require("rlm.log")
local cjson = require("cjson").new()

local function lines(path)
  local out = {}
  for line in read(path):gmatch("[^\n]+") do
    out[#out + 1] = line
  end
  return out
end

local function decoded(path)
  local out = {}
  for i, line in ipairs(lines(path)) do
    out[i] = cjson.decode(line)
  end
  return out
end

-- True when s is well-formed UTF-8 (no overlong forms, no surrogates).
local function valid_utf8(s)
  local i = 1
  while i <= #s do
    local c = s:byte(i)
    local n = c < 0x80 and 0 or (c >= 0xC2 and c <= 0xDF) and 1 or (c >= 0xE0 and c <= 0xEF) and 2
      or (c >= 0xF0 and c <= 0xF4) and 3 or nil
    if not n then
      return false
    end
    for k = 1, n do
      local b = s:byte(i + k)
      if not b or b < 0x80 or b > 0xBF then
        return false
      end
    end
    local c1 = s:byte(i + 1)
    if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F) or (c == 0xF0 and c1 < 0x90)
        or (c == 0xF4 and c1 > 0x8F) then
      return false
    end
    i = i + n + 1
  end
  return true
end

describe("rlm.log.jsonl", function()
  local path
  before_each(function()
    path = os.tmpname()
  end)
  after_each(function()
    os.remove(path)
  end)

  local function write_all(events, opts)
    local on_event, writer = log.jsonl(path, opts)
    for _, ev in ipairs(events) do
      on_event(ev)
    end
    assert.is_true(writer:close())
    return decoded(path), writer
  end

  it("writes one JSON object a line, in order, the type first", function()
    local evs = write_all({
      { type = "session_start", depth = 0, query = "q?" },
      { type = "step_start", step = 1, depth = 0 },
      { type = "exec_result", step = 1, depth = 0, block = 1, code = "print(1)", stdout = "1\n" },
      { type = "final", step = 1, depth = 0, answer = "42", kind = "value" },
    })
    assert.are.equal(4, #evs)
    assert.are.same({ "session_start", "step_start", "exec_result", "final" },
      { evs[1].type, evs[2].type, evs[3].type, evs[4].type })
    assert.are.equal("q?", evs[1].query)
    assert.are.equal("1\n", evs[3].stdout)
    for _, line in ipairs(lines(path)) do
      assert.matches('^{"type":', line)
    end
  end)

  it("stamps the wall clock in seconds, to the millisecond", function()
    local evs = write_all({ { type = "step_start", step = 1 } })
    local ts = evs[1].ts
    -- Seconds, not milliseconds (those would be 1000 times more), near
    -- os.time(): within an hour, since a VM's clock may be stepped by its
    -- time service in the middle of a run (CI saw one off by more than the
    -- second this case once allowed).
    assert.is_true(math.abs(ts - os.time()) < 3600, tostring(ts))
    assert.are.equal(ts, math.floor(ts * 1000 + 0.5) / 1000)
  end)

  it("takes the wall clock from opts.clock", function()
    local evs = write_all({ { type = "a" } }, {
      clock = function()
        return 1700000000.12345
      end,
    })
    assert.are.equal(1700000000.123, evs[1].ts)
  end)

  it("leaves ts out, and still writes the line, when opts.clock fails", function()
    local evs = write_all({ { type = "a" } }, {
      clock = function()
        error("no clock")
      end,
    })
    assert.are.equal("a", evs[1].type)
    assert.is_nil(evs[1].ts)
  end)

  it("counts t_ms from the first event, never backwards", function()
    local events = {}
    for i = 1, 200 do
      events[i] = { type = "step_start", step = i }
    end
    local evs = write_all(events)
    assert.are.equal(0, evs[1].t_ms)
    for i = 2, #evs do
      assert.is_true(evs[i].t_ms >= evs[i - 1].t_ms)
    end
  end)

  it("adds the running cost when given cost_usd", function()
    local spent = 0
    local on_event, writer = log.jsonl(path, {
      cost_usd = function()
        return spent
      end,
    })
    on_event({ type = "step_start", step = 1 })
    spent = 0.25
    on_event({ type = "sub_query", step = 1, prompt = "p", response = "r" })
    writer:close()
    local evs = decoded(path)
    assert.are.equal(0, evs[1].cost_usd)
    assert.are.equal(0.25, evs[2].cost_usd)
  end)

  it("leaves the cost out when cost_usd raises or returns no number, and writes the line", function()
    local evs = write_all({ { type = "a" } }, {
      cost_usd = function()
        error("no price list")
      end,
    })
    assert.are.equal("a", evs[1].type)
    assert.is_nil(evs[1].cost_usd)
  end)

  it("logs unknown event types as they are, nested tables too", function()
    local evs = write_all({
      { type = "from_the_future", depth = 2, list = { 1, 2, 3 }, map = { a = { b = "c" } }, flag = false,
        [7] = "numeric key" },
    })
    local ev = evs[1]
    assert.are.equal("from_the_future", ev.type)
    assert.are.equal(2, ev.depth)
    assert.are.same({ 1, 2, 3 }, ev.list)
    assert.are.same({ a = { b = "c" } }, ev.map)
    assert.is_false(ev.flag)
    assert.are.equal("numeric key", ev["7"])
  end)

  it("keeps the session's fields and its own apart: ts, t_ms and cost_usd are the writer's", function()
    local evs = write_all({ { type = "a", ts = "theirs", t_ms = "theirs", cost_usd = "theirs" } })
    assert.are.equal("number", type(evs[1].ts))
    assert.are.equal("number", type(evs[1].t_ms))
    assert.is_nil(evs[1].cost_usd)
  end)

  describe("bounds", function()
    it("cuts a long field to max_field_chars, keeping both ends, with a marker", function()
      local code = "BEGIN" .. ("x"):rep(50000) .. "END"
      local evs = write_all({ { type = "exec_result", code = code, stdout = "short" } }, { max_field_chars = 1000 })
      local got = evs[1].code
      assert.matches("^BEGIN", got)
      assert.matches("END$", got)
      assert.matches("[rlm.log truncated 49008 chars]", got, 1, true)
      assert.is_true(#got < 1100, #got)
      assert.are.equal("short", evs[1].stdout)
    end)

    it("cuts at 20000 characters by default", function()
      local evs = write_all({ { type = "sub_query", prompt = ("p"):rep(100000) } })
      local kept = select(2, evs[1].prompt:gsub("p", ""))
      assert.are.equal(20000, kept)
    end)

    it("cuts every string, in unknown events and nested tables too", function()
      local evs = write_all({ { type = "x", deep = { { s = ("y"):rep(5000) } } } }, { max_field_chars = 100 })
      assert.is_true(#evs[1].deep[1].s < 200)
    end)

    it("bounds the entries of a table and the nesting", function()
      local big, cycle = {}, {}
      for i = 1, 50 do
        big[i] = i
      end
      cycle.self = cycle
      local evs = write_all({ { type = "x", big = big, cycle = cycle } }, { max_items = 10, max_depth = 4 })
      assert.are.equal(11, #evs[1].big)
      assert.are.equal("[rlm.log truncated 40 items]", evs[1].big[11])
      assert.matches("nested too deep", evs[1].cycle.self.self.self.self)
    end)

    it("writes numbers JSON cannot carry as strings", function()
      local evs = write_all({ { type = "x", nan = 0 / 0, inf = math.huge, ninf = -math.huge, n = 1.5 } })
      assert.are.same({ "NaN", "Infinity", "-Infinity", 1.5 }, { evs[1].nan, evs[1].inf, evs[1].ninf, evs[1].n })
    end)

    it("writes what is not JSON (a function, a coroutine) as text", function()
      local evs = write_all({ { type = "x", f = print, co = coroutine.create(function() end) } })
      assert.matches("^function", evs[1].f)
      assert.matches("^thread", evs[1].co)
    end)

    it("keeps the file valid UTF-8 whatever the strings hold", function()
      write_all({ { type = "exec_result", stdout = "bad \255\254 bytes, a cut \226\130 and \237\160\128 a surrogate" },
        { type = "x", ["key \255"] = ("é"):rep(3000) .. "\240\159" } }, { max_field_chars = 100 })
      local text = read(path)
      assert.is_true(valid_utf8(text))
      local evs = decoded(path)
      assert.matches("bad \239\191\189\239\191\189 bytes", evs[1].stdout, 1, true)
    end)
  end)

  -- What sandbox code sends (a tool's args, a prompt) is bounded by the
  -- protocol at max_message_bytes, 16 MiB; what the log writes of it, and
  -- the CPU that costs the host, by the line's budget.
  describe("byte budgets", function()
    -- 800 strings of 20000 bytes that are not UTF-8: each byte would be
    -- written as U+FFFD, three bytes (48 MB for this one event, before).
    local function hostile_args()
      local s, args = ("\255"):rep(20000), {}
      for i = 1, 800 do
        args[i] = s
      end
      return args
    end

    it("cuts an event to max_event_bytes, marks the cut, and keeps its small fields", function()
      local c0 = os.clock()
      local evs = write_all({ { type = "tool_call", name = "t", index = 7, args = hostile_args(), result = "ok" } })
      local cpu = os.clock() - c0
      local line = lines(path)[1]
      print(("\n# %s: a tool_call of 16 MB of bad bytes: %d bytes of log, %.3f s of CPU")
        :format(H.lua_name(), #line, cpu))
      assert.is_true(#line <= 256 * 1024 + 1024, ("the line has %d bytes"):format(#line))
      assert.is_true(valid_utf8(line))
      local ev = evs[1]
      assert.are.equal("event", ev.log_cut)
      assert.are.same({ "t", 7, "ok" }, { ev.name, ev.index, ev.result })
      assert.matches("^%[rlm.log cut %d+ items%]$", ev.args[#ev.args])
      assert.is_true(#ev.args < 20)
      assert.is_true(cpu < 1, ("%.2f s of CPU"):format(cpu))
    end)

    it("writes an event that fits whole, with no log_cut", function()
      local evs = write_all({ { type = "x", s = ("z"):rep(5000) } }, { max_event_bytes = 6000 })
      assert.are.equal(5000, #evs[1].s)
      assert.is_nil(evs[1].log_cut)
    end)

    it("cuts an object's members too, with a marker key", function()
      local t = {}
      for i = 1, 100 do
        t[("k%03d"):format(i)] = ("v"):rep(100)
      end
      local evs = write_all({ { type = "x", t = t } }, { max_event_bytes = 2048 })
      assert.is_true(#lines(path)[1] <= 2048 + 1024)
      assert.matches("^%d+ more keys$", evs[1].t["[rlm.log cut]"])
      assert.are.equal("event", evs[1].log_cut)
    end)

    it("spends max_run_bytes over a run's lines, then writes each event's small fields", function()
      local events = { { type = "session_start", depth = 0, query = "q" } }
      for i = 1, 20 do
        events[#events + 1] = { type = "exec_result", step = i, depth = 0, code = ("c"):rep(5000) }
      end
      events[#events + 1] = { type = "run_end", depth = 0, ok = false, error_kind = "tool_error" }
      events[#events + 1] = { type = "session_start", depth = 0, query = "next run" }
      events[#events + 1] = { type = "exec_result", step = 1, depth = 0, code = ("d"):rep(5000) }
      local evs = write_all(events, { max_run_bytes = 20000 })
      local size = #read(path)
      assert.is_true(size < 20000 + 22 * 1024, ("%d bytes"):format(size))
      assert.are.equal(5000, #evs[2].code) -- within the budget
      assert.are.equal("run", evs[21].log_cut)
      assert.matches("[rlm.log truncated", evs[21].code, 1, true)
      assert.is_true(#lines(path)[21] <= 2048)
      assert.are.same({ "run_end", false, "tool_error" }, { evs[22].type, evs[22].ok, evs[22].error_kind })
      assert.is_nil(evs[22].log_cut) -- small enough to go whole
      assert.are.equal(5000, #evs[24].code) -- a new run, a new budget
      assert.is_nil(evs[24].log_cut)
    end)

    -- rlm.core's repair, one pass in C; the pure-Lua one, kept for a Lua
    -- without rlm.core, took 9.3 s (Lua 5.4) for this. The bound is 3 s:
    -- at a load of 13 the C pass read 1.0 to 1.3 s of CPU (0.3 s idle).
    it("repairs 16 MB of bad bytes in a few seconds of CPU, not the pure-Lua repair's ten", function()
      local s = ("\255"):rep(16 * 2 ^ 20)
      local c0 = os.clock()
      local got = log.truncate(s, 2 ^ 25)
      local cpu = os.clock() - c0
      print(("\n# %s: 16 MB of bad bytes repaired in %.3f s of CPU"):format(H.lua_name(), cpu))
      assert.are.equal(3 * #s, #got)
      assert.are.equal(("\239\191\189"):rep(4), got:sub(1, 12))
      assert.is_true(cpu < 3, ("%.2f s of CPU"):format(cpu))
    end)
  end)

  describe("truncate", function()
    -- { input, limit, expected }
    local cases = {
      { "short", 10, "short" },
      { "abcdefghij", 10, "abcdefghij" },
      { "abcdefghijkl", 6, "abcd\n[rlm.log truncated 6 chars]\nkl" },
      { ("é"):rep(10), 10, ("é"):rep(10) },
      { ("é"):rep(12), 6, "éééé\n[rlm.log truncated 6 chars]\néé" },
      { ("€"):rep(12), 3, "€€\n[rlm.log truncated 9 chars]\n€" },
      { "a\255b", 10, "a\239\191\189b" },
      { "\240\159\152\128", 10, "\240\159\152\128" }, -- a 4-byte character stays whole
      { "\192\128", 10, "\239\191\189\239\191\189" }, -- an overlong NUL is two bad bytes
      { "abcdefghij", 1, "a\n[rlm.log truncated 9 chars]\n" },
      { ("x"):rep(100), 2, "xx\n[rlm.log truncated 98 chars]\n" },
    }
    for _, case in ipairs(cases) do
      it(("cuts %q to %d characters"):format(case[1], case[2]), function()
        assert.are.equal(case[3], log.truncate(case[1], case[2]))
      end)
    end

    it("cuts a string of megabytes of many-byte characters on character boundaries", function()
      local s = ("日本"):rep(500000) .. "末"
      local got = log.truncate(s, 30)
      assert.is_true(valid_utf8(got))
      assert.matches("^日本日本", got)
      assert.matches("本末$", got)
      assert.matches("[rlm.log truncated 999971 chars]", got, 1, true)
    end)

    it("gives the same cuts without rlm.core (pure Lua)", function()
      -- rlm.tools.logline does the cutting, over rlm.base.text: they load
      -- again too, without core.
      local saved_core, saved_log = package.loaded["rlm.core"], package.loaded["rlm.log"]
      local saved_line, saved_text = package.loaded["rlm.tools.logline"], package.loaded["rlm.base.text"]
      package.loaded["rlm.core"], package.loaded["rlm.log"], package.loaded["rlm.tools.logline"] = nil, nil, nil
      package.loaded["rlm.base.text"] = nil
      package.preload["rlm.core"] = function()
        error("no core here")
      end
      local ok, pure = pcall(require, "rlm.log")
      package.preload["rlm.core"] = nil
      package.loaded["rlm.core"], package.loaded["rlm.log"] = saved_core, saved_log
      package.loaded["rlm.tools.logline"], package.loaded["rlm.base.text"] = saved_line, saved_text
      assert.is_true(ok, tostring(pure))
      assert.are_not.equal(log, pure)
      for _, case in ipairs(cases) do
        assert.are.equal(case[3], pure.truncate(case[1], case[2]))
      end
      local s = ("日本"):rep(50000)
      assert.are.equal(log.truncate(s, 100), pure.truncate(s, 100))
    end)
  end)

  describe("the file", function()
    it("is flushed after every line, so a crashed run keeps its log", function()
      local on_event, writer = log.jsonl(path)
      for i = 1, 3 do
        on_event({ type = "step_start", step = i })
        assert.are.equal(i, #lines(path)) -- read through another handle, before close
      end
      writer:close()
    end)

    it("is appended to by default", function()
      write_all({ { type = "first" } })
      local evs = write_all({ { type = "second" } })
      assert.are.same({ "first", "second" }, { evs[1].type, evs[2].type })
    end)

    it("is emptied first with mode = \"truncate\"", function()
      write_all({ { type = "first" } })
      local evs = write_all({ { type = "second" } }, { mode = "truncate" })
      assert.are.equal(1, #evs)
      assert.are.equal("second", evs[1].type)
    end)

    it("closes once; later events and closes do nothing", function()
      local on_event, writer = log.jsonl(path)
      on_event({ type = "a" })
      assert.is_true(writer:close())
      assert.are.equal("closed file", io.type(writer.file))
      assert.is_true(writer:close())
      on_event({ type = "b" })
      assert.are.equal(1, #lines(path))
      assert.are.equal(1, writer.lines)
    end)

    it("writes to an open handle and leaves it open", function()
      local f = assert(io.open(path, "wb"))
      local on_event, writer = log.jsonl(f)
      on_event({ type = "a" })
      writer:close()
      assert.are.equal("file", io.type(f))
      f:write("more\n")
      f:close()
      assert.are.same({ "a" }, { cjson.decode(lines(path)[1]).type })
      assert.are.equal("more", lines(path)[2])
    end)

    it("can be called through the writer too", function()
      local _, writer = log.jsonl(path)
      writer({ type = "a" })
      writer:write({ type = "b" })
      writer:close()
      assert.are.equal(2, #lines(path))
    end)

    it("returns nil and a message when the file cannot be opened", function()
      local on_event, err = log.jsonl("/nonexistent-dir/x/log.jsonl")
      assert.is_nil(on_event)
      assert.matches("nonexistent%-dir", err)
    end)

    -- A run that crashed mid-line: the next run's first line starts on
    -- its own line, not glued to the partial one.
    local partial_cases = {
      -- what the file holds, how many lines it has after one event
      { '{"type":"crashed","code":"x = ', 2 },
      { '{"type":"whole"}\n', 2 },
      { "", 1 },
    }
    for _, case in ipairs(partial_cases) do
      it(("appends to a file holding %q on a line of its own"):format(case[1]), function()
        local f = assert(io.open(path, "wb"))
        f:write(case[1])
        f:close()
        local on_event, writer = log.jsonl(path)
        on_event({ type = "next_run" })
        writer:close()
        local got = lines(path)
        assert.are.equal(case[2], #got)
        assert.are.equal("next_run", cjson.decode(got[#got]).type)
        assert.are.equal(case[2], select(2, read(path):gsub("\n", ""))) -- no blank line either
      end)
    end

    -- A full disk: a tmpfs of 64 KiB in a mount namespace of its own
    -- (unshare: as root or as a user with user namespaces), mounted on a
    -- directory this test makes; it goes with the namespace, and the
    -- directory after. Lines of 3001 bytes do not end on the tmpfs's
    -- pages, so the write that fills it leaves part of its line.
    local FULL = [=[
local log = require("rlm.log")
local cjson = require("cjson")
local dir, mode = arg[1], arg[2]
local ballast = assert(io.open(dir .. "/ballast", "wb"))
if mode == "partial" then
  assert(ballast:write(("b"):rep(16384)))
else -- all of it: the log's first write fails whole
  while ballast:write(("b"):rep(4096)) and ballast:flush() do
  end
end
ballast:close()
local path = dir .. "/run.jsonl"
local on_event, writer = assert(log.jsonl(path))
local n = 0
while writer.dropped == 0 and n < 100 do
  n = n + 1
  on_event({ type = "filler", n = n, text = ("x"):rep(2950) })
end
on_event({ type = "still_full" })
local f = assert(io.open(path, "rb"))
local held = f:read("*a")
f:close()
os.remove(dir .. "/ballast") -- space is back
for i = 1, 3 do
  on_event({ type = "after", i = i })
end
writer:close()
f = assert(io.open(path, "rb"))
local text = f:read("*a")
f:close()
local good, bad, after = 0, 0, 0
for line in text:gmatch("[^\n]*") do
  local ok, ev = pcall(cjson.decode, line)
  if ok then
    good = good + 1
    after = after + (ev.type == "after" and 1 or 0)
  elseif line ~= "" then
    bad = bad + 1
  end
end
print(("held=%d held_partial=%s lines=%d dropped=%d good=%d bad=%d after=%d first=%s blank=%s error=%s"):format(
  #held, tostring(held ~= "" and held:sub(-1) ~= "\n"), writer.lines, writer.dropped, good, bad, after,
  text:sub(1, 1), tostring(text:find("\n\n", 1, true) ~= nil), tostring(writer.error)))
]=]
    -- { what the write that fills the disk leaves, held_partial, bad lines }
    local full_cases = { { "partial", "true", "1" }, { "whole", "false", "0" } }
    for _, case in ipairs(full_cases) do
      it(("starts the next line on its own after a full disk (a %s line failed), once space is back")
        :format(case[1]), function()
        local dir = H.tmpdir .. "-full"
        local script = H.tmpdir .. "-full.lua"
        assert(H.sh("mkdir " .. dir .. " && echo made") == "made")
        local f = assert(io.open(script, "w"))
        f:write(FULL)
        f:close()
        local out = H.sh(("unshare --user --map-root-user --mount sh -c "
          .. "'mount -t tmpfs -o size=64k rlm-spec-full \"$1\" || exit 77; exec \"$2\" \"$3\" \"$1\" \"$4\"' "
          .. "sh %s %s %s %s 2>&1; echo \"status $?\""):format(dir, H.lua_name(), script, case[1]))
        os.remove(script)
        assert(H.sh("rmdir " .. dir .. " && echo removed") == "removed") -- the tmpfs went with its namespace
        print(("\n# %s: a full 64 KiB tmpfs (%s): %s"):format(H.lua_name(), case[1], out:gsub("\n", " | ")))
        if out:match("status 77$") or out:match("^unshare: ") then
          pending("no tmpfs in a mount namespace of our own here (unshare or mount failed): " .. out)
          return
        end
        assert.matches("status 0$", out)
        assert.matches("held_partial=" .. case[2], out, 1, true) -- the case this is about
        assert.matches("error=.*No space left on device", out)
        local lines_n, dropped, good, bad, after = out:match("lines=(%d+) dropped=(%d+) good=(%d+) bad=(%d+) after=(%d+)")
        assert.are.equal("2", dropped) -- the write that filled it, and the one while full
        assert.are.equal(lines_n, good) -- every line written is a line of JSON
        assert.are.equal(case[3], bad) -- the partial one, alone
        assert.are.equal("3", after)
        assert.matches("first={", out, 1, true)
        assert.matches("blank=false", out, 1, true) -- no empty line where nothing was left
      end)
    end

    it("never raises when a write fails: the first error is kept", function()
      local f = assert(io.open("/dev/null", "rb")) -- a handle that cannot be written
      local on_event, writer = log.jsonl(f)
      assert.has_no.errors(function()
        on_event({ type = "a" })
        on_event({ type = "b" })
      end)
      assert.are.equal(0, writer.lines)
      assert.are.equal(2, writer.dropped)
      assert.is_string(writer.error)
      f:close()
    end)
  end)

  describe("misuse", function()
    -- { opts or target, message }
    local cases = {
      { { bogus = 1 }, "unknown option 'bogus'" },
      { { max_item = 5 }, "unknown option 'max_item' (did you mean 'max_items'?" },
      { { mode = "w" }, "option 'mode' must be \"append\" or \"truncate\"" },
      { { mode = 1 }, "option 'mode' must be \"append\" or \"truncate\", got 1" },
      { { max_field_chars = 0 }, "option 'max_field_chars' must be an integer >= 1" },
      { { max_items = 1.5 }, "option 'max_items' must be an integer >= 1" },
      { { max_event_bytes = 1000 }, "option 'max_event_bytes' must be an integer >= 1024" },
      { { max_run_bytes = 0 }, "option 'max_run_bytes' must be an integer >= 1" },
      { { max_run_bytes = "1" }, "option 'max_run_bytes' must be an integer >= 1, got \"1\"" },
      { { cost_usd = 3 }, "option 'cost_usd' must be a function" },
      { "opts", "expected a table of options, got string" },
    }
    for _, case in ipairs(cases) do
      it("raises: " .. case[2], function()
        local ok, err = pcall(log.jsonl, path, case[1])
        assert.is_false(ok)
        assert.matches(case[2], err, 1, true)
      end)
    end

    it("raises when the target is neither a path nor a file", function()
      local ok, err = pcall(log.jsonl, 42)
      assert.is_false(ok)
      assert.matches("path_or_file must be a path or an open file, not number", err, 1, true)
    end)
  end)

  describe("with a real session", function()
    after_each(H.assert_clean)

    it("logs every event the session emits, in order", function()
      local on_event, writer = log.jsonl(path, { mode = "truncate" })
      local seen = {}
      local result, err = H.run({
        on_event = function(ev)
          seen[#seen + 1] = ev.type
          on_event(ev)
        end,
        root_llm = H.script({
          H.fence("r = llm_query('hi')\nprint(r)"),
          H.fence("raise ValueError('boom')"),
          H.fence("FINAL(r)"),
        }),
      })
      writer:close()
      assert.is_nil(err, err and tostring(err))
      assert.are.equal("echo: hi", result.answer)
      local evs = decoded(path)
      local types = {}
      for i, ev in ipairs(evs) do
        types[i] = ev.type
        if i > 1 then
          assert.is_true(ev.t_ms >= evs[i - 1].t_ms)
        end
      end
      assert.are.same(seen, types)
      local function index_of(t, from)
        for i = from or 1, #types do
          if types[i] == t then
            return i
          end
        end
      end
      local s1 = index_of("step_start")
      local sub = index_of("sub_query")
      local exec = index_of("exec_result")
      local final = index_of("final")
      assert.is_true(s1 < sub and sub < exec and exec < final)
      assert.are.equal("hi", evs[sub].prompt)
      assert.are.equal("echo: hi", evs[sub].response)
      assert.are.equal("echo: hi\n", evs[exec].stdout)
      assert.are.equal("echo: hi", evs[final].answer)
      local errors = 0
      for _, ev in ipairs(evs) do
        if ev.type == "exec_result" and ev.error then
          errors = errors + 1
          assert.matches("ValueError: boom", ev.error)
        end
      end
      assert.are.equal(1, errors)
    end)
  end)
end)
