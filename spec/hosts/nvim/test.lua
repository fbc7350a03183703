-- The Neovim host test: sessions driven by rlm.adapters.nvim inside a
-- headless editor, the way a plugin runs them. Run by spec/hosts/run:
--
--   nvim --headless --clean -u NONE -i NONE -n -c "luafile spec/hosts/nvim/test.lua"
--
-- with RLM_ROOT (the checkout), RLM_BUILD (the build directory holding
-- 5.1/rlm/core.so) and RLM_HOSTS_TMPDIR (an empty directory for the
-- workdirs). Prints one "ok - ..." or "not ok - ..." line per case, then
-- quits the editor.
-- luacheck: globals vim
local root = assert(os.getenv("RLM_ROOT"), "RLM_ROOT")
local build = os.getenv("RLM_BUILD") or (root .. "/build")
local tmpdir = assert(os.getenv("RLM_HOSTS_TMPDIR"), "RLM_HOSTS_TMPDIR")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/5.1/?.so;" .. package.cpath

local uv = vim.uv or vim.loop
local adapter = require("rlm.adapters.nvim")

local STALL_LIMIT_MS = 50
local BEAT_MS = 10
local TEST_TIMEOUT_MS = 120000

local harness = dofile(root .. "/spec/hosts/nvim/harness.lua").new("nvim", tmpdir)
local report, fence, workdirs, wait_for = harness.report, harness.fence, harness.workdirs, harness.wait_for

local function now_ms()
  return uv.hrtime() / 1e6
end

local function read_all(path)
  local f = io.open(path, "rb")
  if not f then
    return nil
  end
  local s = f:read("*a")
  f:close()
  return s
end

local my_pid = vim.fn.getpid()

