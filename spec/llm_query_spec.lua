-- llm_query's fast path (the driver's protocol.quick_call for a lone call
-- with no model= hint, and the engine answering it inside its own resume
-- under run() and step()): the same limits, errors and text as the general
-- path.
local H = require("helpers")
local fence = H.fence

describe("llm_query on its fast path", function()
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
    local result, err = H.run({ max_message_bytes = 64 * 1024, root_llm = H.script({ fence(code) }),
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

  it("takes the general path for a str subclass and a model= hint", function()
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
end)
