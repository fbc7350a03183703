-- Host tools, typed answers and the fallback in the trajectory log and
-- its page: a real session writes the JSONL, rlm.view renders it.
local H = require("helpers")
local count = H.count
local read = H.read_file
local log = require("rlm.log")
local view = require("rlm.view")
local cjson = require("cjson")
local fence = H.fence

-- Under make check the sanitizer slows the host's CPU down.
local SLACK = (os.getenv("RLM_SPEC_PRELOAD") or "") ~= "" and 4 or 1

describe("host tools in the log and the viewer", function()
  after_each(H.assert_clean)

  it("logs every tool call, and the page shows the first 50 of a block and a count", function()
    local path = H.tmpdir .. "-tools.jsonl"
    local result, err = H.run({
      on_event = log.jsonl(path),
      tools = { kv = function(key)
        if key == "missing" then
          error("no key missing")
        end
        return { key = key, n = #key }
      end },
      answer_schema = { type = "integer" },
      root_llm = H.script({
        fence("for i in range(120):\n    kv('k%d' % i)\ntry:\n    kv('missing')\nexcept ToolError:\n    pass\n"
          .. "FINAL('not a number')"),
        fence("FINAL('120')"),
      }),
    })
    assert.is_nil(err)
    assert.are.equal(120, result.value)
    local text = read(path)
    os.remove(path)
    local tools, rejected = {}, nil
    for line in text:gmatch("[^\n]+") do
      local ev = cjson.decode(line)
      if ev.type == "tool_call" then
        tools[#tools + 1] = ev
      elseif ev.type == "answer_rejected" then
        rejected = ev
      end
    end
    assert.are.equal(121, #tools)
    assert.are.same({ "k7" }, tools[8].args)
    assert.are.same({ key = "k7", n = 2 }, tools[8].result)
    assert.are.equal("kv", tools[8].name)
    assert.are.equal("no key missing", tools[121].error)
    assert.matches("must be JSON", rejected.reason)
    local page = view.html(text)
    assert.are.equal(50, count(page, '<details class="sub tool">'))
    assert.matches("71 more tool calls", page, 1, true)
    assert.matches("121 tool calls", page, 1, true)
    assert.matches("event answer_rejected", page, 1, true)
  end)

  -- The REPL's code writes two tool calls of 16 MB each itself (800
  -- strings of 20000 bytes that are not UTF-8): the log wrote them whole, each byte as U+FFFD, 96 MB, and
  -- repaired them in Lua, 8.6 s of the host's CPU (Lua 5.4). The line's
  -- budget (max_event_bytes, 256 KiB) bounds both.
  it("costs the host's log and CPU a bounded amount per tool call, whatever the args hold", function()
    local path = H.tmpdir .. "-amplify.jsonl"
    local code = [=[
inp, out = sys.__stdin__.buffer, sys.__stdout__.buffer
s = b'"' + b'\xff' * 20000 + b'"'
args = b'[' + b','.join([s] * 800) + b']'
for i in range(2):
    out.write(b'{"type":"tool_call","id":%d,"name":"t","args":%s}\n' % (100000 + i, args))
    out.flush()
    inp.readline()
print(len(args))
]=]
    local calls = 0
    local on_event, writer = log.jsonl(path)
    local c0 = os.clock()
    local result, err = H.run({ guardrails = false, on_event = on_event, step_timeout_ms = 120000,
      tools = { t = function()
        calls = calls + 1
        return "ok"
      end },
      root_llm = H.script({ fence("import sys\n" .. code), fence("FINAL('survived')") }) })
    local cpu = os.clock() - c0
    writer:close()
    local text = read(path)
    os.remove(path)
    print(("\n# %s: 2 tool calls of %s bytes: %d bytes of log, %.2f s of host CPU"):format(H.lua_name(),
      result and result.history[1].stdout:match("%d+") or "?", #text, cpu))
    assert.is_nil(err)
    assert.are.equal("survived", result.answer)
    assert.are.equal(2, calls)
    local cut = 0
    for line in text:gmatch("[^\n]+") do
      if line:find('"type":"tool_call"', 1, true) then
        assert.is_true(#line <= 256 * 1024 + 1024, ("a line of %d bytes"):format(#line))
        assert.matches('"log_cut":"event"', line, 1, true)
        assert.matches('"name":"t"', line, 1, true)
        cut = cut + 1
      end
    end
    assert.are.equal(2, cut)
    assert.is_true(#text < 1024 * 1024, ("%d bytes of log"):format(#text))
    assert.is_true(cpu < 2 * SLACK, ("%.2f s of host CPU"):format(cpu))
  end)

  it("marks a partial answer on the page", function()
    local path = H.tmpdir .. "-partial.jsonl"
    local result = H.run({
      on_event = log.jsonl(path),
      max_iterations = 1,
      root_llm = function(messages)
        if messages[#messages].content:match("^The run is over") then
          return "my best guess"
        end
        return fence("x = 1")
      end,
    })
    assert.is_true(result.partial)
    local page = view.html(read(path))
    os.remove(path)
    assert.matches("partial answer", page, 1, true)
    assert.matches('<pre class="answer">my best guess</pre>', page, 1, true)
  end)
end)
