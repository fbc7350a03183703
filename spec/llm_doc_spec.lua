-- docs/llm.md's runnable example, run as it stands: the ```lua block after
-- the "spec/llm_doc_spec.lua runs this block" marker goes into models.lua,
-- and runs once per provider as the doc's shell lines run it, against
-- spec/helpers/fake_openai.py started with --reply as the doc starts it.
local H = require("helpers")
local cjson = require("cjson")
local http = require("socket.http")
local util = require("rlm.base.util")

local root = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/[^/]*$") or "."
local LUA = os.getenv("RLM_SPEC_LUA") or "lua5.4"

local q = util.shell_quote

local function doc_block()
  local f = assert(io.open(root .. "/docs/llm.md"))
  local text = f:read("*a")
  f:close()
  local after = text:match("<!%-%- spec/llm_doc_spec%.lua runs this block as it stands[^\n]*%-%->%s*\n(.*)$")
  assert(after, "docs/llm.md has no block marked for spec/llm_doc_spec.lua")
  local block = after:match("^```lua\n(.-)\n```\n")
  assert(block, "the marked block is not a ```lua block")
  return block
end

describe("docs/llm.md's example", function()
  local dir, server, port

  setup(function()
    dir = H.sh("mktemp -d /tmp/rlm-llmdoc.XXXXXX")
    local f = assert(io.open(dir .. "/models.lua", "w"))
    f:write(doc_block())
    f:close()
    server = assert(io.popen(("exec python3 %s/spec/helpers/fake_openai.py --reply %s"):format(root,
      q('```repl\nFINAL("svc=billing")\n```'))))
    port = tonumber((server:read("*l") or ""):match("^(%d+)"))
    assert(port, "the stand-in did not start")
  end)

  teardown(function()
    http.request("http://127.0.0.1:" .. port .. "/_control/stop", "{}")
    server:close()
    os.execute("rm -rf " .. q(dir))
  end)

  after_each(function()
    assert.are.same({}, H.workdirs())
  end)

  -- one row a case: the provider, the base URL's path, the path it posts
  -- to, the key's header
  local cases = {
    { "openai", "/v1", "/v1/chat/completions", "authorization", "Bearer sk-doc-openai" },
    { "anthropic", "", "/v1/messages", "x-api-key", "sk-doc-anthropic" },
    { "gemini", "/v1beta", "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", "x-goog-api-key",
      "sk-doc-gemini" },
  }
  for _, case in ipairs(cases) do
    it("answers through rlm.llm." .. case[1] .. ", streamed, against the stand-in", function()
      http.request("http://127.0.0.1:" .. port .. "/_control/script", '{"replies": []}')
      local key_env = ({ openai = "OPENAI_API_KEY", anthropic = "ANTHROPIC_API_KEY", gemini = "GEMINI_API_KEY" })[
        case[1]]
      local p = assert(io.popen(("cd %s && env TMPDIR=%s RLM_BASE_URL=%s %s=%s %s models.lua %s 2>stderr.txt "
        .. "</dev/null; echo \"exit $?\""):format(q(dir), q(H.tmpdir), q("http://127.0.0.1:" .. port .. case[2]),
        key_env, "sk-doc-" .. case[1], LUA, case[1])))
      local out = p:read("*a")
      p:close()
      local f = assert(io.open(dir .. "/stderr.txt"))
      local err = f:read("*a")
      f:close()
      assert.matches("^svc=billing\ncalls 1, tokens 10 in and 5 out, 0%.0%d+ USD\nexit 0\n$", out)
      assert.are.equal('```repl\nFINAL("svc=billing")\n```', err) -- the root_delta events, as they came
      local body = http.request("http://127.0.0.1:" .. port .. "/_control/requests")
      local reqs = cjson.decode(body)
      assert.are.equal(1, #reqs)
      assert.are.equal(case[3], reqs[1].path)
      assert.are.equal(case[5], reqs[1].headers[case[4]])
    end)
  end
end)
