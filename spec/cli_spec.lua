-- bin/rlm as a real process, under the Lua being tested, against the fake
-- OpenAI-compatible server (spec/helpers/fake_openai.py).
local H = require("helpers")
local F = require("helpers.fake_openai")
local errors = require("rlm.base.errors")
local cjson = require("cjson")
local socket = require("socket")
local util = require("rlm.base.util")

local root = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/[^/]*$") or "."
local BIN = root .. "/bin/rlm"
local LUA = os.getenv("RLM_SPEC_LUA") or "lua5.4"
local secret = assert(os.getenv("RLM_SPEC_SECRET"), "spec/run sets RLM_SPEC_SECRET")

local srv

local q = util.shell_quote

local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- Runs argv with one of its descriptors (argv[1]: 1, stdout, or 2,
-- stderr) on a pseudo-terminal, copying what the terminal shows to that
-- descriptor of ours; the other two stay as they were. Exits as argv did.
local PTY_RUN = [[
import os, pty, sys
on_tty = int(sys.argv[1])
saved = {n: os.dup(n) for n in (0, 1, 2) if n != on_tty}
pid, fd = pty.fork()
if pid == 0:
    for n, d in saved.items():
        os.dup2(d, n)
    os.execvp(sys.argv[2], sys.argv[2:])
shown = b""
while True:
    try:
        chunk = os.read(fd, 65536)
    except OSError:  # EIO: the terminal's last writer has gone
        break
    if not chunk:
        break
    shown += chunk
os.write(on_tty, shown)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
]]

