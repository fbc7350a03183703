-- make demo's script, both ways: with the scripted stand-ins, and with a
-- "real" model (the fake OpenAI-compatible server) through rlm.llm.openai.
local H = require("helpers")
local F = require("helpers.fake_openai")
local util = require("rlm.base.util")

local root = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/[^/]*$") or "."
local DEMO = root .. "/examples/demo.lua"
local LUA = os.getenv("RLM_SPEC_LUA") or "lua5.4"

local q = util.shell_quote

-- Runs the demo with the environment `env` (NAME=value strings) on 1 MB of
-- logs: exit code and output.
local function demo(env)
  local words = { "env", "-u", "RLM_BASE_URL", "-u", "RLM_MODEL", "-u", "RLM_SUB_MODEL", "-u",
    "RLM_API_KEY_ENV", "TMPDIR=" .. H.tmpdir, "RLM_DEMO_MB=1" }
  for _, e in ipairs(env or {}) do
    words[#words + 1] = q(e)
  end
  local p = assert(io.popen(("%s %s %s 2>&1 </dev/null; echo \"exit $?\""):format(
    table.concat(words, " "), LUA, DEMO)))
  local out = p:read("*a")
  p:close()
  return tonumber(out:match("exit (%d+)%s*$")), out
end

describe("make demo", function()
  local srv

  setup(function()
    srv = F.start()
  end)

  teardown(function()
    srv:stop()
  end)

  after_each(function()
    assert.are.same({}, H.workdirs()) -- the fake server is a child of ours: only workdirs are checked
  end)

  it("finds the three facts with the scripted stand-ins", function()
    local code, out = demo()
    assert.are.equal(0, code, out)
    assert.matches("SCRIPTED STAND%-INS", out)
    assert.matches("approver%s+m%.okafor", out)
    assert.matches("That is the right answer", out)
  end)

  it("finds the three facts with the prose-style stand-in that writes the paper's format", function()
    local code, out = demo({ "RLM_DEMO_STYLE=prose" })
    assert.are.equal(0, code, out)
    assert.matches("writes the paper's format", out, 1, true)
    assert.matches("hits = [l for l in lines if 'INC-4471' in l]", out, 1, true) -- the indented block ran
    assert.matches("FINAL(During incident INC-4471:", out, 1, true)
    assert.matches("(from a FINAL line of prose)", out, 1, true)
    assert.matches("  - approver: m.okafor", out, 1, true)
    assert.matches("That is the right answer", out)
  end)

  it("runs the same task with a real model when RLM_MODEL and RLM_BASE_URL are set", function()
    srv:script({
      { content = "I will pull the lines that matter and have the sub-model read them.\n" .. F.fence([[
keep = [l for l in context.split('\n') if 'INC-4471' in l or 'root cause' in l or 'rollback' in l]
print(len(keep), 'lines')
summary = llm_query('Who failed, with what code, and who approved the rollback?\n' + '\n'.join(keep))
print(summary)]]), usage = { 100, 40 } },
      { content = "payments-gateway failed with PGW-503-POOL; m.okafor approved the rollback.",
        usage = { 60, 20 } },
      { content = F.fence("FINAL(summary)"), usage = { 200, 10 } },
    })
    local code, out = demo({ "RLM_BASE_URL=" .. srv.url, "RLM_MODEL=fake-root", "RLM_SUB_MODEL=fake-sub",
      "RLM_API_KEY_ENV=RLM_SPEC_SECRET" })
    assert.are.equal(0, code, out)
    assert.matches("real model: fake%-root at http://127%.0%.0%.1:%d+/v1 %(sub%-model fake%-sub%)", out)
    assert.matches("model: I will pull the lines", out, 1, true)
    assert.matches("3 lines", out, 1, true)
    assert.matches("Tokens: 360 in, 70 out over 3 calls", out, 1, true)
    assert.matches("That is the right answer", out)
    local reqs = srv:requests()
    assert.are.equal(3, #reqs)
    assert.are.same({ "fake-root", "fake-sub", "fake-root" },
      { reqs[1].json.model, reqs[2].json.model, reqs[3].json.model })
    assert.are.equal("Bearer " .. os.getenv("RLM_SPEC_SECRET"), reqs[1].headers.authorization)
    assert.matches("m.okafor", reqs[2].json.messages[1].content, 1, true)
  end)

  it("says a real model's wrong answer is wrong", function()
    srv:script({ { content = F.fence("FINAL('the cdn-edge, probably')"), usage = { 1, 1 } } })
    local code, out = demo({ "RLM_BASE_URL=" .. srv.url, "RLM_MODEL=fake-root" })
    assert.are.equal(1, code, out)
    assert.matches("That is NOT the right answer", out)
  end)

  -- make -n: what a target would run, without running it.
  local function dry(target)
    return H.sh(("make -n -C %s %s 2>&1"):format(q(root), target))
  end

  -- The package lists make would install from: the words of its loop.
  local function packages(out)
    local list = {}
    for p in (out:match("for p in ([^;]*); do") or ""):gmatch("%S+") do
      list[p] = true
    end
    return list
  end

  it("installs what the demo uses and nothing more, and builds the core for Lua 5.4 only", function()
    local out = dry("demo")
    local want = packages(out)
    for _, p in ipairs({ "lua5.4", "liblua5.4-dev", "lua-cjson", "libuv1-dev", "bubblewrap", "python3", "lua-socket",
      "lua-sec", "gcc", "make" }) do
      assert.is_true(want[p], p .. " is not installed by make demo:\n" .. out)
    end
    for _, p in ipairs({ "chromium", "lua5.1", "lua5.3", "luajit", "lua-busted", "lua-luv" }) do
      assert.is_nil(want[p], p .. " is installed by make demo:\n" .. out)
    end
    assert.is_truthy(out:find("--no-install-recommends", 1, true), out)
    assert.is_nil(out:find("build/5.1", 1, true), out)
    assert.is_nil(out:find("build/5.3", 1, true), out)
    -- make test still installs everything the specs need
    local test = packages(dry("test"))
    for _, p in ipairs({ "chromium", "lua5.1", "lua5.3", "luajit", "lua-busted", "lua-luv", "bubblewrap" }) do
      assert.is_true(test[p], p .. " is not installed by make test")
    end
  end)

  -- README.md and docs/cli.md ask about big.log: make big.log writes it.
  it("writes the docs' big.log with make big.log, the demo's logs", function()
    -- -B: what make would run, whether or not the README's own make
    -- big.log already wrote it here.
    assert.matches("examples/demo%.lua %-%-write big%.log", dry("-B big.log"))
    for _, doc in ipairs({ "README.md", "docs/cli.md" }) do
      local text = H.read_file(root .. "/" .. doc)
      assert.is_truthy(text:find("big.log", 1, true), doc)
      assert.is_truthy(text:find("make big.log", 1, true), doc .. " uses big.log and never says how to make it")
    end
    local path = H.tmpdir .. "/big.log"
    local out = H.sh(("RLM_DEMO_MB=1 %s %s --write %s 2>&1"):format(LUA, DEMO, q(path)))
    assert.matches("1%.%d MB of synthetic service logs", out)
    local logs = H.read_file(path)
    os.remove(path)
    assert.is_true(#logs > 2 ^ 20)
    assert.is_truthy(logs:find("payments-gateway ERROR root cause identified", 1, true))
  end)

  it("refuses RLM_BASE_URL without RLM_MODEL", function()
    local code, out = demo({ "RLM_BASE_URL=" .. srv.url })
    assert.are.equal(2, code, out)
    assert.matches("RLM_MODEL is not", out)
  end)
end)
