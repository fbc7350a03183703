-- llm_query: its limits, its errors and the text both ways, under run()
-- and step() (the session's own loop answers each request at once).
local H = require("helpers")
local fence = H.fence

describe("llm_query", function()
  after_each(H.assert_clean)

  it("refuses a prompt past max_message_bytes in the code, before it goes out", function()
    local calls = 0
    local code = table.concat({
      "try:",
      "    llm_query('z' * (80 << 10))",
      "except ValueError as e:",
      "    msg = str(e)",
      "FINAL(msg + ' | ' + llm_query('small'))",
    }, "\n")
    local result, err = H.run({ sandbox = { max_message_bytes = 64 * 1024 }, root_llm = H.script({ fence(code) }),
      llm_query = function(p)
        calls = calls + 1
        return "got " .. #p
      end })
    assert.is_nil(err)
    assert.matches("more than the host accepts %(65536 bytes%)", result.answer)
    assert.matches("| got 5$", result.answer)
    assert.are.equal(1, calls) -- the long one never reached the host
    assert.are.equal(1, result.sub_calls)
  end)

  it("carries any text both ways, exactly", function()
    local texts = {}
    local code = table.concat({
      "s = 'q\"uo\\\\te\\n\\ttab \\x00\\x1f é ☃ 😀 \\u2028'",
      "r = llm_query(s)",
      "FINAL(repr(r == s + '!'))",
    }, "\n")
    local result, err = H.run({ root_llm = H.script({ fence(code) }), llm_query = function(p)
      texts[#texts + 1] = p
      return p .. "!"
    end })
    assert.is_nil(err)
    assert.are.equal("True", result.answer)
    assert.are.equal("q\"uo\\te\n\ttab \0\31 é ☃ 😀 \226\128\168", texts[1])
  end)

  it("sends a lone surrogate as U+FFFD", function()
    local seen
    local result, err = H.run({ root_llm = H.script({ fence("FINAL(llm_query('a\\ud800b'))") }),
      llm_query = function(p)
        seen = p
        return p
      end })
    assert.is_nil(err)
    assert.are.equal("a\239\191\189b", seen)
    assert.are.equal("a\239\191\189b", result.answer)
  end)

  it("raises the callback's failure in the code, and goes on", function()
    local n = 0
    local code = table.concat({
      "out = []",
      "for p in ['a', 'boom', 'nil', 'b']:",
      "    try:",
      "        out.append(llm_query(p))",
      "    except RuntimeError as e:",
      "        out.append('E:' + str(e)[:40])",
      "FINAL('|'.join(out))",
    }, "\n")
    local result, err = H.run({ root_llm = H.script({ fence(code) }), llm_query = function(p)
      n = n + 1
      if p == "boom" then
        error("boom!", 0)
      elseif p == "nil" then
        return nil
      end
      return p:upper()
    end })
    assert.is_nil(err)
    assert.are.equal("A|E:llm_query failed: boom!|E:llm_query failed: the callback returned |B", result.answer)
    assert.are.equal(4, n)
  end)

  it("takes a str subclass and a model= hint", function()
    local models = {}
    local code = table.concat({
      "class S(str): pass",
      "FINAL(llm_query(S('x')) + llm_query('y', model='m1'))",
    }, "\n")
    local result, err = H.run({ root_llm = H.script({ fence(code) }), llm_query = function(p, info)
      models[#models + 1] = tostring(info.model)
      return p
    end })
    assert.is_nil(err)
    assert.are.equal("xy", result.answer)
    assert.are.same({ "nil", "m1" }, models)
  end)

  it("counts against max_sub_calls", function()
    local code = "for i in range(5):\n    llm_query(str(i))"
    local result, err = H.run({ root_llm = H.script({ fence(code) }), max_sub_calls = 3, fallback = false })
    assert.is_nil(result)
    assert.are.equal("sub_call_budget", err.kind)
  end)

  it("ends the run as cancelled when the callback closes the session", function()
    local s
    s = H.session({ root_llm = H.script({ fence("llm_query('a')\nllm_query('b')") }), llm_query = function(p)
      s:close()
      return p
    end })
    local result, err = s:run()
    assert.is_nil(result)
    assert.are.equal("cancelled", err.kind)
  end)

  it("refuses a second driver from inside the callback", function()
    local s
    local code = "try:\n    llm_query('a')\nexcept RuntimeError as e:\n    FINAL(str(e))"
    s = H.session({ root_llm = H.script({ fence(code) }), llm_query = function()
      return s:step()
    end })
    local result, err = s:run()
    s:close()
    assert.is_nil(err)
    assert.matches("already being driven", result.answer)
  end)
end)

-- What the host makes of an llm_query line as a hostile driver may write
-- it: the prompt lua-cjson reads from it, and an llm_result line lua-cjson
-- reads back; or a protocol_error. The REPL's code (guardrails off) writes
-- a line to the protocol and hands back the host's answer line.
describe("an llm_query line from the driver", function()
  local cjson = require("cjson")
  after_each(H.assert_clean)

  local function py_bytes(s)
    return "b'" .. s:gsub(".", function(c)
      return ("\\x%02x"):format(c:byte())
    end) .. "'"
  end

  -- The answer line the host wrote for `line` (nil, err when the run
  -- failed), and the prompts the callback saw.
  local function exchange(line)
    local code = table.concat({
      "import os",
      "os.write(1, " .. py_bytes(line .. "\n") .. ")",
      "reply = b''",
      "while not reply.endswith(b'\\n'):",
      "    reply += os.read(0, 1 << 16)",
      "FINAL(reply.hex())",
    }, "\n")
    local seen = {}
    local result, err = H.run({ guardrails = false, fallback = false, root_llm = H.script({ fence(code) }),
      llm_query = function(p)
        seen[#seen + 1] = p
        return "re:" .. p
      end })
    if not result then
      return nil, err, seen
    end
    return (result.answer:gsub("%x%x", function(h)
      return string.char(tonumber(h, 16))
    end)), nil, seen
  end

  local SERVED = {
    { "plain text", '{"type":"llm_query","prompt":"hello","id":7}' },
    { "every short escape", [[{"type":"llm_query","prompt":"q\"b\\s\/ \b\f\n\r\t","id":1}]] },
    { "\\u escapes in either case, a surrogate pair, NUL",
      [[{"type":"llm_query","prompt":"\u00e9\u00E9\u2028\ud83d\ude00\uD83D\uDE00\u0000x","id":2}]] },
    { "raw UTF-8, raw control bytes and bytes that are not UTF-8", '{"type":"llm_query","prompt":"é\1\31\127\255","id":3}' },
    { "the largest id, and an empty prompt", '{"type":"llm_query","prompt":"","id":2147483647}' },
    { "id 0", '{"type":"llm_query","prompt":"z","id":0}' },
    -- Not the driver's own shape, JSON all the same.
    { "spaces", '{"type": "llm_query", "prompt": "x", "id": 4}' },
    { "another order", '{"id":5,"type":"llm_query","prompt":"x"}' },
    { "a model= hint", '{"type":"llm_query","prompt":"x","id":6,"model":"m"}' },
    { "an escaped key", [[{"type":"llm_query","prompt":"x","\u0069d":8}]] },
  }
  for _, case in ipairs(SERVED) do
    it("answers " .. case[1] .. " as lua-cjson reads it", function()
      local want = cjson.decode(case[2])
      local line, err, seen = exchange(case[2])
      assert.is_nil(err)
      assert.are.same({ want.prompt }, seen)
      local reply = cjson.decode(line)
      assert.are.equal("llm_result", reply.type)
      assert.are.equal(want.id, reply.id)
      assert.are.equal("re:" .. want.prompt, reply.text)
    end)
  end

  local REFUSED = {
    { "a lone high surrogate", [[{"type":"llm_query","prompt":"a\ud800b","id":1}]], "not JSON" },
    { "a lone low surrogate", [[{"type":"llm_query","prompt":"a\udc00","id":1}]], "not JSON" },
    { "a pair cut short", [[{"type":"llm_query","prompt":"\ud83d\u0041","id":1}]], "not JSON" },
    { "a bad escape", [[{"type":"llm_query","prompt":"\x41","id":1}]], "not JSON" },
    { "an id past 2^31 - 1", '{"type":"llm_query","prompt":"x","id":2147483648}', "malformed" },
    { "a leading zero", '{"type":"llm_query","prompt":"x","id":06}', "not JSON" },
    { "a negative id", '{"type":"llm_query","prompt":"x","id":-1}', "malformed" },
    { "an unterminated prompt", '{"type":"llm_query","prompt":"x,"id":1}', "not JSON" },
    { "text after the object", '{"type":"llm_query","prompt":"x","id":1}}', "not JSON" },
  }
  for _, case in ipairs(REFUSED) do
    it("ends the run with a protocol_error for " .. case[1], function()
      local line, err, seen = exchange(case[2])
      assert.is_nil(line)
      assert.are.equal("protocol_error", err.kind)
      assert.matches(case[3], err.message)
      assert.are.same({}, seen)
    end)
  end

  it("refuses a second call written before the first one's answer", function()
    local line = '{"type":"llm_query","prompt":"a","id":1}\n{"type":"llm_query","prompt":"b","id":2}'
    local result, err = exchange(line)
    assert.is_nil(result)
    assert.are.equal("protocol_error", err.kind)
    assert.matches("before its last one was answered", err.message)
  end)
end)

describe("text the host hands the code", function()
  after_each(H.assert_clean)

  it("reaches it with U+FFFD for each byte that is not UTF-8, and the run goes on", function()
    local code = "r = llm_query('x')\nFINAL(repr(r))"
    local result, err = H.run({ root_llm = H.script({ fence(code) }), llm_query = function()
      return "ab\255cd\237\160\128e"
    end })
    assert.is_nil(err)
    assert.are.equal("'ab\239\191\189cd\239\191\189\239\191\189\239\191\189e'", result.answer)
  end)

  it("runs code that is not UTF-8, the bytes read as U+FFFD", function()
    local result, err = H.run({ root_llm = H.script({ fence("FINAL(repr('a\255b'))") }) })
    assert.is_nil(err)
    assert.are.equal("'a\239\191\189b'", result.answer)
  end)

  it("gives every byte of an answer back exactly, escapes and all", function()
    local all = {}
    for b = 1, 127 do
      all[#all + 1] = string.char(b)
    end
    all = table.concat(all) .. "é☃"
    local code = "r = llm_query('x')\nFINAL(r.encode('utf-8').hex())"
    local result, err = H.run({ root_llm = H.script({ fence(code) }), llm_query = function()
      return all
    end })
    assert.is_nil(err)
    assert.are.equal(all, (result.answer:gsub("%x%x", function(h)
      return string.char(tonumber(h, 16))
    end)))
  end)
end)
