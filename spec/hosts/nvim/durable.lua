-- The Neovim plugin's journal: a run in one editor, the editor killed
-- (SIGKILL) while a sub-call is out at the model server, then :RlmResume
-- in a new editor goes on with it. Run by spec/hosts/run:
--
--   nvim --headless --clean -u NONE -i NONE -n -c "luafile spec/hosts/nvim/durable.lua"
--
-- with RLM_ROOT, RLM_BUILD and RLM_HOSTS_TMPDIR (an empty directory of the
-- run's). The editors it starts (durable_child.lua) share a state
-- directory under it (XDG_STATE_HOME), their models the stand-in server
-- (spec/helpers/fake_openai.py). Prints one "ok - ..." or "not ok - ..."
-- line per case, then quits.
-- luacheck: globals vim
local root = assert(os.getenv("RLM_ROOT"), "RLM_ROOT")
local build = os.getenv("RLM_BUILD") or (root .. "/build")
local tmpdir = assert(os.getenv("RLM_HOSTS_TMPDIR"), "RLM_HOSTS_TMPDIR")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/5.1/?.so;" .. package.cpath
local uv = vim.uv or vim.loop

local RESUME_TIMEOUT_MS = 120000 -- how long :RlmResume is tried again while the run is held
-- The killed editor's lease is let go by the resuming one (its owner names
-- a pid of this machine that is gone), not waited out (its ttl, 30 s): the
-- answer comes well within this, however loaded the machine.
local RESUMED_WITHIN_MS = 15000
local TEST_TIMEOUT_MS = 200000

local harness = dofile(root .. "/spec/hosts/nvim/harness.lua").new("nvim-durable", tmpdir)
local report, fence, wait_for = harness.report, harness.fence, harness.wait_for

local state = tmpdir .. "/state"
local sessions = tmpdir .. "/sessions"
vim.fn.mkdir(state, "p")
vim.fn.mkdir(sessions, "p")
local journal_dir = state .. "/nvim/rlm-journal"

local function read_lines(path)
  local f = io.open(path)
  if not f then
    return {}
  end
  local t = {}
  for line in f:lines() do
    local what, text = line:match("^(%S+) (.*)$")
    t[what or line] = text
  end
  f:close()
  return t
end

local function comm(pid)
  local f = io.open("/proc/" .. pid .. "/comm")
  local name = f and f:read("*l") or "?"
  if f then
    f:close()
  end
  return name
end