-- This editor's child processes (zombies included), read without spawning.
local function children()
  local pids = {}
  local tasks = uv.fs_scandir("/proc/" .. my_pid .. "/task")
  while tasks do
    local tid = uv.fs_scandir_next(tasks)
    if not tid then
      break
    end
    for pid in (read_all("/proc/" .. my_pid .. "/task/" .. tid .. "/children") or ""):gmatch("%d+") do
      pids[#pids + 1] = pid
    end
  end
  return pids
end

-- Whether this process catches, ignores or defaults SIGCHLD (17).
local function sigchld_disposition()
  local status = read_all("/proc/self/status") or ""
  local function has(field)
    local hex = status:match(field .. ":%s*(%x+)")
    local digit = tonumber(hex:sub(-5, -5), 16) -- bits 16..19; SIGCHLD is bit 16
    return digit % 2 == 1
  end
  return has("SigCgt") and "caught" or has("SigIgn") and "ignored" or "default"
end

local cases = {}

-- 1. The issue's scenario: the root model answers after 1 s (a loop timer
-- resumes its coroutine), the REPL spins for 2 s, sub-calls answer through
-- done() and at once; a 10 ms timer keeps beating, and the host spawns its
-- own children meanwhile.
cases[#cases + 1] = function(next_case)
  local beats, last, max_gap, max_at, gaps, all_gaps = 0, nil, 0, 0, {}, {}
  local t_start = now_ms()
  local beat = uv.new_timer()
  beat:start(BEAT_MS, BEAT_MS, function()
    local t = now_ms()
    if last then
      local gap = t - last
      all_gaps[#all_gaps + 1] = gap
      if gap > max_gap then
        max_gap, max_at = gap, t - t_start
      end
      if gap > STALL_LIMIT_MS then
        gaps[#gaps + 1] = ("%.0f ms at +%.0f ms"):format(gap, t - t_start)
      end
    end
    last = t
    beats = beats + 1
  end)

  local system_checks, job_checks = {}, {}
  local function host_children(label)
    -- vim.fn.system needs an editor context: leave the timer callback.
    vim.schedule(function()
      local a = vim.fn.system("true")
      local ok_true = vim.v.shell_error == 0 and a == ""
      local b = vim.fn.system({ "sh", "-c", "echo out; exit 3" })
      local ok_three = vim.v.shell_error == 3 and b == "out\n"
      system_checks[#system_checks + 1] = { label = label, ok = ok_true and ok_three,
        detail = ("true -> %d, exit 3 -> %d with %s"):format(ok_true and 0 or -1, vim.v.shell_error,
          b:gsub("\n", "\\n")) }
      local job = vim.fn.jobstart({ "sh", "-c", "exit 5" }, {
        on_exit = function(_, code)
          job_checks[#job_checks + 1] = { label = label, code = code }
        end,
      })
      if job <= 0 then
        job_checks[#job_checks + 1] = { label = label, code = "jobstart failed: " .. job }
      end
    end)
  end
  local probes = {}
  for _, at in ipairs({ 500, 1500, 2500 }) do
    local t = uv.new_timer()
    t:start(at, 0, function()
      t:close()
      host_children(("+%d ms"):format(at))
    end)
    probes[#probes + 1] = t
  end

  local events, event_errors = 0, {}
  local buf = vim.api.nvim_create_buf(false, true)
  local sigchld_before = sigchld_disposition()
  local turn = 0
  local session = adapter.run({
    context = "the answer is in the sub-calls",
    sandbox = { tmpdir = tmpdir },
    step_timeout_ms = 30000,
    root_llm = function(_, done)
      turn = turn + 1
      if turn == 1 then
        -- Yield; a loop timer resumes this coroutine a second later.
        local co = coroutine.running()
        local t = uv.new_timer()
        t:start(1000, 0, function()
          t:close()
          coroutine.resume(co)
        end)
        coroutine.yield()
        return fence("import time\nt0 = time.time()\nspins = 0\n"
          .. "while time.time() - t0 < 2.0:\n    spins += 1\n"
          .. "r = llm_query('ping')\nparts = llm_query_batched(['a', 'b', 'c'])\nprint(r, parts)")
      end
      -- Answer through done(), from a loop timer, a second later.
      local t = uv.new_timer()
      t:start(1000, 0, function()
        t:close()
        done(fence("FINAL(r + '/' + ''.join(parts))"))
      end)
    end,
    llm_query = function(prompt, done)
      if prompt == "ping" then
        vim.defer_fn(function()
          done("pong")
        end, 100)
        return
      end
      return prompt:upper()
    end,
    on_event = function(ev)
      events = events + 1
      local ok, e = pcall(vim.api.nvim_buf_set_lines, buf, -1, -1, false, { ev.type })
      if not ok then
        event_errors[#event_errors + 1] = e
      end
    end,
  }, function(err, result)
    local elapsed = now_ms() - t_start
    beat:stop()
    beat:close()
    for _, t in ipairs(probes) do
      if not t:is_closing() then
        t:close()
      end
    end
    local answer = result and result.answer
    report(answer == "pong/ABC", "the session ends with the right answer",
      err and tostring(err) or ("%q after %.0f ms, %d iterations, %d sub-calls")
        :format(answer, elapsed, result.iterations, result.sub_calls))
    local expected_beats = elapsed / BEAT_MS
    table.sort(all_gaps)
    local p99 = all_gaps[math.max(1, math.ceil(#all_gaps * 0.99))] or 0
    report(max_gap <= STALL_LIMIT_MS and beats >= expected_beats * 0.5,
      ("the editor never stalls past %d ms"):format(STALL_LIMIT_MS),
      ("max gap between %d ms beats %.1f ms at +%.0f ms, p99 %.1f ms; %d beats in %.0f ms%s")
        :format(BEAT_MS, max_gap, max_at, p99, beats, elapsed,
          #gaps > 0 and ("; stalls: " .. table.concat(gaps, ", ")) or ""))
    local ok_final, final_err = pcall(vim.api.nvim_buf_set_lines, buf, 0, 1, false, { "final" })
    report(ok_final and #event_errors == 0 and events > 0,
      "on_event and the final callback run where editor calls work",
      ok_final and (#event_errors == 0 and (events .. " events") or event_errors[1]) or final_err)
    -- Let the last jobs report their exit.
    wait_for(function()
      return #job_checks >= #system_checks and #system_checks == 3
    end, 5000, function()
      local ok, details = #system_checks == 3, {}
      for _, c in ipairs(system_checks) do
        ok = ok and c.ok
        details[#details + 1] = c.label .. ": " .. c.detail
      end
      report(ok, "vim.fn.system works while a session runs", table.concat(details, "; "))
      ok, details = #job_checks == 3, {}
      for _, c in ipairs(job_checks) do
        ok = ok and c.code == 5
        details[#details + 1] = c.label .. ": exit " .. tostring(c.code)
      end
      report(ok, "jobstart() children report their exit code while a session runs",
        table.concat(details, "; "))
      local sigchld_after = sigchld_disposition()
      report(sigchld_after == sigchld_before, "the editor's SIGCHLD disposition is unchanged",
        sigchld_before .. " -> " .. sigchld_after)
      vim.api.nvim_buf_delete(buf, { force = true })
      wait_for(function()
        return #children() == 0 and #workdirs() == 0
      end, 5000, function(clean)
        report(clean, "no child process or workdir outlives the session",
          clean and "none" or ("children %s, workdirs %s"):format(
            table.concat(children(), " "), table.concat(workdirs(), " ")))
        next_case()
      end)
    end)
  end)
  assert(session, "run() returns the session")
end

-- 2. close() cancels a run whose root model never answers.
cases[#cases + 1] = function(next_case)
  local session
  local t0 = now_ms()
  session = adapter.run({
    context = "x",
    sandbox = { tmpdir = tmpdir },
    root_llm = function() end, -- never calls done()
    llm_query = function(p)
      return p
    end,
    on_event = function(ev)
      if ev.type == "step_start" then
        vim.defer_fn(function()
          session:close()
        end, 100)
      end
    end,
  }, function(err, result)
    report(result == nil and err ~= nil and err.kind == "cancelled",
      "session:close() cancels the run", err and ("%s after %.0f ms"):format(err.kind, now_ms() - t0)
        or "it finished")
    wait_for(function()
      return #children() == 0 and #workdirs() == 0
    end, 5000, function(clean)
      report(clean, "a cancelled session leaves no child process or workdir",
        clean and "none" or table.concat(children(), " ") .. " / " .. table.concat(workdirs(), " "))
      next_case()
    end)
  end)
end

-- 3. The example plugin: :RlmAsk over the current buffer, with stand-in
-- models (the example's own models call an HTTP endpoint through curl).
cases[#cases + 1] = function(next_case)
  -- Installed the way a plugin manager would: on the runtimepath.
  vim.opt.runtimepath:append(root .. "/examples/nvim")
  vim.cmd("runtime plugin/rlm_ask.lua")
  local plugin = require("rlm_ask")
  plugin.setup({
    sandbox = { tmpdir = tmpdir },
    root_llm = function(messages, done)
      vim.defer_fn(function()
        if #messages == 2 then
          done(fence("n = sum(1 for line in context.splitlines() if 'ERROR' in line)\n"
            .. "FINAL(str(n) + ' errors')"))
        end
      end, 50)
    end,
    llm_query = function(p)
      return p
    end,
    on_event = function(ev)
      plugin.events = (plugin.events or 0) + 1
      assert(ev.type)
    end,
  })
  vim.api.nvim_buf_set_lines(0, 0, -1, false, { "ok", "ERROR one", "fine", "ERROR two", "ERROR three" })
  vim.cmd("RlmAsk how many errors?")
  wait_for(function()
    return plugin.last_answer ~= nil or plugin.last_error ~= nil
  end, 30000, function()
    local shown = vim.fn.bufexists("rlm://answer") == 1
      and table.concat(vim.fn.getbufline(vim.fn.bufnr("rlm://answer"), 1, "$"), "\n") or ""
    report(plugin.last_answer == "3 errors" and shown:find("3 errors", 1, true) ~= nil,
      ":RlmAsk answers about the current buffer", plugin.last_error and tostring(plugin.last_error)
        or ("%q; answer buffer %q"):format(tostring(plugin.last_answer), shown))
    next_case()
  end)
end

-- Starts spec/helpers/fake_openai.py and, once it says its port, calls
-- k(base, server) (base: "http://127.0.0.1:<port>"; the caller stops the
-- server). If it never does, reports case as failed and goes on.
local function with_stand_in(case, next_case, k)
  local port
  local server = vim.fn.jobstart({ "python3", root .. "/spec/helpers/fake_openai.py" }, {
    on_stdout = function(_, data)
      port = port or tonumber((data[1] or ""):match("^(%d+)"))
    end,
  })
  wait_for(function()
    return port ~= nil
  end, 10000, function()
    if not port then
      vim.fn.jobstop(server)
      report(false, case, "the stand-in server did not start")
      return next_case()
    end
    k(("http://127.0.0.1:%d"):format(port), server)
  end)
end

-- 4. The example plugin's own models: rlm.llm.openai over
-- rlm.llm.transport.nvim (curl through jobstart()) against a stand-in OpenAI
-- server: the key on curl's stdin, never its argv; a 429 waited out on a
-- timer; the usage counted.
cases[#cases + 1] = function(next_case)
  local plugin = require("rlm_ask")
  with_stand_in(":RlmAsk with the plugin's curl models", next_case, function(base, server)
    local function control(path, body)
      local argv = { "curl", "-sS", base .. path }
      if body then
        vim.list_extend(argv, { "--data-binary", vim.json.encode(body) })
      end
      return vim.json.decode(vim.fn.system(argv))
    end
    control("/_control/script", { replies = {
      { content = fence("r = llm_query('shout: ' + context.split()[0])\nFINAL(r)"), usage = { 50, 10 } },
      { status = 429, headers = { ["retry-after-ms"] = "200" }, json = { error = { message = "slow down" } } },
      { content = "HELLO", usage = { 5, 1 }, delay_ms = 100 },
    } })
    local secret = "sk-rlm-nvim-" .. my_pid
    -- The settings every host reads (rlm.llm.settings), exported as for
    -- bin/rlm: setup() names no model.
    vim.env.RLM_BASE_URL, vim.env.OPENAI_API_KEY = base .. "/v1", secret
    vim.env.RLM_MODEL, vim.env.RLM_SUB_MODEL = "root-model", "sub-model"
    plugin.setup({ sandbox = { tmpdir = tmpdir }, on_event = function() end })
    vim.api.nvim_buf_set_lines(0, 0, -1, false, { "hello world" })
    vim.cmd("RlmAsk what does it say?")
    wait_for(function()
      return plugin.last_answer ~= nil or plugin.last_error ~= nil
    end, 30000, function()
      local reqs = control("/_control/requests")
      local models, auth, leaked = {}, true, false
      for _, r in ipairs(reqs) do
        models[#models + 1] = type(r.json) == "table" and r.json.model or "?"
        auth = auth and r.headers.authorization == "Bearer " .. secret
        leaked = leaked or (type(r.argv_hits) == "table" and #r.argv_hits > 0)
      end
      vim.fn.jobstop(server)
      local usage = plugin.client and plugin.client.usage() or {}
      report(plugin.last_answer == "HELLO" and table.concat(models, ",") == "root-model,sub-model,sub-model"
        and auth and not leaked and usage.input_tokens == 55 and usage.output_tokens == 11,
        ":RlmAsk with the plugin's models (rlm.llm.openai over curl)",
        plugin.last_error and tostring(plugin.last_error)
          or ("%q; models %s; key in the header only: %s; tokens %s in, %s out"):format(
            tostring(plugin.last_answer), table.concat(models, ","), tostring(auth and not leaked),
            tostring(usage.input_tokens), tostring(usage.output_tokens)))
      next_case()
    end)
  end)
end

-- 4b. A curl that is not there (Debian 12's standard system has none): the
-- request fails with one line that names it and the fix, not jobstart's
-- E475 raised with a traceback; both kinds of request (plain, streamed).
cases[#cases + 1] = function(next_case)
  local transport = require("rlm.llm.transport.nvim").new({ curl = "/nonexistent/rlm-curl" })
  local said = {}
  for _, stream in ipairs({ false, true }) do
    local co = coroutine.create(function()
      return transport({ url = "http://127.0.0.1:9/v1/chat/completions", method = "POST", body = "{}",
        headers = { ["content-type"] = "application/json" }, on_chunk = stream and function() end or nil })
    end)
    local ok, status, msg = coroutine.resume(co)
    said[#said + 1] = { ok = ok and status == nil and type(msg) == "string"
      and msg:find("/nonexistent/rlm-curl is not installed", 1, true) ~= nil and not msg:find("\n"),
      text = tostring(ok) .. " " .. tostring(status) .. " " .. tostring(msg) }
  end
  report(said[1].ok and said[2].ok, "a missing curl fails the request in one line that names it",
    said[1].text .. " | " .. said[2].text)
  next_case()
end

-- 4c. The plugin with provider = "openai", "anthropic" and "gemini", stream
-- = true: rlm.llm.openai, .anthropic and .gemini over curl, each request in
-- its API's shape with the key in its header (curl's stdin, never its argv),
-- the root model's text coming as root_delta events (curl -N), a 429
-- waited out.
for _, p in ipairs({
  { provider = "openai", env = "OPENAI_API_KEY", header = "authorization", prefix = "Bearer ", base = "/v1",
    path = "/v1/chat/completions" },
  { provider = "anthropic", env = "ANTHROPIC_API_KEY", header = "x-api-key", base = "",
    path = "/v1/messages" },
  { provider = "gemini", env = "GEMINI_API_KEY", header = "x-goog-api-key", base = "/v1beta",
    path = "/v1beta/models/root-model:streamGenerateContent?alt=sse" },
}) do
  cases[#cases + 1] = function(next_case)
    local plugin = require("rlm_ask")
    local name = (":RlmAsk with provider = %q, streamed, over curl"):format(p.provider)
    with_stand_in(name, next_case, function(base, server)
      local function control(path, body)
        local argv = { "curl", "-sS", base .. path }
        if body then
          vim.list_extend(argv, { "--data-binary", vim.json.encode(body) })
        end
        return vim.json.decode(vim.fn.system(argv))
      end
      local code = fence("r = llm_query('shout: ' + context.split()[0])\nFINAL(r)")
      control("/_control/script", { replies = {
        { content = code, pieces = { code:sub(1, 10), code:sub(11, 30), code:sub(31) }, usage = { 50, 10 },
          event_delay_ms = 20 },
        { status = 429, headers = { ["retry-after-ms"] = "200" }, json = { error = { message = "slow down" } } },
        { content = "HELLO", usage = { 5, 1 } },
      } })
      local secret = "sk-rlm-nvim-" .. p.provider .. "-" .. my_pid
      vim.env[p.env] = secret
      vim.env.RLM_MODEL, vim.env.RLM_SUB_MODEL = "root-model", "sub-model"
      local deltas = {}
      plugin.last_answer, plugin.last_error = nil, nil
      plugin.setup({ provider = p.provider, stream = true, base_url = base .. p.base, sandbox = { tmpdir = tmpdir },
        on_event = function(ev)
          if ev.type == "root_delta" then
            deltas[#deltas + 1] = ev.text
          end
        end })
      vim.api.nvim_buf_set_lines(0, 0, -1, false, { "hello world" })
      vim.cmd("RlmAsk what does it say?")
      wait_for(function()
        return plugin.last_answer ~= nil or plugin.last_error ~= nil
      end, 30000, function()
        local reqs = control("/_control/requests")
        local keyed, leaked = #reqs == 3, false
        for _, r in ipairs(reqs) do
          keyed = keyed and r.headers[p.header] == (p.prefix or "") .. secret
            and (p.header == "authorization" or r.headers.authorization == nil)
          leaked = leaked or (type(r.argv_hits) == "table" and #r.argv_hits > 0)
        end
        vim.fn.jobstop(server)
        vim.env[p.env] = nil
        local usage = plugin.client and plugin.client.usage() or {}
        report(plugin.last_answer == "HELLO" and reqs[1] and reqs[1].path == p.path and keyed and not leaked
          and table.concat(deltas) == code and #deltas == 3 and usage.input_tokens == 55,
          name, plugin.last_error and tostring(plugin.last_error)
            or ("%q; first path %s; key in its header only: %s; deltas %d (%q); tokens in %s"):format(
              tostring(plugin.last_answer), reqs[1] and reqs[1].path or "none", tostring(keyed and not leaked),
              #deltas, table.concat(deltas), tostring(usage.input_tokens)))
        plugin.setup({})
        next_case()
      end)
    end)
  end
end

-- 4b. :RlmCancel while the plugin's root model call is in flight (a reply
-- the stand-in server holds for 5 s): the session ends and its curl is gone
-- within 0.5 s, not at the reply's end.
cases[#cases + 1] = function(next_case)
  local plugin = require("rlm_ask")
  local function curls()
    local n = 0
    for _, pid in ipairs(children()) do
      if (read_all("/proc/" .. pid .. "/comm") or ""):match("^curl") then
        n = n + 1
      end
    end
    return n
  end
  with_stand_in(":RlmCancel ends the model call in flight", next_case, function(base, server)
    vim.fn.system({ "curl", "-sS", base .. "/_control/script", "--data-binary",
      vim.json.encode({ replies = { { content = fence("FINAL('late')"), delay_ms = 5000 } } }) })
    vim.env.RLM_BASE_URL, vim.env.OPENAI_API_KEY = base .. "/v1", "sk-rlm-nvim-cancel"
    vim.env.RLM_MODEL = "root-model"
    plugin.last_answer, plugin.last_error = nil, nil
    plugin.setup({ sandbox = { tmpdir = tmpdir }, on_event = function() end })
    vim.cmd("RlmAsk what does it say?")
    wait_for(function()
      return curls() > 0
    end, 10000, function()
      local before = curls()
      local t0 = now_ms()
      local notify = vim.notify
      vim.notify = function() end -- its "rlm: cancelled" would land on the report's line
      vim.cmd("RlmCancel")
      vim.notify = notify
      wait_for(function()
        return curls() == 0
      end, 3000, function()
        local ms = now_ms() - t0
        vim.fn.jobstop(server)
        report(before > 0 and curls() == 0 and ms < 500 and plugin.last_answer == nil,
          ":RlmCancel ends the model call in flight (its curl gone within 0.5 s)",
          ("%d curl before, %d after %.0f ms; answer %s"):format(before, curls(), ms, tostring(plugin.last_answer)))
        next_case()
      end)
    end)
  end)
end

-- 4d. Without a model (no RLM_MODEL, none in setup()), :RlmAsk says so in
-- one line through vim.notify and starts nothing; an old name still set
-- (RLM_ROOT_MODEL, no longer read) is named in that line. One row a case:
-- the environment, the line.
cases[#cases + 1] = function(next_case)
  local plugin = require("rlm_ask")
  local rows = {
    { {}, "rlm: no model: give setup({ model = ... }) or set RLM_MODEL" },
    { { RLM_ROOT_MODEL = "gpt-4o" },
      "rlm: no model: give setup({ model = ... }) or set RLM_MODEL (RLM_ROOT_MODEL is no longer read)" },
  }
  local said, ok = {}, true
  for _, row in ipairs(rows) do
    vim.env.RLM_MODEL, vim.env.RLM_ROOT_MODEL = nil, nil
    for k, v in pairs(row[1]) do
      vim.env[k] = v
    end
    local notes = {}
    local notify = vim.notify
    vim.notify = function(msg, level)
      notes[#notes + 1] = { msg = msg, level = level }
    end
    plugin.last_answer, plugin.last_error = nil, nil
    plugin.setup({ sandbox = { tmpdir = tmpdir } })
    vim.cmd("RlmAsk what does it say?")
    vim.notify = notify
    -- the line itself, or (wider than the message area, which would
    -- stop the editor at a hit-enter prompt) its start, whole in rlm://answer
    local line = notes[1] and tostring(notes[1].msg) or ""
    local buf = vim.fn.bufnr("rlm://answer")
    local whole = buf >= 0 and table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), "\n")
    said[#said + 1] = ("%q (rlm://answer: %q)"):format(line, tostring(whole))
    local cut = line:match("^(.*)%.%.%. %(rlm://answer%)$")
    ok = ok and #notes == 1 and whole == row[2] and (line == row[2] or cut and row[2]:sub(1, #cut) == cut)
      and vim.fn.strdisplaywidth(line) < vim.v.echospace and notes[1].level == vim.log.levels.ERROR
      and plugin.session == nil and #workdirs() == 0
  end
  vim.env.RLM_ROOT_MODEL = nil
  report(ok, ":RlmAsk without a model says so in one line and starts nothing", table.concat(said, "; "))
  next_case()
end

-- 5. Host tools under the Neovim adapter: a tool that answers later
-- (done() from vim.defer_fn), one that fails later, and rlm.nvim's
-- read_buffer, which reads another buffer by name through the editor's API.
cases[#cases + 1] = function(next_case)
  local notes = vim.api.nvim_create_buf(true, false)
  vim.api.nvim_buf_set_name(notes, tmpdir .. "-notes/notes.txt")
  vim.api.nvim_buf_set_lines(notes, 0, -1, false, { "alpha", "beta" })
  local tools = {}
  for k, v in pairs(require("rlm.nvim").buffer_tools) do
    tools[k] = v
  end
  tools.later = { async = true, call = function(done, n)
    vim.defer_fn(function()
      done(n * 2)
    end, 50)
  end }
  tools.fails_later = { async = true, call = function(done)
    vim.defer_fn(function()
      done(nil, "the index is busy")
    end, 20)
  end }
  adapter.run({
    context = "x",
    sandbox = { tmpdir = tmpdir },
    tools = tools,
    root_llm = function(_, done)
      vim.defer_fn(function()
        done(fence("try:\n    fails_later()\nexcept ToolError as e:\n    print(e)\n"
          .. "try:\n    read_buffer('nope.txt')\nexcept ToolError as e:\n    print(e)\n"
          .. "FINAL(str(later(21)) + ' ' + read_buffer('notes.txt').replace(chr(10), ','))"))
      end, 20)
    end,
    llm_query = function(p)
      return p
    end,
  }, function(err, result)
    local out = result and result.history[1].stdout or ""
    report(result ~= nil and result.answer == "42 alpha,beta"
      and out:find("fails_later: the index is busy", 1, true) ~= nil
      and out:find('no open buffer is named "nope.txt"', 1, true) ~= nil,
      "host tools answer later under the nvim adapter, and read_buffer reads another buffer",
      err and tostring(err) or ("%q; %q"):format(result.answer, out))
    vim.api.nvim_buf_delete(notes, { force = true })
    next_case()
  end)
end

harness.run(cases, TEST_TIMEOUT_MS)
