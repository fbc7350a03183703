-- README.md's first example, run as it stands: the ```lua block after the
-- "spec/readme_spec.lua runs this block" marker goes into a file, and runs
-- as `lua ask.lua big.log "question"` with RLM_BASE_URL and RLM_MODEL
-- pointing at the stand-in OpenAI-compatible server, as the README's
-- command line shows for a local endpoint. Then docs/api.md's marked
-- examples (the pool, the tools), run as they stand after a prelude that
-- gives them what their prose assumes (rlm, text, q, root, sub), and what
-- the docs say of the plugin managers, a cancel and the nginx example.
local H = require("helpers")
local F = require("helpers.fake_openai")
local util = require("rlm.base.util")

local root = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/[^/]*$") or "."
local LUA = os.getenv("RLM_SPEC_LUA") or "lua5.4"

local q = util.shell_quote

local function read(path)
  local f = assert(io.open(root .. "/" .. path))
  local text = f:read("*a")
  f:close()
  return text
end

-- The ```lua block after `<!-- spec/readme_spec.lua MARK -->` in path.
local function marked_block(path, mark)
  local after = read(path):match("<!%-%- spec/readme_spec%.lua " .. mark:gsub("%p", "%%%0") .. " %-%->%s*\n(.*)$")
  assert(after, path .. " has no block marked " .. mark)
  return assert(after:match("^```lua\n(.-)\n```\n"), "the marked block of " .. path .. " is not a ```lua block")
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

describe("the docs' examples", function()
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

  local function run_block(block, answer, after)
    local chunk = PRELUDE:gsub("ANSWER", function()
      return ("%q"):format(answer) -- a Lua string
    end) .. block .. "\n" .. (after or "")
    local fn = assert((loadstring or load)(chunk, "=docs block"))
    return fn()
  end

  it("runs docs/api.md's pool example as it stands", function()
    local result, err = run_block(marked_block("docs/api.md", "runs this block: pool"),
      "FINAL(type(context).__name__ + ' ' + context)", "return result, err")
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("str the log", result.answer)
  end)

  it("runs docs/api.md's tools example as it stands", function()
    local result, err = run_block(marked_block("docs/api.md", "runs this block: tools"),
      "FINAL(f\"{add(2, 3)} {lookup('greeting')} {lookup('nope')} {type(now()).__name__}\")",
      "local result, err = session:run()\nsession:close()\nreturn result, err")
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("5 hello None int", result.answer)
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
