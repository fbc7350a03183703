-- The context reaches the REPL through a file, as a str, dict or list.
local H = require("helpers")
local core = require("rlm.core")
local fence = H.fence

describe("the context", function()
  after_each(H.assert_clean)

  it("arrives as a str with every byte of UTF-8 intact", function()
    local text = "caf\195\169 \226\130\172 line\nnext\0null"
    local result = H.run({
      context = text,
      root_llm = H.script({ fence("FINAL(repr((type(context).__name__, len(context), context[3], context[-4:])))") }),
      guardrails = false,
    })
    assert.are.equal("('str', 21, 'é', 'null')", result.answer)
  end)

  it("arrives as a dict from a table with keys", function()
    local result = H.run({
      context = { title = "t", items = { 1, 2, 3 } },
      root_llm = H.script({ fence("FINAL(f\"{type(context).__name__} {sorted(context)} {sum(context['items'])}\")") }),
    })
    assert.are.equal("dict ['items', 'title'] 6", result.answer)
  end)

  it("arrives as a list from a sequence", function()
    local result = H.run({
      context = { "a", "b", "c" },
      root_llm = H.script({ fence("FINAL(type(context).__name__ + ':' + ''.join(context))") }),
    })
    assert.are.equal("list:abc", result.answer)
  end)

  it("loads a 100 MB string", function()
    local mb = tonumber(os.getenv("RLM_SPEC_BIG_MB") or "100")
    local line = ("0123456789abcdef"):rep(4) .. "\n" -- 65 bytes
    local text = line:rep(math.floor(mb * 2 ^ 20 / #line)) .. "NEEDLE"
    local t0 = core.now_ms()
    local s = H.session({
      context = text,
      max_rss_bytes = 0,
      root_llm = H.script({ fence("FINAL(f'{len(context)} {context.rfind(\"NEEDLE\")}')") }),
    })
    local result, err = s:run()
    local elapsed = core.now_ms() - t0
    s:close()
    assert.is_nil(err, err and tostring(err))
    assert.are.equal(("%d %d"):format(#text, #text - 6), result.answer)
    print(("\n# %s: %d MB context to answer in %.0f ms"):format(H.lua_name(), mb, elapsed))
  end)
end)
