-- README.md's first example, run as it stands: the ```lua block after the
-- "spec/readme_spec.lua runs this block" marker goes into a file, and runs
-- as `lua ask.lua big.log "question"` with RLM_BASE_URL and RLM_MODEL
-- pointing at the stand-in OpenAI-compatible server, as the README's
-- command line shows for a local endpoint. Then docs/api.md's marked
-- examples (the pool, the tools), run as they stand after a prelude that
-- gives them what their prose assumes (rlm, text, q, root, sub), and what
-- the docs say of the plugin managers, a cancel and the nginx example.
-- Every ```lua, ```sh, ```yaml, ```ini and ```dockerfile block of
-- README.md and docs/ says on the line before which spec runs it (`<!--
-- spec/readme_spec.lua runs this block: NAME -->`) or why none does
-- (`<!-- not run: why -->`); those that are code compile (Lua) or parse
-- (bash -n).
local H = require("helpers")
local F = require("helpers.fake_openai")
local util = require("rlm.base.util")

local root = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/[^/]*$") or "."
root = H.sh("cd " .. util.shell_quote(root) .. " && pwd") -- absolute: some blocks run elsewhere
local LUA = os.getenv("RLM_SPEC_LUA") or "lua5.4"

local q = util.shell_quote

local function read(path)
  local f = assert(io.open(root .. "/" .. path))
  local text = f:read("*a")
  f:close()
  return text
end

-- The ```lua (or ```lang) block after `<!-- spec/readme_spec.lua MARK -->`
-- in path.
local function marked_block(path, mark, lang)
  lang = lang or "lua"
  local after = read(path):match("<!%-%- spec/readme_spec%.lua " .. mark:gsub("%p", "%%%0") .. " %-%->%s*\n(.*)$")
  assert(after, path .. " has no block marked " .. mark)
  return (assert(after:match("^```" .. lang .. "\n(.-)\n```\n"),
    "the marked block of " .. path .. " is not a ```" .. lang .. " block"))
end

-- The blocks a reader could run or apply: Lua, shell, and the files a
-- tool reads (a Kubernetes manifest, a containers' storage.conf, a
-- Dockerfile). ```json (a value's shape), ```repl (the system prompt's own
-- text) and bare blocks (diagrams, a format's line) are not.
local RUNNABLE = { lua = true, sh = true, yaml = true, ini = true, dockerfile = true }

-- Those blocks of README.md and docs/: { path =, line =, lang =, code =,
-- mark = the HTML comment on the line before, or nil }.
local function code_blocks()
  local out = {}
  local p = assert(io.popen("cd " .. q(root) .. " && ls README.md docs/*.md"))
  for path in p:lines() do
    local lines = {}
    for line in (read(path) .. "\n"):gmatch("([^\n]*)\n") do
      lines[#lines + 1] = line
    end
    local i = 1
    while i <= #lines do
      local lang = lines[i]:match("^%s*```(%a+)%s*$")
      if lang then
        local j = i + 1
        while lines[j] and not lines[j]:match("^%s*```%s*$") do
          j = j + 1
        end
        if RUNNABLE[lang] then
          local body = {}
          for k = i + 1, j - 1 do
            body[#body + 1] = lines[k]
          end
          out[#out + 1] = { path = path, line = i, lang = lang, code = table.concat(body, "\n"),
            mark = i > 1 and lines[i - 1]:match("^%s*<!%-%- (.-) %-%->%s*$") or nil }
        end
        i = j
      end
      i = i + 1
    end
  end
  p:close()
  return out
end

local function readme_block()
  local f = assert(io.open(root .. "/README.md"))
  local text = f:read("*a")
  f:close()
  local after = text:match("<!%-%- spec/readme_spec%.lua runs this block as it stands %-%->%s*\n(.*)$")
  assert(after, "README.md has no block marked for spec/readme_spec.lua")
  return assert(after:match("^```lua\n(.-)\n```\n"), "the marked README block is not a ```lua block")
end

describe("README's first example", function()
  local srv, dir

  setup(function()
    srv = F.start()
    dir = H.sh("mktemp -d /tmp/rlm-readme.XXXXXX")
  end)

  teardown(function()
    srv:stop()
    os.execute("rm -rf " .. q(dir))
  end)

  after_each(function()
    assert.are.same({}, H.workdirs())
  end)

  it("answers through rlm.llm.openai against the endpoint in RLM_BASE_URL", function()
    local code = readme_block()
    local f = assert(io.open(dir .. "/ask.lua", "w"))
    f:write(code)
    f:close()
    f = assert(io.open(dir .. "/big.log", "w"))
    for i = 1, 2000 do
      f:write(("2025-01-01T00:00:%02d svc=%s %s\n"):format(i % 60, i == 1234 and "billing" or "web",
        i == 1234 and "ERROR pool exhausted" or "ok"))
    end
    f:close()
    srv:script({
      { content = F.fence("bad = [l for l in context.splitlines() if 'ERROR' in l]\n"
        .. "why = llm_query('What failed? ' + bad[0])\nFINAL(bad[0].split()[1] + ': ' + why)"),
        usage = { 300, 40 } },
      { content = "the connection pool ran out", usage = { 30, 8 } },
    })
    local p = assert(io.popen(("cd %s && env TMPDIR=%s RLM_BASE_URL=%s RLM_MODEL=root-model "
      .. "RLM_SUB_MODEL=sub-model OPENAI_API_KEY=sk-readme %s ask.lua big.log 'Which service failed?' "
      .. "2>&1 </dev/null; echo \"exit $?\""):format(q(dir), q(H.tmpdir), q(srv.url), LUA)))
    local out = p:read("*a")
    p:close()
    assert.matches("exit 0%s*$", out)
    assert.matches("svc=billing: the connection pool ran out\n", out, 1, true)
    assert.matches("steps 1, sub%-calls 1, tokens 378", out)
    local reqs = srv:requests()
    assert.are.equal(2, #reqs)
    assert.are.equal("root-model", reqs[1].json.model)
    assert.are.equal("sub-model", reqs[2].json.model)
    assert.are.equal("Bearer sk-readme", reqs[1].headers.authorization)
    assert.matches("Which service failed%?", reqs[1].body)
  end)
end)

describe("the code blocks of README.md and docs/", function()
  local blocks = code_blocks()

  it("are found", function()
    assert.is_true(#blocks > 40, #blocks)
  end)

  it("each say, on the line before, which spec runs them or why none does", function()
    local unmarked = {}
    for _, b in ipairs(blocks) do
      local spec = b.mark and b.mark:match("^(spec/[%w_/]+%.lua) [%w ]- this block")
      local why = b.mark and b.mark:match("^not run[%w ]*: (.+)$")
      if not (why or spec and H.sh("test -f " .. q(root .. "/" .. spec) .. " && echo yes") == "yes") then
        unmarked[#unmarked + 1] = ("%s:%d (```%s)"):format(b.path, b.line, b.lang)
      end
    end
    assert.are.same({}, unmarked)
  end)

  it("are Lua that compiles, or shell that parses", function()
    local wrong = {}
    for _, b in ipairs(blocks) do
      local shape = b.mark and b.mark:find("^not run: the shape of a value")
      if b.lang == "lua" and not shape and (not b.code:find("<close>", 1, true) or _VERSION == "Lua 5.4") then
        local ok, why = (loadstring or load)(b.code, "=" .. b.path .. ":" .. b.line)
        if not ok and not why:find("'<eof>' expected", 1, true) then
          wrong[#wrong + 1] = why
        end
      elseif b.lang == "sh" then
        local p = assert(io.popen("bash -n 2>&1 <<'RLM_DOC_BLOCK'\n" .. b.code .. "\nRLM_DOC_BLOCK"))
        local out = p:read("*a")
        p:close()
        if out ~= "" then
          wrong[#wrong + 1] = b.path .. ":" .. b.line .. ": " .. out
        end
      end
    end
    assert.are.same({}, wrong)
  end)
end)

describe("the docs' examples", function()
  local function rlm_pool()
    return require("rlm").Pool.new({ size = 1 })
  end

  after_each(function()
    assert.are.same({}, H.workdirs())
  end)

  local PRELUDE = [[
local rlm = require("rlm")
local text, q = "the log", "what is in it?"
local root = (function()
  local turn = 0
  return function()
    turn = turn + 1
    return "```repl\n" .. ANSWER .. "\n```"
  end
end)()
local sub = function(p) return "sub: " .. p end
]]

  local function run_block(block, answer, after, before)
    local chunk = PRELUDE:gsub("ANSWER", function()
      return ("%q"):format(answer) -- a Lua string
    end) .. (before or "") .. block .. "\n" .. (after or "")
    local fn = assert((loadstring or load)(chunk, "=docs block"))
    return fn()
  end

  it("runs docs/api.md's pool example as it stands", function()
    local result, err = run_block(marked_block("docs/api.md", "runs this block: pool"),
      "FINAL(type(context).__name__ + ' ' + context)", "return result, err")
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("str the log", result.answer)
  end)

  it("says, in docs/api.md's Pools, that sandbox_ready carries warm or cold (session.start is nil)", function()
    local api = read("docs/api.md")
    assert.is_nil(api:find('`session.start` is `"warm"`', 1, true))
    local pool = assert(rlm_pool())
    local starts = {}
    local session = require("rlm").Session.new({ pool = pool, context = "x", root_llm = function()
      return "```repl\nFINAL('ok')\n```"
    end, llm_query = function(p)
      return p
    end, on_event = function(ev)
      if ev.type == "sandbox_ready" then
        starts[#starts + 1] = ev.start
      end
    end })
    local result, err = session:run()
    local field = session.start
    session:close()
    pool:close()
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("ok", result.answer)
    assert.are.same({ "warm" }, starts)
    assert.is_nil(field)
  end)

  it("runs docs/api.md's tools example as it stands", function()
    local result, err = run_block(marked_block("docs/api.md", "runs this block: tools"),
      "FINAL(f\"{add(2, 3)} {lookup('greeting')} {lookup('nope')} {type(now()).__name__}\")",
      "local result, err = session:run()\nsession:close()\nreturn result, err")
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("5 hello None int", result.answer)
  end)

  -- The session examples, each followed by the run they set up.
  local RUN = "local result, err = session:run()\nsession:close()\nreturn result, err"
  for _, row in ipairs({
    { "README.md", "budgets" }, { "docs/api.md", "compaction" }, { "docs/api.md", "cache" },
  }) do
    it(("runs %s's %s example as it stands"):format(row[1], row[2]), function()
      local result, err = run_block(marked_block(row[1], "runs this block: " .. row[2]),
        "FINAL(context + ' ' + llm_query('hi'))", RUN)
      assert.is_nil(err, err and tostring(err))
      assert.are.equal("the log sub: hi", result.answer)
    end)
  end

  it("runs docs/api.md's first line and its ask() example as they stand", function()
    assert.are.equal(require("rlm"), run_block(marked_block("docs/api.md", "runs this block: require"), "",
      "return rlm"))
    local second, err = run_block(marked_block("docs/api.md", "runs this block: ask"), "FINAL(context)",
      "session:close()\nreturn second, err",
      "local session = rlm.Session.new({ context = text, query = q, root_llm = root, llm_query = sub })\n")
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("the log", second.answer)
  end)

  -- A block run as a program of its own, in a directory of its own (it
  -- writes files there), with the checkout's modules: its output.
  local function run_program(block, prelude)
    local dir = H.sh("mktemp -d /tmp/rlm-docs.XXXXXX")
    local f = assert(io.open(dir .. "/block.lua", "w"))
    f:write(prelude or "", block, "\n")
    f:close()
    local p = assert(io.popen(("cd %s && env TMPDIR=%s LUA_PATH=%s LUA_CPATH=%s %s block.lua 2>&1; echo \"exit $?\"")
      :format(q(dir), q(H.tmpdir), q(root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;;"),
      q(root .. "/build/" .. (LUA:match("5%.[34]") or "5.1") .. "/?.so;;"), LUA)))
    local out = p:read("*a")
    p:close()
    return out, dir
  end

  it("runs docs/log.md's example as it stands: the log, then its page", function()
    local out, dir = run_program(marked_block("docs/log.md", "runs this block: log"),
      PRELUDE:gsub("ANSWER", function()
        return ("%q"):format("FINAL('logged')")
      end):gsub("^local rlm = require%(\"rlm\"%)\n", "") .. "local page\n",
      nil)
    finally(function()
      os.execute("rm -rf " .. q(dir))
    end)
    assert.matches("exit 0%s*$", out)
    local log = assert(util.read_file(dir .. "/run.jsonl"))
    assert.matches('"type":"run_end"', log, 1, true)
  end)

  it("runs docs/containers.md's diagnose loop as it stands", function()
    local out, dir = run_program(marked_block("docs/containers.md", "runs this block: diagnose"))
    os.execute("rm -rf " .. q(dir))
    assert.matches("exit 0%s*$", out)
    assert.matches("\nok%s+%S+", "\n" .. out) -- a row: its level, name, message
  end)

  it("runs docs/cli.md's first block as it stands, against a stand-in endpoint", function()
    local srv = F.start()
    local dir = H.sh("mktemp -d /tmp/rlm-cli-doc.XXXXXX")
    finally(function()
      srv:stop()
      os.execute("rm -rf " .. q(dir))
    end)
    -- the checkout as the block's directory sees it; `rlm` is bin/rlm
    for _, name in ipairs({ "Makefile", "bin", "lua", "build", "examples", "csrc", "python", "sandbox" }) do
      H.sh(("ln -s %s %s"):format(q(root .. "/" .. name), q(dir .. "/" .. name)))
    end
    H.sh(("printf 'alpha\\n' > %s/a.txt && printf 'beta\\n' > %s/b.txt"):format(q(dir), q(dir)))
    local fin = { content = F.fence("FINAL('svc=billing')") }
    srv:script({ fin, fin })
    local script = ("set -e\nrlm() { %s %s \"$@\"; }\nmake() { command make --no-print-directory -s \"$@\"; }\n%s\n")
      :format(LUA, q(dir .. "/bin/rlm"), marked_block("docs/cli.md", "runs this block: cli", "sh"))
    local f = assert(io.open(dir .. "/block.sh", "w"))
    f:write(script)
    f:close()
    local p = assert(io.popen(("cd %s && env -u RLM_MODEL -u RLM_SUB_MODEL -u RLM_PROVIDER -u RLM_API_KEY_ENV "
      .. "TMPDIR=%s RLM_BASE_URL=%s bash block.sh 2>&1; echo \"exit $?\""):format(q(dir), q(H.tmpdir), q(srv.url))))
    local out = p:read("*a")
    p:close()
    assert.matches("exit 0%s*$", out)
    -- both questions answered (the second's --trace lines around its answer)
    assert.are.equal(2, select(2, ("\n" .. out):gsub("\nsvc=billing\n", "")), out)
    local reqs = srv:requests()
    assert.are.same({ "gpt-5", "gpt-5" }, { reqs[1].json.model, reqs[2].json.model })
    assert.matches("<!DOCTYPE html>", assert(util.read_file(dir .. "/run.html")), 1, true)
  end)

  it("gives README's lazy.nvim spec as a file that returns it, with the clone's path", function()
    local spec = assert((loadstring or load)(marked_block("README.md", "loads this block"), "=lazy spec"))()
    assert.are.equal("table", type(spec))
    assert.are.equal("~/src/rlm", spec.dir)
    assert.are.equal("make nvim", spec.build)
    assert.are.equal("function", type(spec.config))
    local readme = read("README.md")
    assert.is_nil(readme:find("OWNER", 1, true), "README.md still says OWNER")
    assert.is_truthy(readme:find("use { \"~/src/rlm\", run = \"make nvim\"", 1, true))
    assert.is_truthy(readme:find("Plug '~/src/rlm', { 'do': 'make nvim' }", 1, true))
  end)

  -- What docs/adapters.md says of a cancel, which spec/cancel_spec.lua and
  -- the adapters' specs check: cancelled, never driver_exited.
  it("says a cancel gives cancelled, and that apt's nginx Lua module removes Debian's luajit", function()
    local doc = read("docs/adapters.md")
    for sentence in doc:gsub("\n", " "):gmatch("[^.]+") do
      if sentence:find("cancel", 1, true) then
        assert.is_nil(sentence:find("driver_exited", 1, true), sentence)
      end
    end
    assert.is_truthy(doc:find("session:close() cancels: the callback then gets a cancelled error", 1, true))
    assert.is_truthy(doc:find("**`apt-get install nginx libnginx-mod-http-lua` removes Debian's `luajit`\npackage**",
      1, true))
  end)

  -- docs/backends.md's SandboxClaim callbacks against a stand-in kubectl
  -- on PATH (no cluster here): it notes each call, answers the claim's
  -- gets and wait, and streams `exec -i` into a local rlm-keeper.
  it("runs docs/backends.md's SandboxClaim callbacks as they stand, against a stand-in kubectl", function()
    local bin = H.tmpdir .. "-kubectl"
    local log = bin .. "/calls"
    os.execute("mkdir -p " .. q(bin))
    local keeper = root .. "/" .. (os.getenv("RLM_SPEC_BUILD") or "build") .. "/rlm-keeper"
    local f = assert(io.open(bin .. "/kubectl", "w"))
    f:write(([[#!/bin/sh
echo "$*" >> %s
case "$1" in
  apply) name=$(sed -n 's/^  name: //p' "$3"); echo "sandboxclaim.extensions.agents.x-k8s.io/$name created" ;;
  get) if [ "$2" = sandboxclaim ]; then printf 'sb-%%s' "$3"; else printf 'pod-%%s' "$3"; fi ;;
  wait) echo "sandbox.agents.x-k8s.io/$2 condition met" ;;
  exec) exec %s --cache %s ;;
  delete) echo "sandboxclaim.extensions.agents.x-k8s.io \"$3\" deleted" ;;
  *) echo "unknown: $*" >&2; exit 1 ;;
esac
]]):format(q(log), q(keeper), q(root .. "/build/keeper-cache")))
    f:close()
    os.execute("chmod 755 " .. q(bin .. "/kubectl") .. "; mkdir -p " .. q(root .. "/build/keeper-cache"))
    -- The block, then a session on it, in a Lua of its own with the
    -- stand-in first on PATH (for io.popen and for the stream alike).
    local script = bin .. "/claim.lua"
    f = assert(io.open(script, "w"))
    f:write(marked_block("docs/backends.md", "runs this block: claim"), "\n", ([[
local rlm = require("rlm")
sandbox.tmpdir = %q
local s = rlm.Session.new({ sandbox = sandbox, context = "claimed through kubectl",
  root_llm = function() return "```repl\nFINAL(context)\n```" end, llm_query = function(p) return p end })
local result, err = s:run()
s:close()
print(result and result.answer or err.kind .. ": " .. err.message)
]]):format(H.tmpdir))
    f:close()
    local out = H.sh(("cd %s && env PATH=%s:\"$PATH\" %s %s 2>&1"):format(q(root), q(bin), LUA, q(script)))
    local calls = H.read_file(log)
    os.execute("rm -rf " .. q(bin))
    assert.equals("claimed through kubectl", out)
    local name = calls:match("^apply %-f %S+\nget sandboxclaim (rlm%-session%-%d+%-1) ")
    assert.is_string(name, calls)
    assert.equals(table.concat({ "get sandboxclaim " .. name .. " -o jsonpath={.status.sandbox.name}",
      "wait sandbox/sb-" .. name .. " --for=condition=Ready --timeout=60s",
      "get sandbox sb-" .. name .. " -o jsonpath={.metadata.annotations.agents\\.x-k8s\\.io/pod-name}",
      "exec -i pod-sb-" .. name .. " -c sandbox -- rlm-keeper",
      "delete sandboxclaim " .. name .. " --wait=false", "" }, "\n"), calls:match("^apply %-f %S+\n(.*)$"))
  end)

  it("has examples/openresty/nginx.conf cancel a session when its client goes away", function()
    local conf = read("examples/openresty/nginx.conf")
    local ask = assert(conf:match("location = /ask {(.-)}"), "no location = /ask")
    assert.matches("\n%s*lua_check_client_abort on;", ask)
    assert.matches("\n%s*lua_need_request_body on;", ask)
  end)
end)
