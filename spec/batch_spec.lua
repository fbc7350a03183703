-- llm_query_batched: sub-calls that run side by side, in order, under one
-- budget.
local H = require("helpers")
local core = require("rlm.core")
local fence = H.fence

local L = require("helpers.luv")
local luv_adapter = L and require("rlm.adapters.luv")
local after = L and L.after

local function run_luv(opts)
  local result, err, over
  luv_adapter.run(H.opts(opts), function(e, r)
    result, err, over = r, e, true
  end)
  L.run_until(function()
    return over
  end)
  return result, err
end

-- The code times its own batch, so the sandbox's start-up is left out.
local TIMED_BATCH = fence([[
import time
t = time.time()
answers = llm_query_batched(['p%d' % i for i in range(16)])
FINAL(repr((round(time.time() - t, 3), answers)))]])

local function timed(result)
  local secs = tonumber(result.answer:match("^%(([%d.]+),"))
  local answers = {}
  for a in result.answer:gmatch("'([^']*)'") do
    answers[#answers + 1] = a
  end
  return secs, answers
end

local function expected(prefix)
  local want = {}
  for i = 0, 15 do
    want[#want + 1] = prefix .. "p" .. i
  end
  return want
end

describe("llm_query_batched", function()
  after_each(H.assert_clean)

  it("runs one after another with a blocking llm_query, and still answers in order", function()
    local result = assert(H.run({
      root_llm = H.script({ TIMED_BATCH }),
      llm_query = function(p)
        local t = core.now_ms()
        repeat -- a blocking 100 ms call
        until core.now_ms() - t >= 100
        return "a:" .. p
      end,
    }))
    local secs, answers = timed(result)
    assert.are.same(expected("a:"), answers)
    assert.is_true(secs >= 1.6 and secs < 3.5, "took " .. secs .. " s")
  end)

  -- An llm_query_batch that answers "b:" .. prompt, telling seen(prompts)
  -- of each call first.
  local function echo_batch(seen)
    return function(prompts)
      seen(prompts)
      local out = {}
      for i, p in ipairs(prompts) do
        out[i] = "b:" .. p
      end
      return out
    end
  end

  it("takes a whole batch through llm_query_batch(prompts) when given one", function()
    local calls = 0
    local result = assert(H.run({
      max_concurrent_sub_calls = 16,
      root_llm = H.script({ TIMED_BATCH }),
      llm_query_batch = echo_batch(function()
        calls = calls + 1
      end),
    }))
    local _, answers = timed(result)
    assert.are.same(expected("b:"), answers)
    assert.are.equal(1, calls)
    assert.are.equal(16, result.sub_calls)
  end)

  it("gives llm_query_batch at most max_concurrent_sub_calls prompts at once, under run() too", function()
    local sizes = {}
    local result = assert(H.run({
      max_concurrent_sub_calls = 5,
      root_llm = H.script({ TIMED_BATCH }),
      llm_query_batch = echo_batch(function(prompts)
        sizes[#sizes + 1] = #prompts
      end),
    }))
    assert.are.same(expected("b:"), select(2, timed(result)))
    assert.are.same({ 5, 5, 5, 1 }, sizes)
  end)

  it("takes llm_query_batch slots of { text =, usage = } and { error = }", function()
    local result = assert(H.run({
      root_llm = H.script({ fence([[
a = llm_query_batched(['ok', 'bad', 'plain'])
FINAL(repr([(isinstance(x, SubCallError), x) for x in a]))]]) }),
      llm_query_batch = function()
        return { { text = "OK", usage = { input_tokens = 7, output_tokens = 3 } },
          { error = "HTTP 400: context too long" }, "PLAIN" }
      end,
    }))
    assert.matches("%(False, 'OK'%), %(True, 'Error: llm_query failed: HTTP 400: context too long'%), "
      .. "%(False, 'PLAIN'%)", result.answer)
    assert.are.equal(10, result.tokens.total) -- the slot's usage counts
  end)

  it("gives a failed sub-call its error in its slot, and the run goes on", function()
    local result = assert(H.run({
      llm_query = function(p)
        if p == "bad" then
          error("upstream 500")
        end
        return p:upper()
      end,
      root_llm = H.script({ fence([[
a = llm_query_batched(['ok', 'bad', 'fine'])
FINAL(repr([(isinstance(x, SubCallError), x) for x in a]))]]) }),
    }))
    assert.matches("%(False, 'OK'%), %(True, 'Error: llm_query failed: .*upstream 500'%), %(False, 'FINE'%)",
      result.answer)
  end)

  it("dispatches exactly what max_sub_calls allows; the rest get the budget error", function()
    local dispatched = 0
    local result = assert(H.run({
      max_sub_calls = 10,
      llm_query = function(p)
        dispatched = dispatched + 1
        return p
      end,
      root_llm = H.script({ fence([[
a = llm_query_batched([str(i) for i in range(6)])
a += llm_query_batched([str(i) for i in range(10)])
FINAL(repr([x for x in a if isinstance(x, SubCallError)]))]]) }),
    }))
    assert.are.equal(10, dispatched)
    assert.are.equal(10, result.sub_calls)
    local refused = select(2, result.answer:gsub("max_sub_calls %(10%) are spent", ""))
    assert.are.equal(6, refused)
  end)

  it("refuses a malformed batch from the driver as a protocol error", function()
    local _, err = H.run({
      guardrails = false,
      root_llm = H.script({ fence([[
import sys
sys.stdout.flush()
import os
os.write(1, b'{"type":"llm_batch","id":1,"prompts":[]}\n')
import time
time.sleep(5)]]) }),
    })
    assert.are.equal("protocol_error", err.kind)
  end)
end)

H.describe_luv("llm_query_batched under the luv adapter", function()
  after_each(H.assert_clean)

  it("runs 16 calls of 100 ms side by side in under 400 ms", function()
    local result = assert(run_luv({
      root_llm = H.script({ TIMED_BATCH }),
      llm_query = function(p)
        L.sleep(100)
        return "y:" .. p
      end,
    }))
    local secs, answers = timed(result)
    assert.are.same(expected("y:"), answers)
    assert.is_true(secs < 0.4, "took " .. secs .. " s")
  end)

  it("keeps the order of the prompts under random latencies", function()
    math.randomseed(os.time())
    local result = assert(run_luv({
      root_llm = H.script({ TIMED_BATCH }),
      llm_query = function(p, done)
        after(math.random(0, 60), function()
          done("r:" .. p)
        end)
      end,
    }))
    local _, answers = timed(result)
    assert.are.same(expected("r:"), answers)
  end)

  it("passes a batch to llm_query_batch under the luv adapter too, answered later", function()
    local sizes = {}
    local result = assert(run_luv({
      root_llm = H.script({ TIMED_BATCH }),
      llm_query_batch = function(prompts, done)
        sizes[#sizes + 1] = #prompts
        after(10, function()
          local out = {}
          for i, p in ipairs(prompts) do
            out[i] = "b:" .. p
          end
          done(out)
        end)
      end,
    }))
    assert.are.same(expected("b:"), select(2, timed(result)))
    assert.are.same({ 8, 8 }, sizes)
  end)

  it("has at most max_concurrent_sub_calls in flight", function()
    local now, most = 0, 0
    local result = assert(run_luv({
      max_concurrent_sub_calls = 3,
      root_llm = H.script({ TIMED_BATCH }),
      llm_query = function(p, done)
        now = now + 1
        most = math.max(most, now)
        after(10, function()
          now = now - 1
          done(p)
        end)
      end,
    }))
    assert.are.same(expected(""), select(2, timed(result)))
    assert.are.equal(3, most)
  end)
end)