-- Every process below pid (the sandbox's bwrap and python below an editor);
-- not the model call's curl, which goes when the server answers.
local function descendants(pid)
  local out, todo = {}, { pid }
  while #todo > 0 do
    local p = table.remove(todo)
    for _, tid in ipairs(vim.fn.readdir("/proc/" .. p .. "/task")) do
      local f = io.open(("/proc/%d/task/%s/children"):format(p, tid))
      if f then
        for kid in f:read("*a"):gmatch("%d+") do
          if comm(kid) ~= "curl" then
            out[#out + 1] = tonumber(kid)
          end
          todo[#todo + 1] = tonumber(kid)
        end
        f:close()
      end
    end
  end
  return out
end

local function alive(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then
    return false
  end
  local st = f:read("*a"):match("%) (%a)")
  f:close()
  return st ~= "Z"
end

local cases = {}

cases[#cases + 1] = function(next_case)
  local name = "an editor killed mid-run (SIGKILL, a sub-call out): :RlmResume in a new editor answers"
  local port
  local server = vim.fn.jobstart({ "python3", root .. "/spec/helpers/fake_openai.py" }, {
    on_stdout = function(_, data)
      port = port or tonumber((data[1] or ""):match("^(%d+)"))
    end,
  })
  local function control(path, body)
    local argv = { "curl", "-sS", ("http://127.0.0.1:%d%s"):format(port, path) }
    if body then
      vim.list_extend(argv, { "--data-binary", vim.fn.json_encode(body) })
    end
    return vim.fn.json_decode(vim.fn.system(argv))
  end
  -- What each request asked: its last message and how many there were.
  local function asked()
    local t = {}
    for _, r in ipairs(control("/_control/requests")) do
      local msgs = type(r.json) == "table" and r.json.messages or { {} }
      t[#t + 1] = vim.fn.json_encode(msgs[#msgs].content):sub(1, 80) .. " #" .. #msgs
    end
    return t
  end
  local function child(mode, out)
    local env = {
      RLM_ROOT = root, RLM_BUILD = build, XDG_STATE_HOME = state, RLM_CHILD_MODE = mode, RLM_CHILD_OUT = out,
      RLM_CHILD_TMPDIR = sessions, RLM_BASE_URL = ("http://127.0.0.1:%d/v1"):format(port),
      RLM_MODEL = "root-model", RLM_SUB_MODEL = "sub-model", OPENAI_API_KEY = "sk-nvim-durable",
      HOME = os.getenv("HOME"), PATH = os.getenv("PATH"),
    }
    local exited = false
    local job = vim.fn.jobstart({ "nvim", "--headless", "--clean", "-u", "NONE", "-i", "NONE", "-n",
      "-c", "luafile " .. root .. "/spec/hosts/nvim/durable_child.lua" }, {
      env = env, clear_env = true,
      on_exit = function()
        exited = true
      end,
    })
    return job, function()
      return exited
    end
  end
  wait_for(function()
    return port ~= nil
  end, 10000, function()
    if not port then
      vim.fn.jobstop(server)
      report(false, name, "the stand-in server did not start")
      return next_case()
    end
    local function root_reply(code)
      return { content = fence(code), usage = { 100, 20 } }
    end
    control("/_control/script", { replies = {
      root_reply("n = sum(1 for l in context.splitlines() if 'ERROR' in l)\n"
        .. "a = llm_query('first')\nb = llm_query('second')\nc = llm_query('third, slow')\nprint(a, b, c)"),
      { content = "A", usage = { 5, 1 } }, { content = "B", usage = { 5, 1 } },
      { content = "C", usage = { 5, 1 }, delay_ms = 60000 }, -- out when the editor is killed
      { content = "C", usage = { 5, 1 } },
      root_reply("FINAL(a + '-' + b + '-' + c + ' ' + str(n))"),
    } })
    local first = tmpdir .. "/first.out"
    local job = child("ask", first)
    local pid = vim.fn.jobpid(job)
    local function kill_and_resume()
      local before = asked()
      local sandbox = descendants(pid)
      local id = read_lines(first).id
      uv.kill(pid, "sigkill")
      local t_kill = uv.hrtime()
      local mode = vim.loop.fs_stat(journal_dir)
      local tries, got, held = 0, {}, nil
      local function resume()
        tries = tries + 1
        local out = ("%s/resume-%d.out"):format(tmpdir, tries)
        local _, exited = child("resume", out)
        wait_for(exited, 60000, function()
          got = read_lines(out)
          local waited = (uv.hrtime() - t_kill) / 1e6
          if got.error and got.error:find("lease_held", 1, true) and waited < RESUME_TIMEOUT_MS then
            held = held or got.error
            return vim.defer_fn(resume, 2000)
          end
          local after = {}
          for i = #before + 1, #asked() do
            after[#after + 1] = asked()[i]
          end
          local twice = {}
          for _, a in ipairs(after) do
            for i = 1, 3 do -- the root call and the two sub-calls answered before the kill
              if a == before[i] then
                twice[#twice + 1] = a
              end
            end
          end
          report(#before == 4 and id ~= nil and got.answer == "A-B-C 2", name,
            ("run %s killed after %d requests; resumed after %.1f s and %d tries (%s): %s"):format(
              tostring(id), #before, waited / 1000, tries, tostring(held), got.answer or tostring(got.error)))
          report(got.answer ~= nil and tries == 1 and waited < RESUMED_WITHIN_MS,
            ("the killed editor's lease is let go at once: the first :RlmResume answers, within %d s of the kill "
              .. "(not after its 30 s ttl)"):format(RESUMED_WITHIN_MS / 1000),
            ("%d tries, the first refused with %s; the answer %.1f s after the kill"):format(tries, tostring(held),
              waited / 1000))
          report(#before == 4 and #after > 0 and #twice == 0 and after[1] == before[4],
            "no request whose answer had been recorded is made again (only the sub-call in flight at the kill)",
            ("before the kill %s; after %s"):format(table.concat(before, ", "), table.concat(after, ", ")))
          local left = {}
          for _, p in ipairs(sandbox) do
            if alive(p) then
              left[#left + 1] = p
            end
          end
          local entries = {}
          for _, e in ipairs(vim.fn.readdir(journal_dir)) do
            if e ~= ".lock" then
              entries[#entries + 1] = e
            end
          end
          report(mode ~= nil and mode.mode % 512 == 448 and #sandbox > 0 and #left == 0 and #entries == 0,
            "the journal is stdpath('state')/rlm-journal, 0700; the killed editor's sandbox is gone; the finished "
              .. "run's entries are deleted",
            ("mode %s; %d sandbox processes, %d left; entries left: %s"):format(
              mode and ("%o"):format(mode.mode % 4096) or "none", #sandbox, #left,
              #entries > 0 and table.concat(entries, ", ") or "none"))
          -- Nothing left to resume: one line saying so.
          local after_out = tmpdir .. "/resume-after.out"
          local _, after_exited = child("resume", after_out)
          wait_for(after_exited, 60000, function()
            local line = read_lines(after_out).error or ""
            report(line == "rlm: no run to resume in " .. journal_dir,
              ":RlmResume with no run left says so in one line", line)
            vim.fn.jobstop(server)
            next_case()
          end)
        end)
      end
      resume()
    end
    wait_for(function()
      return #asked() >= 4
    end, 60000, function()
      -- While the editor lives, another's :RlmResume is refused with one
      -- line naming it (its pid lives with the start time its name says).
      local live_out = tmpdir .. "/resume-live.out"
      local _, live_exited = child("resume", live_out)
      wait_for(live_exited, 60000, function()
        local line = read_lines(live_out).error or ""
        report(line:find(("^rlm: lease_held: nvim pid %d on %%S+ %%(boot %%x+, start %%d+%%) holds it[^;]*; "
          .. ":RlmResume later$"):format(pid)) ~= nil and #asked() == 4,
          ":RlmResume while the editor running the run lives: refused, one line naming it", line)
        kill_and_resume()
      end)
    end)
  end)
end

harness.run(cases, TEST_TIMEOUT_MS)
