-- What Session.new accepts, run() runs: every option at the top of its
-- range, the tightest max_message_bytes against the widest line a block can
-- make, the deepest context; and a budget callback's NaN, inf or negative
-- is a callback_error naming the callback, never a budget turned off.
local H = require("helpers")

local function deep(n)
  local t = { "leaf" }
  for _ = 2, n do
    t = { t }
  end
  return t
end

describe("every value Session.new accepts at the top of its range", function()
  local rows = {
    { "the clocks and max_iterations", { max_iterations = 10 ^ 6, step_timeout_ms = 2 ^ 31 - 1,
      sandbox = { start_timeout_ms = 2 ^ 31 - 1 }, max_wall_ms = 2 ^ 31 - 1 } },
    { "memory", { max_rss_bytes = 2 ^ 44, sandbox = { rss_poll_interval_ms = 60000 } } },
    { "sub-calls and tokens", { max_sub_calls = 2 ^ 31 - 1, max_concurrent_sub_calls = 4096, max_depth = 32,
      max_total_tokens = 2 ^ 50, max_sub_prompt_chars = 2 ^ 30 } },
    { "the session's files", { sandbox = { workdir_max_bytes = 2 ^ 40, workdir_max_files = 2 ^ 31 - 1 }, } },
    { "the line and the output", { sandbox = { max_message_bytes = 2 ^ 30 }, stdout_truncate_chars = 2 ^ 26 } },
    { "the smallest line", { sandbox = { max_message_bytes = 12 + 8192 }, stdout_truncate_chars = 1 } },
    { "a context 200 tables deep", { context = deep(200) } },
    { "a text context that is not UTF-8", { context = "a\255b" } },
  }
  for _, row in ipairs(rows) do
    it("runs: " .. row[1], function()
      local result, err = H.run(row[2])
      assert.is_nil(err)
      assert.equals("done", result.answer)
    end)
  end

  it("keeps a block's widest output and traceback within the smallest max_message_bytes", function()
    -- Each control character is 6 bytes as JSON: the output and the error
    -- at stdout_truncate_chars each are 12 of them per character.
    local code = "print('\\x01' * 5000)\nraise ValueError('\\x01' * 5000)"
    local seen
    local root = H.script({ H.fence(code), function(messages)
      seen = messages[#messages].content
      return H.fence("FINAL('after')")
    end })
    local result, err = H.run({ root_llm = root, stdout_truncate_chars = 2000, sandbox = { max_message_bytes = 12 * 2000 + 8192 } })
    assert.is_nil(err)
    assert.equals("after", result.answer)
    assert.matches("Error:", seen, 1, true)
  end)
end)

describe("a budget callback's number", function()
  local bad = { { "NaN", 0 / 0 }, { "inf", math.huge }, { "-1", -1 } }
  for _, b in ipairs(bad) do
    it("from cost.usd, " .. b[1] .. ", is a callback_error naming cost.usd", function()
      local result, err = H.run({ cost = { max_usd = 1, usd = function() return b[2] end } })
      assert.is_nil(result)
      assert.equals("callback_error", err.kind)
      assert.matches("cost.usd returned", err.message, 1, true)
    end)
    it("in root_llm's usage, " .. b[1] .. ", is a callback_error naming root_llm", function()
      local root = function()
        return H.fence("FINAL('done')"), { input_tokens = b[2], output_tokens = 1 }
      end
      local result, err = H.run({ max_total_tokens = 10 ^ 6, root_llm = root })
      assert.is_nil(result)
      assert.equals("callback_error", err.kind)
      assert.matches("root_llm returned a usage", err.message, 1, true)
    end)
    it("in llm_query's usage, " .. b[1] .. ", is a callback_error naming llm_query", function()
      local result, err = H.run({
        max_total_tokens = 10 ^ 6,
        root_llm = H.script({ H.fence("x = llm_query('hi')\nFINAL(x)") }),
        llm_query = function() return "ok", { input_tokens = 1, output_tokens = b[2] } end,
      })
      assert.is_nil(result)
      assert.equals("callback_error", err.kind)
      assert.matches("llm_query returned a usage", err.message, 1, true)
    end)
  end
end)
