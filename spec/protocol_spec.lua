-- A hostile driver: the REPL's code writes to the protocol pipe itself.
-- Whatever it writes, the host ends with a structured error, never a crash.
local H = require("helpers")
local fence = H.fence

local function hostile(code, opts)
  local o = {
    guardrails = false,
    root_llm = H.script({ fence("import os\n" .. code), fence("FINAL('survived')") }),
  }
  for k, v in pairs(opts or {}) do
    o[k] = v
  end
  return H.run(o)
end

describe("the protocol", function()
  after_each(H.assert_clean)

  local cases = {
    -- what the code writes, the error kind, a pattern of the message
    { "garbage", "os.write(1, b'this is not json\\n')", "protocol_error", "not JSON" },
    { "an unknown message type", "os.write(1, b'{\"type\": \"bogus\"}\\n')", "protocol_error", "unknown message type" },
    { "a non-object", "os.write(1, b'[1, 2, 3]\\n')", "protocol_error", "not a message object" },
    { "a malformed exec_result", "os.write(1, b'{\"type\": \"exec_result\", \"id\": \"x\"}\\n')",
      "protocol_error", "malformed" },
    { "an exec_result whose syntax_error is not a boolean",
      "os.write(1, b'{\"type\":\"exec_result\",\"id\":1,\"stdout\":\"\",\"error\":\"x\",\"syntax_error\":\"yes\"}\\n')",
      "protocol_error", "malformed" },
    { "an exec_result for another exec", "os.write(1, b'{\"type\":\"exec_result\",\"id\":99,\"stdout\":\"\",\"error\":null,\"final\":null}\\n')",
      "protocol_error", "answered exec 99" },
    { "a hello in the middle of a step", "os.write(1, b'{\"type\":\"hello\",\"protocol\":1,\"python\":\"x\"}\\n')",
      "protocol_error", "expected" },
    { "a line longer than max_message_bytes", "os.write(1, b'x' * 70000)", "protocol_error", "longer than sandbox.max_message_bytes",
      { sandbox = { max_message_bytes = 65536 } } },
    { "deeply nested JSON", "os.write(1, b'[' * 15000 + b'\\n')", "protocol_error", "not JSON" },
    { "a line of too many JSON values", "os.write(1, b'[' + b'0,' * 70000 + b'0]\\n')", "protocol_error",
      "JSON values" },
    { "an exit", "os._exit(3)", "driver_exited", "exit status 3" },
    { "a kill", "import signal\nos.kill(os.getpid(), signal.SIGKILL)", "driver_exited", "" },
    { "a closed stdout", "os.close(1)\nos.close(2)\nimport time\ntime.sleep(0.3)\nos._exit(0)", "driver_exited", "" },
  }
  for _, c in ipairs(cases) do
    it("ends with " .. c[3] .. " on " .. c[1], function()
      local result, err = hostile(c[2], c[5])
      assert.is_nil(result)
      assert.are.equal(c[3], err.kind)
      assert.matches(c[4], err.message)
      assert.is_table(err.history)
    end)
  end

  -- Ids must be integers the host can print and compare.
  local ids = { "1e999", "-1e999", "NaN", "1152921504606846976", "-1", "1.5", "2147483648", "\"7\"" }
  for _, id in ipairs(ids) do
    for _, msg in ipairs({
      '{"type":"exec_result","id":%s,"stdout":"","error":null,"final":null}',
      '{"type":"llm_query","id":%s,"prompt":"p"}',
      '{"type":"llm_batch","id":%s,"prompts":["p"]}',
    }) do
      local line = msg:format(id)
      it("ends with protocol_error, never a raise, on " .. line, function()
        local result, err = hostile("os.write(1, b'" .. line:gsub("\\", "\\\\") .. "\\n')")
        assert.is_nil(result)
        assert.are.equal("protocol_error", err.kind)
        assert.matches("malformed", err.message .. (id == "NaN" and " malformed" or ""))
      end)
    end
  end

  it("turns an error raised while handling the driver's input into protocol_error", function()
    local protocol = require("rlm.base.protocol")
    local decode = protocol.decode
    local calls = 0
    protocol.decode = function(...)
      calls = calls + 1
      if calls == 5 then -- the first line of the first step
        error("boom")
      end
      return decode(...)
    end
    local ok, result, err = pcall(hostile, "print('hi')")
    protocol.decode = decode
    assert.is_true(ok, tostring(result))
    assert.is_nil(result)
    assert.are.equal("protocol_error", err.kind)
    assert.matches("boom", err.message)
  end)

  it("survives a flood of output on stderr", function()
    local result, err = hostile("for _ in range(2000):\n    os.write(2, b'e' * 4096)")
    assert.is_nil(err)
    assert.are.equal("survived", result.answer)
  end)
end)

describe("the driver's vars (the listing of list_vars)", function()
  local protocol = require("rlm.base.protocol")
  local ALLOWED = { vars = true, fatal = true }
  local rows = {
    { '{"type":"vars","id":3,"vars":[["a","int",null],["b","list",4]],"more":0}', true },
    { '{"type":"vars","id":3,"vars":[],"more":7}', true },
    { '{"type":"vars","id":3,"vars":[["a",1,null]],"more":0}', false },
    { '{"type":"vars","id":3,"vars":[["a","int",-1]],"more":0}', false },
    { '{"type":"vars","id":3,"vars":[["a","int",1.5]],"more":0}', false },
    { '{"type":"vars","id":3,"vars":[["a","int"]]}', false },
    { '{"type":"vars","id":3,"vars":"a: int","more":0}', false },
    { '{"type":"llm_query","id":3,"prompt":"during the listing"}', false },
  }
  for _, row in ipairs(rows) do
    it((row[2] and "takes " or "refuses ") .. row[1], function()
      local msg, why = protocol.decode(row[1], ALLOWED)
      if row[2] then
        assert.is_table(msg, why)
      else
        assert.is_nil(msg)
        assert.is_string(why)
      end
    end)
  end
end)

describe("a driver killed from outside", function()
  after_each(H.assert_clean)

  it("ends with driver_exited, naming the signal, mid-exec", function()
    local s
    s = H.session({
      root_llm = H.script({ fence("import time\ntime.sleep(30)") }),
      on_event = function(ev)
        -- Once the sandbox is up (step_start may come before: the first
        -- root call goes out as the sandbox starts).
        if ev.type == "sandbox_ready" then
          local tree = s.sandbox.driver:tree() -- the interpreter is the deepest process
          os.execute("(sleep 0.2; kill -9 " .. tree[#tree] .. ") &")
        end
      end,
    })
    local result, err = s:run()
    s:close()
    assert.is_nil(result)
    assert.are.equal("driver_exited", err.kind)
    assert.matches("signal 9", err.message)
  end)
end)
