-- rlm_query: nested sessions, each in a sandbox of its own, under one budget
-- for the whole tree.
local H = require("helpers")
local fence = H.fence

local L = require("helpers.luv")
local luv_adapter = L and require("rlm.adapters.luv")

-- One root model for the whole tree, as in a real run: the root session
-- follows `root_items`; a nested session, which gets its prompt as its
-- question, gets nested(question, turn).
local function tree_model(root_items, nested)
  local root = H.script(root_items)
  return function(messages)
    local q = messages[2].content:match("^Question: (.-)\n\nStart by looking")
    if q then
      return nested(q, #messages / 2)
    end
    return root(messages)
  end
end

-- on_event into a list.
local function recorder()
  local events = {}
  return events, function(ev)
    events[#events + 1] = ev
  end
end

local function count(events, pred)
  local n = 0
  for _, ev in ipairs(events) do
    if pred(ev) then
      n = n + 1
    end
  end
  return n
end

-- The most nested sessions alive at once, from their events.
local function most_alive(events)
  local alive, most = 0, 0
  for _, ev in ipairs(events) do
    if ev.depth == 1 and ev.type == "session_start" then
      alive = alive + 1
      most = math.max(most, alive)
    elseif ev.depth == 1 and ev.type == "run_end" then
      alive = alive - 1
    end
  end
  return most
end

describe("rlm_query", function()
  after_each(H.assert_clean)

  it("is one llm_query of the prompt and the context at max_depth 1 (the default)", function()
    local prompts = {}
    local result = assert(H.run({
      root_llm = H.script({ fence("FINAL(rlm_query('what colour?', 'the sky is blue'))") }),
      llm_query = function(p)
        prompts[#prompts + 1] = p
        return "blue, said the sub-model"
      end,
    }))
    assert.are.equal("blue, said the sub-model", result.answer)
    assert.are.same({ "what colour?\n\nthe sky is blue" }, prompts)
    assert.are.equal(1, result.sub_calls)
  end)

  it("runs a depth-2 tree: the child calls llm_query, answers, and its sandbox is gone", function()
    local events, on_event = recorder()
    local seen = {}
    local result = assert(H.run({
      max_depth = 2,
      on_event = on_event,
      root_llm = tree_model({
        fence("a = rlm_query('count the vowels', 'banana split')\nprint(a)"),
        function()
          seen.after = { sandboxes = #H.settled_children(1) }
          return fence("FINAL('child said ' + a)")
        end,
      }, function(question, turn)
        assert.are.equal("count the vowels", question)
        if turn == 1 then
          -- The child's first root call goes out as its sandbox starts: the
          -- spawn is on rlm.core's thread, and may not have forked yet.
          seen.during = { sandboxes = #H.settled(H.children, function(kids)
            return #kids >= 2
          end) }
          return fence("n = llm_query('vowels in: ' + context)\nprint(n)")
        end
        return fence("FINAL(n + ' vowels')")
      end),
      llm_query = function(p)
        assert.are.equal("vowels in: banana split", p)
        return "4"
      end,
    }))
    assert.are.equal("child said 4 vowels", result.answer)
    assert.are.same({ sandboxes = 2 }, seen.during)
    assert.are.same({ sandboxes = 1 }, seen.after)
    assert.are.equal(2, result.sub_calls) -- the rlm_query and the child's llm_query

    local child_start = count(events, function(ev)
      return ev.type == "session_start" and ev.depth == 1 and ev.query == "count the vowels"
    end)
    assert.are.equal(1, child_start)
    local inner = count(events, function(ev)
      return ev.type == "sub_query" and ev.depth == 1 and ev.response == "4" and not ev.recursive
    end)
    assert.are.equal(1, inner)
    local outer = count(events, function(ev)
      return ev.type == "sub_query" and ev.depth == 0 and ev.recursive and ev.response == "4 vowels"
        and ev.iterations == 2 and ev.latency_ms > 0
    end)
    assert.are.equal(1, outer)
  end)

  it("gives a child a JSON context as a Python value", function()
    local result = assert(H.run({
      max_depth = 2,
      root_llm = tree_model({ fence("FINAL(rlm_query('sum', {'xs': [1, 2, 3], 'name': 'é'}))") },
        function()
          return fence("FINAL('%s %d' % (context['name'], sum(context['xs'])))")
        end),
    }))
    assert.are.equal("é 6", result.answer)
  end)

  it("gives a child its prompt as its context when none is given", function()
    local result = assert(H.run({
      max_depth = 2,
      root_llm = tree_model({ fence("FINAL(rlm_query('abc'))") }, function()
        return fence("FINAL(context.upper())")
      end),
    }))
    assert.are.equal("ABC", result.answer)
  end)

  -- A child's fatal error, and what made it: each reaches the parent's code
  -- as an exception.
  for _, case in ipairs({
    { "step timeout", "step_timeout", { step_timeout_ms = 1500, sandbox = { interrupt_grace_ms = 300 } },
      "while True:\n    try:\n        while True:\n            pass\n    except:\n        pass" },
    { "memory kill", "memory_limit", { max_rss_bytes = 128 * 2 ^ 20, sandbox = { rss_poll_interval_ms = 10 } },
      "b = []\nwhile True:\n    b.append(bytearray(1 << 20))" },
  }) do
    local what, kind, limits, child_code = case[1], case[2], case[3], case[4]
    it("turns a child's " .. what .. " into an exception in the parent's code", function()
      local opts = {
        max_depth = 2,
        root_llm = tree_model({ fence([[
try:
    rlm_query('go')
except RuntimeError as e:
    FINAL('caught: ' + str(e))]]) }, function()
          return fence(child_code)
        end),
      }
      for k, v in pairs(limits) do
        opts[k] = v
      end
      local result = assert(H.run(opts))
      assert.matches("^caught: rlm_query failed %(" .. kind .. "%)", result.answer)
    end)
  end

  it("runs a batch of children side by side and answers in order", function()
    local events, on_event = recorder()
    local result = assert(H.run({
      max_depth = 2,
      on_event = on_event,
      root_llm = tree_model({ fence("FINAL('|'.join(rlm_query_batched(['a', 'b', 'c', 'd'])))") },
        function()
          return fence("import time\ntime.sleep(0.3)\nFINAL(context * 2)")
        end),
    }))
    assert.are.equal("aa|bb|cc|dd", result.answer)
    assert.are.equal(4, most_alive(events))
  end)

  it("keeps at most max_concurrent_sub_calls children alive at once", function()
    local events, on_event = recorder()
    local result = assert(H.run({
      max_depth = 2,
      max_concurrent_sub_calls = 2,
      on_event = on_event,
      root_llm = tree_model({ fence("FINAL(len(rlm_query_batched([str(i) for i in range(5)])))") },
        function()
          return fence("FINAL(context)")
        end),
    }))
    assert.are.equal("5", result.answer)
    assert.are.equal(2, most_alive(events))
    assert.are.equal(5, count(events, function(ev)
      return ev.type == "run_end" and ev.depth == 1 and ev.ok
    end))
  end)

  -- max_concurrent_sub_calls holds the nested sessions alive over the
  -- whole tree too (it was max_live_sandboxes): a session queues its own
  -- children past it, and a grandchild past it is refused.
  describe("max_concurrent_sub_calls over the tree", function()
    it("raises in the code for a nested call past it, which the code may catch", function()
      local result, err = H.run({
        max_depth = 3,
        max_concurrent_sub_calls = 1,
        root_llm = tree_model({ fence("FINAL(rlm_query('x'))") }, function()
          return fence("try:\n    rlm_query('y')\nexcept Exception as e:\n"
            .. "    FINAL(type(e).__name__ + ': ' + str(e))")
        end),
      })
      assert.is_nil(err)
      assert.matches("rlm_query refused: the run already has 1 nested sessions alive, max_concurrent_sub_calls (1)",
        result.answer, 1, true)
    end)

    -- At max_depth 3, two children that each ask for two more find one
    -- room left between them.
    it("holds over the whole tree", function()
      local result, err = H.run({
        max_depth = 3,
        max_concurrent_sub_calls = 3,
        root_llm = tree_model({ fence("FINAL('|'.join(rlm_query_batched(['a', 'b'])))") }, function(question)
          if #question == 1 then
            return fence("FINAL(','.join(rlm_query_batched([context + '1', context + '2'])))")
          end
          return fence("import time\ntime.sleep(1)\nFINAL('leaf')")
        end),
      })
      assert.is_nil(err)
      local leaves = select(2, result.answer:gsub("leaf", ""))
      local refused = select(2, result.answer:gsub("max_concurrent_sub_calls %(3%)", ""))
      assert.are.equal(4, leaves + refused, result.answer)
      assert.is_true(leaves >= 1 and leaves <= 2, result.answer)
    end)
  end)

  -- A child that ended keeps its sandbox till the last answer of its call
  -- has gone (rlm.nested), unwatched: what it does meanwhile (a thread
  -- that writes lines, then exits) wakes no loop, and its sandbox goes
  -- with the batch.
  it("leaves a child that ended unwatched till its batch is answered, then kills it", function()
    local core = require("rlm.core")
    local seen = {}
    local c0 = core.thread_cpu_ms()
    local result = assert(H.run({
      max_depth = 2,
      guardrails = false,
      root_llm = tree_model({
        fence("r = rlm_query_batched(['noisy', 'slow'])\nprint(r)"),
        function()
          seen.after = #H.settled_children(1)
          return fence("FINAL('|'.join(r))")
        end,
      }, function(question)
        if question == "noisy" then
          return fence("import os, threading, time\n"
            .. "def spam():\n    time.sleep(0.2)\n    for _ in range(3000):\n        os.write(1, b'{\"type\":\"exec_result\"}\\n')\n"
            .. "        time.sleep(0.0002)\n    os._exit(3)\n"
            .. "threading.Thread(target=spam).start()\nFINAL('n')")
        end
        return fence("import time\ntime.sleep(1.5)\nFINAL('s')")
      end),
    }))
    assert.are.equal("n|s", result.answer)
    assert.are.equal(1, seen.after) -- the root's own sandbox
    -- Watched, the noisy child's descriptor would wake the root's wait at
    -- once for the whole 1.5 s.
    assert.is_true(core.thread_cpu_ms() - c0 < 300, "the host's thread spun on an ended child")
  end)

  it("passes a child's batch to llm_query_batch under run(), whole", function()
    local batches = {}
    local result = assert(H.run({
      max_depth = 2,
      llm_query_batch = function(prompts)
        batches[#batches + 1] = #prompts
        local out = {}
        for i, p in ipairs(prompts) do
          out[i] = p .. "!"
        end
        return out
      end,
      root_llm = tree_model({ fence("FINAL(rlm_query('go'))") }, function()
        return fence("FINAL(','.join(llm_query_batched(['x', 'y', 'z'])))")
      end),
    }))
    assert.are.equal("x!,y!,z!", result.answer)
    assert.are.same({ 3 }, batches)
  end)

  it("gives a failed child its error in its slot of a batch", function()
    local result = assert(H.run({
      max_depth = 2,
      root_llm = tree_model({ fence([[
a = rlm_query_batched(['ok', 'bad'])
FINAL(repr([(isinstance(x, SubCallError), x) for x in a]))]]) }, function(q)
        if q == "bad" then
          error("the model is down")
        end
        return fence("FINAL('fine')")
      end),
    }))
    assert.matches("%(False, 'fine'%), %(True, 'Error: rlm_query failed %(callback_error%): root_llm raised",
      result.answer)
  end)

  it("says what a wrong argument is, in the code", function()
    local result = assert(H.run({
      max_depth = 2,
      root_llm = H.script({ fence([[
out = []
for args in [(1,), ('p', object()), ]:
    try:
        rlm_query(*args)
    except TypeError as e:
        out.append(str(e))
try:
    rlm_query_batched(['a', 'b'], ['only one'])
except TypeError as e:
    out.append(str(e))
FINAL(' / '.join(out))]]) }),
    }))
    assert.matches("rlm_query%(%) takes a str prompt", result.answer)
    assert.matches("context must be a str or JSON%-able", result.answer)
    assert.matches("contexts must be a list as long as prompts", result.answer)
  end)

  it("goes three levels deep at max_depth 3, and no deeper", function()
    local events, on_event = recorder()
    local prompts = {}
    local result = assert(H.run({
      max_depth = 3,
      on_event = on_event,
      llm_query = function(p)
        prompts[#prompts + 1] = p
        return "leaf"
      end,
      root_llm = tree_model({ fence("FINAL('root<' + rlm_query('one') + '>')") }, function(q)
        if q == "one" then
          return fence("FINAL('one<' + rlm_query('two') + '>')")
        end
        return fence("FINAL('two<' + rlm_query('three', 'ctx') + '>')")
      end),
    }))
    assert.are.equal("root<one<two<leaf>>>", result.answer)
    assert.are.same({ "three\n\nctx" }, prompts) -- depth 3 is max_depth: a plain sub-call
    assert.are.equal(1, count(events, function(ev)
      return ev.type == "session_start" and ev.depth == 2
    end))
  end)

  it("closes an exec's children when a hostile driver ends the exec without waiting", function()
    local started = false
    local result = assert(H.run({
      max_depth = 2,
      guardrails = false,
      root_llm = tree_model({
        fence("import os, time\nos.write(1, b'{\"type\":\"rlm_query\",\"id\":99,\"prompt\":\"slow\"}\\n')\n"
          .. "time.sleep(1)"),
        fence("FINAL('after')"),
      }, function()
        started = true
        return fence("import time\ntime.sleep(30)")
      end),
    }))
    assert.are.equal("after", result.answer)
    assert.is_true(started)
  end)

  it("closes the children when the parent's driver dies while they run", function()
    local _, err = H.run({
      max_depth = 2,
      guardrails = false,
      root_llm = tree_model({ fence([[
import os, threading, time
threading.Thread(target=lambda: (time.sleep(1), os._exit(3))).start()
rlm_query('slow')]]) }, function()
        return fence("import time\ntime.sleep(30)")
      end),
    })
    assert.are.equal("driver_exited", err.kind)
  end)

  it("refuses a call made before the last one was answered (one call's prompts held at most)", function()
    for _, second in ipairs({ "llm_query", "rlm_query" }) do
      local calls = 0
      local _, err = H.run({
        guardrails = false,
        max_depth = 2,
        llm_query = function()
          calls = calls + 1
          return "x"
        end,
        root_llm = tree_model({ fence(("import os, time\n"
          .. "os.write(1, b'{\"type\":\"llm_batch\",\"id\":1,\"prompts\":[\"a\",\"b\"]}\\n"
          .. "{\"type\":\"%s\",\"id\":2,\"prompt\":\"c\"}\\n')\ntime.sleep(5)"):format(second)) },
          function()
            return fence("FINAL('child')")
          end),
      })
      assert.are.equal("protocol_error", err.kind, second)
      assert.matches("before its last one was answered", err.message)
    end
  end)

  it("refuses a malformed rlm_query from the driver as a protocol error", function()
    for _, line in ipairs({
      '{"type":"rlm_query","id":1}',
      '{"type":"rlm_query","id":1,"prompt":"p","context":"c","format":"xml"}',
      '{"type":"rlm_query","id":1,"prompt":"p","context":{"a":1},"format":"json"}',
      '{"type":"rlm_batch","id":1,"queries":[]}',
      '{"type":"rlm_batch","id":1,"queries":[{"prompt":1}]}',
    }) do
      local _, err = H.run({
        guardrails = false,
        max_depth = 2,
        root_llm = H.script({ fence(("import os, time\nos.write(1, b'%s\\n')\ntime.sleep(5)"):format(line)) }),
      })
      assert.are.equal("protocol_error", err.kind, line)
    end
  end)
end)

describe("one budget over the tree", function()
  after_each(H.assert_clean)

  -- Each case spends a max_sub_calls of 10 in its own way; every nested
  -- session started and every llm_query made counts as one.
  local cases = {
    { "an llm_query batch of 16 at depth 0", 1, "x = llm_query_batched([str(i) for i in range(16)])", nil },
    { "an rlm_query batch of 16 past max_depth (one llm_query each)", 1,
      "x = rlm_query_batched([str(i) for i in range(16)])", nil },
    { "an llm_query batch of 16 in a child at depth 1", 2, "x = rlm_query('go')",
      "x = llm_query_batched([str(i) for i in range(16)])" },
    { "batches of 16 at depth 0 and depth 1", 2,
      "y = llm_query_batched([str(i) for i in range(4)])\nx = rlm_query('go')",
      "x = llm_query_batched([str(i) for i in range(16)])" },
    { "two children, each with a batch of 16", 2, "x = rlm_query_batched(['go', 'go'])",
      "x = llm_query_batched([str(i) for i in range(16)])" },
    { "16 children, each with one llm_query", 2,
      "x = rlm_query_batched(['go'] * 16)", "x = llm_query('one')" },
  }
  for _, case in ipairs(cases) do
    local name, depth, root_code, child_code = case[1], case[2], case[3], case[4]
    it("dispatches exactly 10 with max_sub_calls = 10: " .. name, function()
      local events, on_event = recorder()
      local llm_calls = 0
      local result = assert(H.run({
        max_depth = depth,
        max_sub_calls = 10,
        on_event = on_event,
        llm_query = function(p)
          llm_calls = llm_calls + 1
          return p
        end,
        root_llm = tree_model({ fence(root_code .. "\nFINAL('ok')") }, function()
          return fence((child_code or "") .. "\nFINAL('ok')")
        end),
      }))
      local children = count(events, function(ev)
        return ev.type == "session_start" and ev.depth == 1
      end)
      assert.are.equal(10, llm_calls + children)
      assert.are.equal(10, result.sub_calls)
    end)
  end

  it("counts the tokens of every depth against max_total_tokens", function()
    local result, err = H.run({
      max_depth = 2,
      max_total_tokens = 250,
      fallback = false,
      root_llm = function(messages)
        local q = messages[2].content:match("^Question: (%S+)")
        local text = q and fence("FINAL('child')") or fence("print(rlm_query('go'))")
        return text, { input_tokens = 50, output_tokens = 50 }
      end,
    })
    -- root turn 1 (100), the child's turn (200), root turn 2 (300): over.
    assert.is_nil(result)
    assert.are.equal("cost_budget", err.kind)
    assert.are.equal(300, err.tokens)
  end)
end)

describe("max_wall_ms", function()
  after_each(H.assert_clean)

  it("stops a run that takes too long, even inside a step", function()
    local t0 = require("rlm.core").now_ms()
    local _, err = H.run({
      max_wall_ms = 1500,
      fallback = false,
      root_llm = H.script({ fence("while True:\n    pass") }),
    })
    local took = require("rlm.core").now_ms() - t0
    assert.are.equal("cost_budget", err.kind)
    assert.matches("max_wall_ms", err.message)
    assert.are.equal(1500, err.max_wall_ms)
    assert.is_true(took < 1500 + 2000, "took " .. took .. " ms")
  end)

  it("holds over the tree: a child that spins ends the whole run in time", function()
    local t0 = require("rlm.core").now_ms()
    local _, err = H.run({
      max_depth = 2,
      max_wall_ms = 2000,
      fallback = false,
      root_llm = tree_model({ fence("rlm_query('spin')") }, function()
        return fence("while True:\n    pass")
      end),
    })
    local took = require("rlm.core").now_ms() - t0
    assert.are.equal("cost_budget", err.kind)
    assert.matches("max_wall_ms", err.message)
    assert.is_true(took < 2000 + 2000, "took " .. took .. " ms")
  end)
end)

H.describe_luv("rlm_query under the luv adapter", function()
  after_each(H.assert_clean)

  it("cancels a run while its children run, and leaves nothing behind", function()
    local s, err, over
    s = luv_adapter.run(H.opts({
      max_depth = 2,
      root_llm = tree_model({ fence("rlm_query_batched(['a', 'b'])") }, function()
        L.after(300, function()
          s:close()
        end)
        return fence("import time\ntime.sleep(30)")
      end),
    }), function(e)
      err, over = e, true
    end)
    L.run_until(function()
      return over
    end)
    assert.are.equal("cancelled", err.kind)
  end)

  it("runs children side by side, their models answering asynchronously", function()
    local events, on_event = recorder()
    local result, err, over
    luv_adapter.run(H.opts({
      max_depth = 2,
      on_event = on_event,
      root_llm = function(messages, done)
        local q = messages[2].content:match("^Question: (.-)\n\nStart by looking")
        L.after(100, function()
          if not q then
            done(fence("FINAL('|'.join(rlm_query_batched(['a', 'b', 'c'])))"))
          elseif #messages == 2 then
            done(fence("x = llm_query(context)"))
          else
            done(fence("FINAL(x)"))
          end
        end)
      end,
      llm_query = function(p)
        L.sleep(100)
        return p:upper()
      end,
    }), function(e, r)
      result, err, over = r, e, true
    end)
    L.run_until(function()
      return over
    end)
    assert.is_nil(err)
    assert.are.equal("A|B|C", result.answer)
    assert.are.equal(3, most_alive(events))
    assert.are.equal(3, count(events, function(ev)
      return ev.type == "root_response" and ev.depth == 1 and ev.step == 2
    end))
  end)
end)
