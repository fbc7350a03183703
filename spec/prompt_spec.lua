-- The prompt: what docs/prompt.md shows is what prompt.lua and feedback.lua make; the
-- context described by characters and item lengths; option system_prompt.
local H = require("helpers")
local prompt = require("rlm.engine.prompt")
local prompt_doc = require("helpers.prompt_doc")
local rlm = require("rlm")
local fence = H.fence

local root = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/[^/]*$") or "."

describe("the prompt", function()
  describe("docs/prompt.md", function()
    it("shows the exact text prompt.lua and feedback.lua make, block by block", function()
      local f = assert(io.open(root .. "/docs/prompt.md", "rb"))
      local said = prompt_doc.read(f:read("*a"))
      f:close()
      for _, b in ipairs(prompt_doc.blocks()) do
        assert.are.equal(b[2], said[b[1]], "docs/prompt.md block '" .. b[1] .. "' differs from the text the engine makes: "
          .. "run spec/helpers/prompt_doc.lua docs/prompt.md (see the document's head)")
      end
    end)

    it("is what the root model really reads", function()
      local seen
      H.run({ context = ("é"):rep(1234567), root_llm = function(messages)
        seen = messages
        return fence("FINAL(1)")
      end })
      assert.are.equal(prompt_doc.blocks()[1][2], seen[1].content)
    end)
  end)

  describe("the context's description", function()
    local cases = {
      { "counts a str in characters, not bytes", "héllo wörld", "a str of 11 characters" },
      { "gives a list's total and each item's length", { "alpha", "beta", "gamma delta" },
        "a list of 3 items, 20 characters in all; item lengths: 5, 4, 11" },
      { "gives a dict's lengths by key", { b = "xx", a = "été" },
        'a dict of 2 keys, 5 characters in all; value lengths: "a": 3, "b": 2' },
      { "counts non-str items as their JSON text", { { 1, 2 }, "ab" },
        "a list of 2 items, 7 characters in all; item lengths (str items as text, others as JSON): 5, 2" },
      { "says an empty dict is empty", {}, "an empty dict" },
    }
    for _, case in ipairs(cases) do
      it(case[1], function()
        assert.are.equal(case[3], prompt.describe(case[2]))
      end)
    end

    it("counts a long str's characters as a byte at a time would, bytes that are not UTF-8 included", function()
      -- rlm.core counts eight bytes at a time, 255 words to a sum.
      local pieces = { "a", "é", "☃", "😀", "\128", "\255", "\192" }
      local function count(s) -- a byte that is not 10xxxxxx starts a character
        local n = 0
        for i = 1, #s do
          local b = s:byte(i)
          n = n + ((b < 0x80 or b >= 0xC0) and 1 or 0)
        end
        return n
      end
      local t = {}
      for i = 1, 9000 do
        t[i] = pieces[(i * 7) % #pieces + 1]
      end
      local text = table.concat(t)
      local chars = count(text)
      assert.are.equal(("a str of %s characters"):format(tostring(chars):reverse():gsub("(%d%d%d)", "%1,")
        :reverse():gsub("^,", "")), prompt.describe(text))
      for _, cut in ipairs({ 1, 7, 8, 9, 2039, 2040, 2041, #text - 1 }) do
        local head = text:sub(1, cut)
        assert.are.equal(count(head), select(2, require("rlm.core").utf8_prefix(head, 2 ^ 53)), cut)
      end
    end)

    it("sums up a long list after its first five items", function()
      local t = {}
      for i = 1, 101 do
        t[i] = ("x"):rep(i)
      end
      assert.are.equal("a list of 101 items, 5,151 characters in all; item lengths: 1, 2, 3, 4, 5, ... "
        .. "(the first 5 of 101; least 1, median 51, most 101)", prompt.describe(t))
    end)

    it("reaches the system prompt of a session over a list", function()
      local s = rlm.Session.new(H.opts({ context = { "a", "bb" } }))
      assert.matches("as the variable `context`: a list of 2 items, 3 characters in all; item lengths: 1, 2.",
        s.conversation.messages[1].content, 1, true)
      s:close()
    end)

    it("describes a nested session's JSON context the same way", function()
      local child_system
      local result = H.run({
        max_depth = 2,
        root_llm = function(messages)
          if messages[2].content:find("child question", 1, true) then
            child_system = messages[1].content
            return fence("FINAL('child done')")
          end
          return fence("FINAL(rlm_query('child question', ['a', 'bbb']))")
        end,
      })
      assert.are.equal("child done", result.answer)
      assert.matches("a list of 2 items, 4 characters in all; item lengths: 1, 3", child_system, 1, true)
    end)
  end)

  describe("option system_prompt", function()
    it("replaces the system prompt with a string", function()
      local seen
      H.run({ system_prompt = "You are terse.", root_llm = function(m)
        seen = m[1].content
        return fence("FINAL(1)")
      end })
      assert.are.equal("You are terse.", seen)
    end)

    it("gives a function the default text and the depth, and takes what it returns", function()
      local seen, infos = {}, {}
      local result = H.run({
        max_depth = 2,
        system_prompt = function(default, info)
          infos[#infos + 1] = info
          return default .. "\n\nDepth " .. info.depth .. "."
        end,
        root_llm = function(messages)
          seen[#seen + 1] = messages[1].content
          if messages[1].content:find("Depth 1.", 1, true) then
            return fence("FINAL('inner')")
          end
          return fence("FINAL(rlm_query('sub task'))")
        end,
      })
      assert.are.equal("inner", result.answer)
      assert.are.same({ 0, 1 }, { infos[1].depth, infos[2].depth })
      assert.matches("^You answer a question about a context", seen[1])
      assert.matches("Depth 0.$", seen[1])
      assert.matches("as the variable `context`: a str of 11 characters", seen[1], 1, true)
    end)

    it("raises at Session.new, naming the option, when the function fails", function()
      assert.has_error(function()
        rlm.Session.new(H.opts({ system_prompt = function()
          return 42
        end }))
      end, "rlm.Session.new: option 'system_prompt' returned number, not a string")
      assert.has_error(function()
        rlm.Session.new(H.opts({ system_prompt = 42 }))
      end)
    end)

    it("fails a nested session with callback_error when the function raises there", function()
      local result = H.run({
        max_depth = 2,
        system_prompt = function(default, info)
          if info.depth > 0 then
            error("no prompt for children")
          end
          return default
        end,
        root_llm = H.script({ fence("try:\n    rlm_query('x')\nexcept Exception as e:\n    FINAL(str(e))") }),
      })
      assert.matches("rlm_query failed (callback_error): option 'system_prompt' raised", result.answer, 1, true)
    end)
  end)
end)