-- Runs bin/rlm with args (a list, quoted here); opts.stdin feeds it,
-- opts.env is a list of NAME=value set for it, opts.endpoint = false leaves
-- out the --base-url/--model/--api-key-env the other runs get, opts.tty puts
-- its stdout on a pseudo-terminal, opts.tty_err its stderr, opts.together
-- writes both to one file (returned as stdout), in the order written.
-- Returns code, stdout, stderr.
local function rlm(args, opts)
  opts = opts or {}
  local words = {}
  if opts.endpoint ~= false then
    words = { "--base-url", srv.url, "--model", "fake-root", "--sub-model", "fake-sub",
      "--api-key-env", "RLM_SPEC_SECRET" }
  end
  for _, a in ipairs(args) do
    words[#words + 1] = a
  end
  for i, w in ipairs(words) do
    words[i] = q(w)
  end
  local out, err = os.tmpname(), os.tmpname()
  local env = { "env", "-u", "RLM_BASE_URL", "-u", "RLM_MODEL", "-u", "RLM_SUB_MODEL", "-u", "RLM_API_KEY_ENV",
    "-u", "RLM_PROVIDER", "-u", "OPENAI_API_KEY", "-u", "ANTHROPIC_API_KEY", "-u", "GEMINI_API_KEY",
    "-u", "RLM_ROOT_MODEL", "-u", "RLM_API_KEY", "TMPDIR=" .. H.tmpdir }
  for _, e in ipairs(opts.env or {}) do
    env[#env + 1] = q(e)
  end
  -- Debian's python3 by its path: a python3 first on PATH may be a shell
  -- script (pyenv's shim), whose shell would write LeakSanitizer's report
  -- into the stderr read here under make check's preloaded ASan.
  local runner = (opts.tty or opts.tty_err) and ("/usr/bin/python3 -c %s %d "):format(q(PTY_RUN), opts.tty and 1 or 2)
    or ""
  local cmd = ("%s %s%s %s %s >%s 2>%s"):format(table.concat(env, " "), runner, LUA, BIN, table.concat(words, " "),
    out, opts.together and "&1" or err)
  if opts.stdin then
    cmd = "printf '%s' " .. q(opts.stdin) .. " | " .. cmd
  else
    cmd = cmd .. " </dev/null"
  end
  local p = assert(io.popen(cmd .. "; echo $?"))
  local code = tonumber(p:read("*a"))
  p:close()
  local stdout, stderr = slurp(out), slurp(err)
  os.remove(out)
  os.remove(err)
  return code, stdout, stderr
end

local context_file

local function final_run(code)
  srv:script({ { content = F.fence(code), usage = { 10, 5 } } })
end

describe("bin/rlm", function()
  setup(function()
    srv = F.start()
    context_file = os.tmpname()
    local f = assert(io.open(context_file, "wb"))
    f:write("line one\nthe code is 7731\nline three\n")
    f:close()
  end)

  teardown(function()
    srv:stop()
    os.remove(context_file)
  end)

  after_each(function()
    assert.are.same({ srv.pid }, H.settled_children(1))
    assert.are.same({}, H.workdirs())
  end)

  describe("--help", function()
    it("documents every flag and exits 0", function()
      local code, out = rlm({ "--help" }, { endpoint = false })
      assert.are.equal(0, code)
      assert.matches("Usage: rlm %[options%] %-%-context FILE", out)
      for _, flag in ipairs({ "--context", "--base-url", "--model", "--sub-model", "--api-key-env", "--max-iterations",
        "--step-timeout-ms", "--max-sub-calls", "--max-cost-usd", "--max-depth", "--max-wall-ms", "--trace",
        "--log", "--verbatim", "--quiet", "rlm view", "--journal DIR", "--resume ID",
        "RLM_BASE_URL", "RLM_MODEL", "RLM_SUB_MODEL", "RLM_API_KEY_ENV", "OPENAI_API_KEY" }) do
        assert.is_truthy(out:find(flag, 1, true), flag .. " is not in --help")
      end
    end)

    -- docs/api.md: step_timeout_ms counts the code and its sub-calls, not the
    -- root model's reply (--help said "model calls included").
    it("says what the step timeout counts, as docs/api.md does", function()
      local _, out = rlm({ "--help" }, { endpoint = false })
      local line = out:match("%-%-step%-timeout%-ms N[^\n]*\n[^\n]*")
      assert.matches("one step's code and the sub%-calls it makes, not the%s+root model's reply", line)
      assert.is_nil(out:find("model calls included", 1, true))
      assert.matches("every sub%-call it makes %(not the root model's reply", slurp(root .. "/docs/api.md"))
    end)

    it("lists one distinct exit status per error kind, as docs/cli.md does", function()
      local _, out = rlm({ "--help" }, { endpoint = false })
      local function codes(text)
        local seen = {}
        for n, kind in text:gmatch("\n%s*|?%s*`?(%d+)`?%s*|?%s*`?([%l_]+)`?") do
          if errors.kinds[kind] then
            seen[kind] = tonumber(n)
          end
        end
        return seen
      end
      local help, doc = codes(out), codes(slurp(root .. "/docs/cli.md"))
      local used = {}
      for kind in pairs(errors.kinds) do
        assert.is_number(help[kind], kind .. " has no exit status in --help")
        assert.is_nil(used[help[kind]], "exit status " .. tostring(help[kind]) .. " is used twice")
        assert.is_true(help[kind] > 2)
        used[help[kind]] = kind
      end
      assert.are.same(help, doc)
    end)
  end)

  describe("a usage error exits 2", function()
    -- one row a case: args, run options, what stderr says (plain text)
    local cases = {
      { {}, {}, "no QUESTION given" },
      { { "--context", "CTX" }, {}, "no QUESTION given" },
      { { "what?" }, {}, "no --context FILE given" },
      { { "--context", "CTX", "a", "b" }, {}, "one QUESTION only" },
      { { "--api-key", "sk-oops", "--context", "CTX", "q" }, {}, "unknown flag --api-key: the key is never a flag" },
      { { "-x", "--context", "CTX", "q" }, {}, "unknown flag -x" },
      { { "--max-iterations", "many", "--context", "CTX", "q" }, {}, "--max-iterations wants a number" },
      { { "--max-sub-calls", "1.5", "--context", "CTX", "q" }, {}, "--max-sub-calls wants an integer" },
      { { "--max-iterations", "0", "--context", "CTX", "q" }, {}, "--max-iterations must be an integer from 1 to 1000000, got 0\n" },
      { { "--temperature", "5", "--context", "CTX", "q" }, {}, "--temperature must be a number from 0 to 2, got 5\n" },
      { { "--max-cost-usd=-1", "--price", "fake-root=1:1", "--price", "fake-sub=1:1", "--context", "CTX", "q" }, {},
        "--max-cost-usd must be a number >= 0, got -1\n" },
      { { "--max-iteration", "5", "--context", "CTX", "q" }, {}, "unknown flag --max-iteration; did you mean --max-iterations?" },
      { { "--contxt", "CTX", "q" }, {}, "unknown flag --contxt; did you mean --context?" },
      { { "--context-file", "CTX", "q" }, {}, "unknown flag --context-file; did you mean --context?" },
      { { "-model", "m", "--context", "CTX", "q" }, {}, "unknown flag -model; did you mean --model?" },
      { { "--verbose", "--context", "CTX", "q" }, {}, "unknown flag --verbose\n" },
      { { "--max-rss-bytes", "10", "--context", "CTX", "q" }, {}, "rlm: --context cannot fit --max-rss-bytes (10 bytes): "
        .. "its 37 bytes take at least 37 bytes of the sandbox's memory as Python objects; raise --max-rss-bytes" },
      { { "--context" }, {}, "--context wants a value" },
      { { "--trace=yes", "--context", "CTX", "q" }, {}, "--trace takes no value" },
      { { "--price", "fake-root=cheap", "--context", "CTX", "q" }, {}, "--price wants MODEL=IN:OUT" },
      { { "--context", "-", "-" }, { stdin = "x" }, "standard input (\"-\") can be read only once" },
      { { "--context", "CTX", "--context", "CTX", "q" }, {}, "is given twice" },
      { { "--max-cost-usd", "1", "--context", "CTX", "q" }, {}, "needs a price for model fake-root" },
      { { "--context", "CTX", "q" }, { endpoint = false }, "no model: give --model NAME or set RLM_MODEL" },
      { { "--provider", "claude", "--context", "CTX", "q" }, {}, "--provider wants openai, anthropic or gemini" },
      -- the settings every host reads (rlm.llm.settings, docs/llm.md)
      { { "--context", "CTX", "q" }, { endpoint = false, env = { "RLM_MODEL=m", "RLM_PROVIDER=claude" } },
        "rlm: RLM_PROVIDER wants openai, anthropic or gemini, got \"claude\"\n" },
      { { "--context", "CTX", "q" }, { endpoint = false, env = { "RLM_ROOT_MODEL=gpt-4o" } },
        "rlm: no model: give --model NAME or set RLM_MODEL (RLM_ROOT_MODEL is no longer read)\n" },
      { { "--model", "m", "--context", "CTX", "q" }, { endpoint = false },
        "rlm: no key: set OPENAI_API_KEY (https://api.openai.com/v1 needs one" },
      { { "view" }, { endpoint = false }, "rlm view wants one log file" },
    }
    for _, case in ipairs(cases) do
      it(("%s (%s)"):format(case[3], table.concat(case[1], " ")), function()
        srv:script({})
        local args = {}
        for i, a in ipairs(case[1]) do
          args[i] = a == "CTX" and context_file or a
        end
        local code, out, err = rlm(args, case[2])
        assert.are.equal(2, code, err)
        assert.are.equal("", out)
        assert.is_truthy(err:find(case[3], 1, true), err)
        assert.are.same({}, srv:requests()) -- no model was called
      end)
    end
  end)

  describe("an answer", function()
    it("can come through a nested session with --max-depth 2", function()
      srv:script({
        { content = F.fence("FINAL('got ' + rlm_query('shout it', 'inner ctx'))"), usage = { 10, 5 } },
        { content = F.fence("FINAL(context.upper())"), usage = { 10, 5 } },
      })
      local code, out, err = rlm({ "--max-depth", "2", "--context", context_file, "q" })
      assert.are.equal(0, code, err)
      assert.are.equal("got INNER CTX\n", out)
      local reqs = srv:requests()
      assert.are.equal(2, #reqs)
      assert.matches("Question: shout it", reqs[2].json.messages[2].content, 1, true)
      assert.matches("rlm_query", reqs[1].json.messages[1].content, 1, true) -- the prompt teaches it
    end)

    it("goes to stdout with exit 0; the key goes in a header, never in argv", function()
      srv:script({
        { content = F.fence("import re\nr = llm_query(re.search(r'code is (\\d+)', context).group(1))"),
          usage = { 100, 20 } },
        { content = "7731 confirmed", usage = { 10, 2 } },
        { content = F.fence("FINAL(r)"), usage = { 150, 10 } },
      })
      local code, out, err = rlm({ "--context", context_file, "What is the code?" })
      assert.are.equal(0, code, err)
      assert.are.equal("7731 confirmed\n", out)
      assert.are.equal("", err)
      local reqs = srv:requests()
      assert.are.equal(3, #reqs)
      assert.are.same({ "fake-root", "fake-sub", "fake-root" }, { reqs[1].json.model, reqs[2].json.model,
        reqs[3].json.model })
      assert.are.equal("7731", reqs[2].json.messages[1].content)
      assert.matches("What is the code%?", reqs[1].json.messages[2].content)
      for _, r in ipairs(reqs) do
        assert.are.equal("Bearer " .. secret, r.headers.authorization)
        assert.are.same({}, r.argv_hits)
      end
    end)

    it("takes the endpoint, the models and the key variable from the environment", function()
      final_run("FINAL('from env')")
      local code, out, err = rlm({ "--context", context_file, "q" }, { endpoint = false, env = {
        "RLM_BASE_URL=" .. srv.url, "RLM_MODEL=env-root", "RLM_SUB_MODEL=env-sub", "RLM_API_KEY_ENV=RLM_SPEC_SECRET" } })
      assert.are.equal(0, code, err)
      assert.are.equal("from env\n", out)
      local req = srv:requests()[1]
      assert.are.equal("env-root", req.json.model)
      assert.are.equal("Bearer " .. secret, req.headers.authorization)
    end)

    it("reads the key from OPENAI_API_KEY by default, and sends none when it is unset", function()
      final_run("FINAL('k')")
      local code = rlm({ "--base-url", srv.url, "--model", "m", "--context", context_file, "q" },
        { endpoint = false, env = { "OPENAI_API_KEY=sk-fake-default" } })
      assert.are.equal(0, code)
      assert.are.equal("Bearer sk-fake-default", srv:requests()[1].headers.authorization)
      final_run("FINAL('k')")
      code = rlm({ "--base-url", srv.url, "--model", "m", "--context", context_file, "q" },
        { endpoint = false, env = { "OPENAI_API_KEY=" } })
      assert.are.equal(0, code)
      assert.is_nil(srv:requests()[1].headers.authorization)
    end)

    -- one row a case: the provider, its base URL on the fake, the path it
    -- posts to, its key's default variable and header
    local providers = {
      { "anthropic", "", "/v1/messages", "ANTHROPIC_API_KEY", "x-api-key" },
      { "gemini", "/v1beta", "/v1beta/models/m:generateContent", "GEMINI_API_KEY", "x-goog-api-key" },
    }
    for _, p in ipairs(providers) do
      it(("asks %s with --provider %s, the key from $%s by default"):format(p[3], p[1], p[4]), function()
        final_run("FINAL('from " .. p[1] .. "')")
        local code, out, err = rlm({ "--provider", p[1], "--base-url", (srv.url:gsub("/v1$", p[2])),
          "--model", "m", "--context", context_file, "q" }, { endpoint = false, env = { p[4] .. "=sk-fake-" .. p[1] } })
        assert.are.equal(0, code, err)
        assert.are.equal("from " .. p[1] .. "\n", out)
        local req = srv:requests()[1]
        assert.are.equal(p[3], req.path)
        assert.are.equal("sk-fake-" .. p[1], req.headers[p[5]])
        assert.is_nil(req.headers.authorization)
      end)
    end

    it("runs a batch's sub-calls side by side: 8 of 1 s in about 1 s", function()
      local replies = { { content = F.fence("r = llm_query_batched(['p%d' % i for i in range(8)])\n"
        .. "FINAL(','.join(r))") } }
      for _ = 1, 8 do
        replies[#replies + 1] = { content = "a", delay_ms = 1000 }
      end
      srv:script(replies)
      local t0 = socket.gettime()
      local code, out, err = rlm({ "--context", context_file, "q" })
      local secs = socket.gettime() - t0
      assert.are.equal(0, code, err)
      assert.are.equal("a,a,a,a,a,a,a,a\n", out)
      -- One by one they take 8 s before the CLI's own start and the run's
      -- steps; side by side 1 s, and a loaded machine (4.5 s seen at a load
      -- of 20) stays well under the 8.
      assert.is_true(secs < 6.5, ("took %.2f s (one by one: 8 s and more)"):format(secs))
    end)

    it("sees several --context files as a dict keyed by their names", function()
      final_run("import json\nFINAL(json.dumps(context, sort_keys=True))")
      local code, out, err = rlm({ "--context", context_file, "--context", "-", "q" }, { stdin = "from stdin" })
      assert.are.equal(0, code, err)
      assert.are.same({ [context_file] = slurp(context_file), ["-"] = "from stdin" }, cjson.decode(out))
    end)

    it("sees one --context file as a str, and reads the question from stdin", function()
      final_run("FINAL(type(context).__name__ + ':' + str(len(context)))")
      local code, out, err = rlm({ "--context", context_file, "-" }, { stdin = "the question from stdin\n" })
      assert.are.equal(0, code, err)
      assert.are.equal("str:" .. #slurp(context_file) .. "\n", out)
      assert.matches("the question from stdin", srv:requests()[1].json.messages[2].content)
    end)

    it("starts each --trace event on a line of its own, also one that comes while the text streams", function()
      -- the sandbox is ready while the first root reply is still coming
      srv:script({ { content = F.fence("FINAL('glued?')"), event_delay_ms = 400,
        pieces = { "```repl\n", "FINAL('glued?')\n", "```" } } })
      local code, out, err = rlm({ "--trace", "--context", context_file, "q" })
      assert.are.equal(0, code, err)
      assert.are.equal("glued?\n", out)
      assert.matches("\n%-%- sandbox_ready\n", err)
      for line in err:gmatch("[^\n]+") do
        assert.is_nil(line:find(".%-%- [%w_]+$"), line) -- no event glued onto the text
      end
      assert.matches("%-%- root model:\n  ```repl\n.*  FINAL%('glued%?'%)\n  ```\n", err)
    end)

    it("streams the steps to stderr with --trace, the answer alone on stdout", function()
      srv:script({
        { content = F.fence("print('looking')\nx = llm_query('sub?')"), usage = { 1, 1 } },
        { content = "sub reply" },
        { content = F.fence("FINAL('traced')") },
      })
      local code, out, err = rlm({ "--trace", "--context", context_file, "q" })
      assert.are.equal(0, code, err)
      assert.are.equal("traced\n", out)
      -- the root calls streamed, their text shown once, as it came
      local reqs = srv:requests()
      assert.are.same({ true, false, true }, { reqs[1].json.stream, reqs[2].json.stream, reqs[3].json.stream })
      assert.are.equal(1, select(2, err:gsub("```repl\n  FINAL%('traced'%)", "")), err)
      assert.matches("%-%- root model:\n  ```repl\n  print%('looking'%)", err)
      assert.matches("== step 1", err)
      assert.matches("print%('looking'%)", err)
      assert.matches("%-%- output:\n  looking", err)
      assert.matches("llm_query 1 .-sub%?.-sub reply", err)
      assert.matches("== step 2", err)
    end)
  end)

  describe("the status line", function()
    local CLEAR = "\r\27[K"

    local function two_steps()
      srv:script({
        { content = F.fence("x = llm_query('sub?')"), usage = { 1000, 200 } },
        { content = "sub reply", usage = { 30, 4 } },
        { content = F.fence("FINAL('the answer')"), usage = { 1300, 20 } },
      })
    end

    -- The lines the terminal was shown, each as drawn over the last.
    local function drawn(err)
      local lines = {}
      for line in (err .. CLEAR):gmatch("\r\27%[K([^\r]*)") do
        if line ~= "" then
          lines[#lines + 1] = line
        end
      end
      return lines
    end

    it("is redrawn in place on a terminal, and cleared before the end; stdout gets the answer alone", function()
      two_steps()
      local code, out, err = rlm({ "--context", context_file, "q" }, { tty_err = true })
      assert.are.equal(0, code, err)
      assert.are.equal("the answer\n", out)
      assert.is_nil(err:find("\n", 1, true), err) -- one line, drawn over itself
      assert.are.equal(CLEAR, err:sub(-#CLEAR)) -- and cleared at the end
      local lines = drawn(err)
      local function shown(pattern)
        for _, line in ipairs(lines) do
          if line:find(pattern) then
            return line
          end
        end
        error(pattern .. " was never shown in:\n" .. table.concat(lines, "\n"))
      end
      shown("^rlm: starting the sandbox, 0 sub%-calls, 0 tokens, cost unknown, %d+%.%d s$")
      shown("^rlm: step 1/20: root model, 0 sub%-calls, 0 tokens, cost unknown, %d+%.%d s$")
      shown("^rlm: step 1/20: sub%-call 1, 0 sub%-calls, 1,200 tokens, cost unknown, %d+%.%d s$")
      shown("^rlm: step 1/20: running code, 1 sub%-call, 1,234 tokens, cost unknown, %d+%.%d s$")
      shown("^rlm: step 2/20: root model, 1 sub%-call, 1,234 tokens")
      shown("^rlm: step 2/20: answered, 1 sub%-call, 2,554 tokens")
    end)

    it("shows the cost when both models have a price, and keeps within the terminal's width", function()
      two_steps()
      local code, out, err = rlm({ "--price", "fake-root=1000:1000", "--price", "fake-sub=1000:1000",
        "--max-iterations", "7", "--context", context_file, "q" }, { tty_err = true, env = { "COLUMNS=60" } })
      assert.are.equal(0, code, err)
      assert.are.equal("the answer\n", out)
      local lines = drawn(err)
      assert.is_true(#lines > 3)
      for _, line in ipairs(lines) do
        assert.is_true(#line <= 59, line)
      end
      -- On 200 columns, the whole line: 2,554 tokens at 1,000 USD per million.
      two_steps()
      code, out, err = rlm({ "--price", "fake-root=1000:1000", "--price", "fake-sub=1000:1000",
        "--max-iterations", "7", "--context", context_file, "q" }, { tty_err = true, env = { "COLUMNS=200" } })
      assert.are.equal(0, code, err)
      assert.are.equal("the answer\n", out)
      assert.matches("rlm: step 2/7: answered, 1 sub%-call, 2,554 tokens, %$2%.5540, %d+%.%d s", err)
    end)

    it("moves its clock while a model call is out", function()
      srv:script({ { content = F.fence("FINAL('late')"), usage = { 10, 5 }, delay_ms = 2500 } })
      local code, out, err = rlm({ "--context", context_file, "q" }, { tty_err = true })
      assert.are.equal(0, code, err)
      assert.are.equal("late\n", out)
      -- the root model's line, drawn again with the time as it passes
      local times = {}
      for _, line in ipairs(drawn(err)) do
        local t = line:match("^rlm: step 1/20: root model, .*, (%d+%.%d) s$")
        if t and times[#times] ~= t then
          times[#times + 1] = t
        end
      end
      assert.is_true(#times >= 4, table.concat(times, ", "))
      assert.is_true(tonumber(times[#times]) - tonumber(times[1]) >= 1.5, table.concat(times, ", "))
    end)

    it("stays below the --trace lines, cleared and drawn again around each", function()
      two_steps()
      local code, out, err = rlm({ "--trace", "--context", context_file, "q" }, { tty_err = true })
      assert.are.equal(0, code, err)
      assert.are.equal("the answer\n", out)
      -- every trace line starts on a cleared line; none holds the status
      assert.is_truthy(err:find(CLEAR .. "== step 1\r\n", 1, true), err)
      for line in err:gmatch("[^\n]+") do
        local status_at = line:find("rlm: step", 1, true)
        assert.is_true(status_at == nil or line:sub(1, #CLEAR) == CLEAR, line)
      end
    end)

    it("is not shown with --quiet, nor when stderr is not a terminal", function()
      two_steps()
      local code, out, err = rlm({ "--quiet", "--context", context_file, "q" }, { tty_err = true })
      assert.are.equal(0, code, err)
      assert.are.equal("the answer\n", out)
      assert.are.equal("", err)
      two_steps()
      code, out, err = rlm({ "--context", context_file, "q" })
      assert.are.equal(0, code, err)
      assert.are.equal("the answer\n", out)
      assert.are.equal("", err)
    end)

    it("is cleared before an error, which is one line", function()
      srv:script({ { status = 400, json = { error = { message = "bad model" } } } })
      local code, out, err = rlm({ "--context", context_file, "q" }, { tty_err = true })
      assert.are.equal(19, code, err)
      assert.are.equal("", out)
      assert.matches("\r\27%[Krlm: callback_error: [^\r\n]*HTTP 400: bad model %(exit 19%)\r\n$", err)
    end)
  end)

  -- What the model and the sandbox write, with what a terminal acts on: an
  -- OSC 52 clipboard write, a title, clear screen, a CSI as C1 (U+009B), a
  -- carriage return and backspaces over the line, a lone ESC, a bell.
  describe("terminal escapes", function()
    local HOSTILE = [[\x1b]52;c;ZXZpbA==\x07\x1b]0;pwned\x07\x1b[2J\u009b31m\rover\x08\x08\x1b\x07 tab\tend]]
    local SHOWN = [[\x1b]52;c;ZXZpbA==\x07\x1b]0;pwned\x07\x1b[2J\u009b31m\x0dover\x08\x08\x1b\x07 tab]] .. "\tend"
    local RAW = "\27]52;c;ZXZpbA==\7\27]0;pwned\7\27[2J\194\15531m\rover\8\8\27\7 tab\tend"

    -- Control characters but newline and tab, and C1 as UTF-8.
    local function controls(s)
      return s:find("[%z\1-\8\11-\31\127]") or s:find("\194[\128-\159]")
    end

    local function hostile_run()
      srv:script({
        { content = "Reply " .. RAW .. "\n" .. F.fence("print('" .. HOSTILE .. "')\nllm_query('x')") },
        { content = "sub " .. RAW },
        { content = F.fence("FINAL('" .. HOSTILE .. "')") },
      })
    end

    it("escapes them in --trace and keeps newlines and tabs", function()
      hostile_run()
      local code, out, err = rlm({ "--trace", "--context", context_file, "q" })
      assert.are.equal(0, code, err)
      assert.is_nil(controls(err), err)
      assert.is_truthy(err:find("-- output:\n  " .. SHOWN, 1, true), err)
      assert.is_truthy(err:find("  =>\n  sub " .. SHOWN, 1, true), err)
      assert.are.equal(RAW .. "\n", out)
    end)

    it("writes the answer verbatim to a pipe", function()
      hostile_run()
      local code, out, err = rlm({ "--context", context_file, "q" })
      assert.are.equal(0, code, err)
      assert.are.equal(RAW .. "\n", out)
    end)

    it("escapes the answer on a terminal", function()
      hostile_run()
      local code, out, err = rlm({ "--context", context_file, "q" }, { tty = true })
      assert.are.equal(0, code, err)
      out = out:gsub("\r\n", "\n") -- the terminal's own line ends
      assert.is_nil(controls(out), out)
      assert.are.equal(SHOWN .. "\n", out)
    end)

    -- Trojan Source: every bidirectional control, around text it reorders.
    local BIDI_PY = [[a\u202eb\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069\u200e\u200f\u061cz]]
    local BIDI = "a\226\128\174b\226\128\170\226\128\171\226\128\172\226\128\173\226\129\166"
      .. "\226\129\167\226\129\168\226\129\169\226\128\142\226\128\143\216\156z"
    local BIDI_SHOWN = BIDI_PY -- the escapes Python reads are the ones shown

    local function bidi_run()
      srv:script({ { content = F.fence("print('" .. BIDI_PY .. "')\nFINAL('" .. BIDI_PY .. "')") } })
    end

    it("shows bidirectional controls as escapes in the answer on a terminal and in --trace", function()
      bidi_run()
      local code, out, err = rlm({ "--trace", "--context", context_file, "q" }, { tty = true })
      assert.are.equal(0, code, err)
      assert.are.equal(BIDI_SHOWN .. "\r\n", out)
      assert.is_truthy(err:find("-- output:\n  " .. BIDI_SHOWN, 1, true), err)
      assert.is_nil(err:find("\226\128\174", 1, true))
    end)

    it("writes the answer to a terminal verbatim with --verbatim, and to a pipe", function()
      hostile_run()
      local code, out, err = rlm({ "--verbatim", "--context", context_file, "q" }, { tty = true })
      assert.are.equal(0, code, err)
      assert.is_truthy(out:find("\27]52;c;ZXZpbA==\7", 1, true), out) -- the terminal got the OSC 52
      bidi_run()
      code, out, err = rlm({ "--context", context_file, "q" })
      assert.are.equal(0, code, err)
      assert.are.equal(BIDI .. "\n", out)
    end)

    it("escapes them in an error on stderr", function()
      srv:script({ { status = 400, json = { error = { message = "bad " .. RAW } } } })
      local code, _, err = rlm({ "--context", context_file, "q" })
      assert.are.equal(19, code)
      assert.is_nil(controls(err), err)
      assert.is_truthy(err:find("bad " .. SHOWN, 1, true), err)
    end)
  end)

  describe("a failed run exits with its kind's status", function()
    -- one row a case: the replies, extra args, status, kind
    local cases = {
      { { { content = F.fence("x = 1") }, { content = F.fence("x = 2") } }, -- the last chance: code, no answer
        { "--max-iterations", "1" }, 16, "max_iterations" },
      { { { status = 400, json = { error = { message = "bad model" } } } }, {}, 19, "callback_error" },
      { { { content = F.fence("llm_query('one too many')") } }, { "--max-sub-calls", "0" }, 14, "sub_call_budget" },
      { { { content = F.fence("x = 1"), usage = { 1000, 1000 } }, { content = F.fence("FINAL('never')") } },
        { "--price", "fake-root=1000:1000", "--price", "fake-sub=1:1", "--max-cost-usd", "0.5", "--no-fallback" }, 15,
        "cost_budget" },
      { { { content = F.fence("x = 1"), usage = { 60, 60 } }, { content = F.fence("FINAL('never')") } },
        { "--max-total-tokens", "100", "--no-fallback" }, 15, "cost_budget" },
      -- Interrupted at 1.5 s, swallowed, killed 2 s (interrupt_grace_ms) later.
      { { { content = F.fence("while True:\n    try:\n        while True:\n            pass\n    except:\n        pass") } },
        { "--step-timeout-ms", "1500" }, 12, "step_timeout" },
      { { { content = F.fence("while True:\n    pass") } }, { "--max-wall-ms", "1500", "--no-fallback" }, 15, "cost_budget" },
      { { { content = F.fence("b = b'x' * (400 << 20)") } }, { "--max-rss-bytes", tostring(96 * 2 ^ 20) },
        13, "memory_limit", "; raise %-%-max%-rss%-bytes %(now 100663296; 0: no limit%) to give it more %(exit 13%)" },
      { { { content = F.fence("FINAL('never')") } }, { "--python", "/nonexistent/python3" }, 10, "sandbox_unavailable" },
      { { { content = "too late", delay_ms = 3000 } }, { "--timeout-ms", "300", "--retries", "0" }, 19,
        "callback_error" },
    }
    for _, case in ipairs(cases) do
      it(("%d for %s (%s)"):format(case[3], case[4], table.concat(case[2], " ")), function()
        srv:script(case[1])
        local args = { "--context", context_file }
        for _, a in ipairs(case[2]) do
          args[#args + 1] = a
        end
        args[#args + 1] = "q"
        local code, out, err = rlm(args)
        assert.are.equal(case[3], code, err)
        assert.are.equal("", out)
        -- one line: the kind, the message (no traceback), the status
        assert.matches("^rlm: " .. case[4] .. ": [^\n]+ %(exit " .. case[3] .. "%)\n$", err)
        if case[5] then -- what to change
          assert.matches(case[5], err)
        end
      end)
    end

    it("19 for a failed model call, in one line without the callback's traceback", function()
      srv:script({ { status = 500, json = { error = { message = "model overloaded" } } } })
      local code, out, err = rlm({ "--retries", "0", "--context", context_file, "q" })
      assert.are.equal(19, code, err)
      assert.are.equal("", out)
      assert.are.equal(("rlm: callback_error: root_llm raised: rlm.llm.openai: POST %s/chat/completions: "
        .. "HTTP 500: model overloaded (exit 19)\n"):format(srv.url), err)
    end)

    it("19 for a 404 from a base URL without /v1, naming the URL with it", function()
      local bare = srv.url:gsub("/v1$", "")
      for _, base in ipairs({ bare, bare .. "/" }) do
        srv:script({ { status = 404, json = { error = { message = "no such route" } } } })
        local code, _, err = rlm({ "--base-url", base, "--context", context_file, "q" })
        assert.are.equal(19, code, err)
        assert.is_truthy(err:find("HTTP 404: no such route; did you mean " .. bare .. "/v1? (exit 19)\n", 1, true), err)
      end
      -- with /v1, a 404 is the server's word alone
      srv:script({ { status = 404, json = { error = { message = "no such model" } } } })
      local code, _, err = rlm({ "--context", context_file, "q" })
      assert.are.equal(19, code, err)
      assert.is_nil(err:find("did you mean", 1, true), err)
    end)

    -- A real SIGINT (Ctrl-C) while the code sleeps 30 s, or while the root
    -- model's HTTP reply is 1.5 s away (spec/helpers/sigint.py).
    local function interrupted(reply, marker)
      srv:script({ reply })
      local words = { "--base-url", srv.url, "--model", "fake-root", "--api-key-env", "RLM_SPEC_SECRET", "--trace",
        "--context", context_file, "q" }
      for i, w in ipairs(words) do
        words[i] = q(w)
      end
      local r = cjson.decode(H.sh(("TMPDIR=%s python3 %s/spec/helpers/sigint.py %s %s %s %s"):format(H.tmpdir, root,
        q(marker), LUA, BIN, table.concat(words, " "))))
      assert.is_true(r.started, r.stderr)
      assert.are.equal(20, r.status, r.stderr)
      assert.matches("\nrlm: cancelled: interrupted %(SIGINT%) %(exit 20%)\n$", r.stderr)
      assert.is_nil(r.stderr:find("traceback", 1, true), r.stderr)
      assert.is_nil(r.stderr:find("final answer", 1, true), r.stderr)
      assert.are.equal("", r.stdout)
      assert.are.same({}, r.left)
      return r
    end

    it("20 for cancelled at once on SIGINT, with one line and no traceback", function()
      local r = interrupted({ content = F.fence("import time\ntime.sleep(30)\nFINAL('late')") }, "-- root model")
      -- The REPL sleeps 30 s: 5 s tells "at once" from waiting it out at any load.
      assert.is_true(r.exit_ms < 5000, ("%.0f ms from SIGINT to the exit; %s"):format(r.exit_ms, r.stderr))
      assert.is_true(r.sandbox > 0)
    end)

    it("20 on SIGINT during the root model's call, once it returns", function()
      local r = interrupted({ content = F.fence("FINAL('late')"), delay_ms = 1500 }, "== step 1")
      assert.is_true(r.exit_ms < 2500, ("%.0f ms from SIGINT to the exit; %s"):format(r.exit_ms, r.stderr))
    end)

    it("1 for a context file that cannot be read", function()
      local code, out, err = rlm({ "--context", "/nonexistent/file", "q" })
      assert.are.equal(1, code)
      assert.are.equal("", out)
      assert.matches("cannot read /nonexistent/file: No such file or directory", err)
    end)

    it("finds the clone's modules when run as bin/rlm from the clone's top", function()
      local out = H.sh(("cd %s && env -u LUA_PATH -u LUA_CPATH %s bin/rlm --model m --base-url http://127.0.0.1:9/v1 "
        .. "--context /nonexistent/file q "
        .. "2>&1; echo \"exit $?\""):format(q(root), LUA))
      assert.are.equal("rlm: cannot read /nonexistent/file: No such file or directory\nexit 1", out)
    end)

    it("1 for a directory as --context, saying so", function()
      srv:script({})
      local code, out, err = rlm({ "--context", H.tmpdir, "q" })
      assert.are.equal(1, code)
      assert.are.equal("", out)
      assert.are.equal("rlm: cannot read " .. H.tmpdir .. ": Is a directory (give its files, each with --context)\n",
        err)
      assert.are.same({}, srv:requests())
    end)
  end)

  describe("--log and rlm view", function()
    local log_path

    before_each(function()
      log_path = os.tmpname()
      os.remove(log_path)
    end)

    after_each(function()
      os.remove(log_path)
    end)

    it("writes the trajectory as JSON lines, which rlm view renders as HTML", function()
      srv:script({
        { content = F.fence("print('hello from the repl')") },
        { content = F.fence("FINAL('logged')") },
      })
      local code, out, err = rlm({ "--log", log_path, "--context", context_file, "q" })
      assert.are.equal(0, code, err)
      assert.are.equal("logged\n", out)
      local types = {}
      for line in io.lines(log_path) do
        local ev = cjson.decode(line)
        assert.is_table(ev)
        assert.is_string(ev.type)
        types[ev.type] = (types[ev.type] or 0) + 1
      end
      assert.are.equal(2, types.step_start)
      assert.are.equal(2, types.exec_result)
      assert.are.equal(1, types.final)
      assert.matches("hello from the repl", slurp(log_path))

      local html
      code, html, err = rlm({ "view", log_path }, { endpoint = false })
      assert.are.equal(0, code, err)
      assert.matches("^%s*<!DOCTYPE html>", html)
      assert.matches("hello from the repl", html)
    end)

    it("rlm view escapes the page's hostile text on a terminal, and writes it verbatim to a pipe", function()
      local f = assert(io.open(log_path, "wb"))
      f:write(cjson.encode({ type = "session_start", depth = 0, t_ms = 0,
        query = "osc \27]52;c;ZXZpbA==\7 bidi a\226\128\174b" }), "\n")
      f:close()
      local code, out = rlm({ "view", log_path }, { endpoint = false, tty = true })
      assert.are.equal(0, code)
      assert.is_truthy(out:find([[osc \x1b]52;c;ZXZpbA==\x07 bidi a<span class="ctl" title="a bidirectional control">\u202e</span>b]],
        1, true), out)
      assert.is_nil(out:find("\27", 1, true))
      code, out = rlm({ "view", log_path }, { endpoint = false })
      assert.are.equal(0, code)
      assert.is_truthy(out:find("osc \27]52;c;ZXZpbA==\7 bidi", 1, true))
    end)

    it("fails with 1 when the log cannot be written", function()
      final_run("FINAL('x')")
      local code, _, err = rlm({ "--log", "/nonexistent/dir/run.jsonl", "--context", context_file, "q" })
      assert.are.equal(1, code)
      assert.matches("cannot write the log", err)
    end)

    it("rlm view fails with 1 on a log it cannot read", function()
      local code, _, err = rlm({ "view", "/nonexistent/run.jsonl" }, { endpoint = false })
      assert.are.equal(1, code)
      assert.matches("cannot read", err)
    end)
  end)

  describe("--tools, --schema and the fallback", function()
    it("gives the model the tools of a Lua file", function()
      local tools = os.tmpname()
      local f = assert(io.open(tools, "w"))
      f:write("return { double = { call = function(n) return n * 2 end, doc = 'double(n): 2n' } }\n")
      f:close()
      srv:script({ { content = F.fence("FINAL(double(21))") } })
      local code, out, err = rlm({ "--tools", tools, "--context", context_file, "q" })
      os.remove(tools)
      assert.are.equal(0, code, err)
      assert.are.equal("42\n", out)
      local system = srv:requests()[1].json.messages[1].content
      assert.is_truthy(system:find("`double(...)`: double(n): 2n", 1, true), system)
    end)

    it("checks the answer against --schema and prints it as JSON", function()
      local schema = os.tmpname()
      local f = assert(io.open(schema, "w"))
      f:write('{"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}')
      f:close()
      srv:script({
        { content = F.fence("r = {'m': 1}\nFINAL_VAR('r')") },
        { content = F.fence("r = {'n': 7}\nFINAL_VAR('r')") },
      })
      local code, out, err = rlm({ "--schema", schema, "--context", context_file, "q" })
      os.remove(schema)
      assert.are.equal(0, code, err)
      assert.are.equal('{"n":7}\n', out)
    end)

    it("prints a partial answer with status 3 when the turns run out, and the error with --no-fallback", function()
      -- The last chance writes code, not an answer: the best partial answer
      -- is what the REPL printed.
      local turns = { { content = F.fence("print('my best guess')") }, { content = F.fence("y = 2") } }
      srv:script({ turns[1], turns[2] })
      local code, out, err = rlm({ "--max-iterations", "1", "--context", context_file, "q" })
      assert.are.equal(3, code, err)
      assert.are.equal("my best guess\n", out)
      assert.matches("^rlm: partial answer %(max_iterations: .*%): not a FINAL answer, the model's best from what "
        .. "it found %(exit 3%)\n$", err)
      -- said before the text, as a reader meets them on a terminal
      srv:script({ turns[1], turns[2] })
      code, out = rlm({ "--max-iterations", "1", "--context", context_file, "q" }, { together = true })
      assert.are.equal(3, code, out)
      assert.matches("^rlm: partial answer %(max_iterations: [^\n]*%(exit 3%)\nmy best guess\n$", out)
      srv:script({ turns[1], turns[2] })
      code, out = rlm({ "--no-fallback", "--max-iterations", "1", "--context", context_file, "q" })
      assert.are.equal(16, code)
      assert.are.equal("", out)
    end)
  end)
end)
