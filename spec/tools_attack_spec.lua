-- A hostile driver and the host tools: the REPL's code writes tool_call
-- lines to the protocol pipe itself. Whatever it writes, the host ends with
-- a structured error (or answers with one), never a raise, a hang or a
-- host that grows.
local H = require("helpers")
local fence = H.fence

-- Under make check the sanitizer's quarantine keeps freed memory resident:
-- the bounds there are four times these (a flood that is not bounded grows
-- by gigabytes either way).
local SLACK = (os.getenv("RLM_SPEC_PRELOAD") or "") ~= "" and 4 or 1

local function host_rss_kb()
  return tonumber(H.sh("grep VmRSS /proc/" .. H.pid() .. "/status | awk '{print $2}'"))
end

local calls = 0
local function hostile(code, opts)
  calls = 0
  local o = {
    guardrails = false,
    tools = { t = function(first)
      calls = calls + 1
      return first or "ok"
    end },
    root_llm = H.script({ fence("import os, sys\n" .. code), fence("FINAL('survived')") }),
  }
  for k, v in pairs(opts or {}) do
    o[k] = v
  end
  return H.run(o)
end

-- A tool_call line with the given JSON fields after the type.
local function line(fields)
  return "os.write(1, b'{\"type\":\"tool_call\"," .. fields .. "}\\n')"
end

describe("a hostile driver's tool calls", function()
  after_each(H.assert_clean)

  local cases = {
    -- what the code writes, the error kind, a pattern of the message, options
    { "an unknown tool", line('"id":1,"name":"nope","args":[]'), "protocol_error", "tool \"nope\" the host does not have" },
    { "a tool call to a session without tools", line('"id":1,"name":"t","args":[]'), "protocol_error",
      "does not have", { tools = false } },
    { "a name that is not a string", line('"id":1,"name":7,"args":[]'), "protocol_error", "malformed" },
    { "no name", line('"id":1,"args":[]'), "protocol_error", "malformed" },
    { "args that are an object", line('"id":1,"name":"t","args":{"a":1}'), "protocol_error", "malformed" },
    { "args that are a string", line('"id":1,"name":"t","args":"x"'), "protocol_error", "malformed" },
    { "kwargs that are a list", line('"id":1,"name":"t","args":[],"kwargs":[1,2]'), "protocol_error", "malformed" },
    { "huge args", "os.write(1, b'{\"type\":\"tool_call\",\"id\":1,\"name\":\"t\",\"args\":[\"' + b'x' * 70000 + b'\"]}\\n')",
      "protocol_error", "longer than sandbox.max_message_bytes", { sandbox = { max_message_bytes = 65536 } } },
    { "args of too many JSON values", "os.write(1, b'{\"type\":\"tool_call\",\"id\":1,\"name\":\"t\",\"args\":[' + b'0,' * 70000 + b'0]}\\n')",
      "protocol_error", "JSON values" },
    { "a second call before the first is answered",
      "os.write(1, (b'{\"type\":\"tool_call\",\"id\":1,\"name\":\"t\",\"args\":[]}\\n') * 2)",
      "protocol_error", "before its last one was answered", nil, 1 }, -- the first may be made
    { "a tool_result (the host's message)", "os.write(1, b'{\"type\":\"tool_result\",\"id\":1,\"value\":1}\\n')",
      "protocol_error", "unknown message type" },
  }
  for _, c in ipairs(cases) do
    it("ends with " .. c[3] .. " on " .. c[1], function()
      local opts = c[5]
      if opts and opts.tools == false then
        local result, err = H.run({ guardrails = false,
          root_llm = H.script({ fence("import os\n" .. c[2]), fence("FINAL('survived')") }) })
        assert.is_nil(result)
        assert.are.equal(c[3], err.kind)
        assert.matches(c[4], err.message, 1, true)
        return
      end
      local result, err = hostile(c[2], opts)
      assert.is_nil(result)
      assert.are.equal(c[3], err.kind)
      assert.matches(c[4], err.message, 1, true)
      assert.is_table(err.history)
      assert.is_true(calls <= (c[6] or 0))
    end)
  end

  for _, id in ipairs({ "1e999", "-1", "1.5", "2147483648", "\"7\"", "null" }) do
    it("ends with protocol_error on a tool call with the id " .. id, function()
      local result, err = hostile(line('"id":' .. id .. ',"name":"t","args":[]'))
      assert.is_nil(result)
      assert.are.equal("protocol_error", err.kind)
      assert.matches("malformed", err.message)
      assert.are.equal(0, calls)
    end)
  end

  -- The code speaks the protocol itself: 20,000 calls past max_tool_calls,
  -- each answered with an error, the tool called only max_tool_calls times,
  -- and the host's memory flat.
  local LOOP = [[
inp, out = sys.__stdin__.buffer, sys.__stdout__.buffer
errors = values = 0
for i in range(20000):
    out.write(b'{"type":"tool_call","id":%d,"name":"t","args":["%s"]}\n' % (100000 + i, b"y" * 200))
    out.flush()
    reply = inp.readline()
    if b'"error"' in reply:
        errors += 1
    elif b'"value"' in reply:
        values += 1
print("values", values, "errors", errors)
]]

  it("answers calls past max_tool_calls with an error, calls the tool no more, and stays bounded", function()
    hostile("x = 1", { max_tool_calls = 5 }) -- warm up: the first session's allocations
    collectgarbage()
    collectgarbage()
    local before, heap_before = host_rss_kb(), collectgarbage("count")
    local result, err = hostile(LOOP, { max_tool_calls = 5, step_timeout_ms = 120000 })
    collectgarbage()
    collectgarbage()
    -- Nothing is kept per call (the Lua heap after a full collection), and
    -- the process's RSS, which keeps the collector's slack, stays bounded.
    local grown, kept = host_rss_kb() - before, collectgarbage("count") - heap_before
    assert.is_nil(err)
    assert.are.equal("survived", result.answer)
    assert.matches("values 5 errors 19995", result.history[1].stdout, 1, true)
    assert.are.equal(5, calls)
    assert.is_true(kept < 1024, ("the Lua heap kept %.0f KiB"):format(kept))
    assert.is_true(grown < 48 * 1024 * SLACK, ("the host grew by %d KiB"):format(grown))
  end)

  -- The answers pile up in the host's write queue (bounded by the core at
  -- 256 MiB) until the driver, at the next exec, finds a tool_result where
  -- it expected an exec, and gives up.
  it("ends with a structured error when the code floods tool calls without reading the answers", function()
    collectgarbage()
    local before = host_rss_kb()
    local result, err = hostile([[
out = sys.__stdout__.buffer
msg = b'{"type":"tool_call","id":%d,"name":"t","args":[]}\n'
for i in range(50000):
    out.write(msg % (100 + i))
out.flush()
]], { max_tool_calls = 0, step_timeout_ms = 60000 })
    -- Twice: the session's finalizer makes the allocator's trim, which the
    -- next collection runs (rlm/init.lua); the baseline before was taken
    -- after earlier sessions' trims, so an untrimmed heap read 49 MiB here
    -- in a full suite's process.
    collectgarbage()
    collectgarbage()
    local grown = host_rss_kb() - before
    assert.is_nil(result)
    assert.are.equal("protocol_error", err.kind)
    assert.are.equal(0, calls)
    assert.is_true(grown < 32 * 1024 * SLACK, ("the host grew by %d KiB"):format(grown))
  end)
end)
