-- Host tools, typed answers and the fallback in the trajectory log and
-- its page: a real session writes the JSONL, rlm.view renders it.
local H = require("helpers")
local count = H.count
local read = H.read_file
local log = require("rlm.log")
local view = require("rlm.view")
local cjson = require("cjson")
local fence = H.fence

describe("host tools in the log and the viewer", function()
  after_each(H.assert_clean)

  it("logs every tool call, and the page shows the first 50 of a block and a count", function()
    local path = H.tmpdir .. "-tools.jsonl"
    local result, err = H.run({
      on_event = log.jsonl(path),
      tools = { kv = function(args)
        if args[1] == "missing" then
          error("no key missing")
        end
        return { key = args[1], n = #args[1] }
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
