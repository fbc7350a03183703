-- Calls back to the host from threads of the REPL's code: the driver
-- serialises them (docs/protocol.md: one call at a time) and matches each
-- reply to its request by id, so every thread gets its own answer.
local H = require("helpers")
local core = require("rlm.core")
local fence = H.fence

local POOL = fence([[
import concurrent.futures
prompts = ['p%d' % i for i in range(16)]
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    answers = list(pool.map(llm_query, prompts))
FINAL(' '.join(answers))]])

local function expected()
  local want = {}
  for i = 0, 15 do
    want[#want + 1] = "a:p" .. i
  end
  return table.concat(want, " ")
end

-- A sub-model that takes a little while, so that the threads' calls overlap.
local function slow(p)
  local t = core.now_ms()
  repeat
  until core.now_ms() - t >= 5
  return "a:" .. p
end

describe("calls from threads", function()
  after_each(H.assert_clean)

  it("ThreadPoolExecutor(4).map(llm_query, 16 prompts) gets 16 right answers in order (guardrails off)", function()
    local result = assert(H.run({ root_llm = H.script({ POOL }), llm_query = slow, guardrails = false }))
    assert.are.equal(expected(), result.answer)
    assert.are.equal(16, result.sub_calls)
  end)

  it("does the same under the guardrails with concurrent allowed", function()
    local result = assert(H.run({ root_llm = H.script({ POOL }), llm_query = slow,
      sandbox = { allowed_modules = { "concurrent" } } }))
    assert.are.equal(expected(), result.answer)
  end)

  it("threads calling llm_query_batched, llm_query and FINAL at once neither deadlock nor mix replies", function()
    local code = fence([[
import threading
bad = []
def work(i):
    got = llm_query_batched(['t%d-%d' % (i, j) for j in range(3)]) + [llm_query('q%d' % i)]
    if got != ['a:t%d-%d' % (i, j) for j in range(3)] + ['a:q%d' % i]:
        bad.append((i, got))
    if i == 5:
        FINAL('bad: %r' % bad if bad else 'all right')
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print('not reached: FINAL ends the step')]])
    local t = core.now_ms()
    local result = assert(H.run({ root_llm = H.script({ code }), llm_query = slow, guardrails = false,
      step_timeout_ms = 20000 }))
    -- Thread 5's FINAL ends the run; the other threads may or may not have
    -- finished by then, and any mixed reply would have been reported.
    assert.matches("^all right$", result.answer)
    assert.is_true(core.now_ms() - t < 20000)
  end)

  it("refuses a call from a thread that outlives its step, and the session goes on", function()
    local code1 = fence([[
import threading, time
errors = []
def late():
    time.sleep(0.3)
    try:
        errors.append(llm_query('late'))
    except RuntimeError as exc:
        errors.append(str(exc))
threading.Thread(target=late).start()
print('started')]])
    local code2 = fence([[
print(errors)
FINAL(errors[0] if errors else 'nothing')]])
    local root = H.script({ code1, function()
      local t = core.now_ms()
      repeat -- the host thinks for a second: no step runs meanwhile
      until core.now_ms() - t >= 1000
      return code2
    end })
    local result = assert(H.run({ root_llm = root, llm_query = slow, guardrails = false }))
    assert.matches("only possible while a step runs", result.answer, 1, true)
    assert.are.equal(0, result.sub_calls)
  end)
end)
