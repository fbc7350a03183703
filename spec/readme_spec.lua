-- README.md's first example, run as it stands: the ```lua block after the
-- "spec/readme_spec.lua runs this block" marker goes into a file, and runs
-- as `lua ask.lua big.log "question"` with RLM_BASE_URL and RLM_MODEL
-- pointing at the stand-in OpenAI-compatible server, as the README's
-- command line shows for a local endpoint.
local H = require("helpers")
local F = require("helpers.fake_openai")

local root = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/[^/]*$") or "."
local LUA = os.getenv("RLM_SPEC_LUA") or "lua5.4"

local function q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
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
