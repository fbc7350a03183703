-- run() inside a coroutine whose callbacks yield to an outer scheduler.
local H = require("helpers")
local fence = H.fence

describe("run() in a coroutine", function()
  after_each(H.assert_clean)

  it("completes while root_llm and llm_query yield to the scheduler", function()
    local yields = 0
    local function later(value)
      -- Ask the scheduler to resume us with this value, as an async client would.
      return coroutine.yield({ resume_with = value })
    end
    local s = H.session({
      root_llm = function(messages)
        if #messages == 2 then
          return later(fence("r = llm_query('ping')\nprint(r)"))
        end
        return later(fence("FINAL(r)"))
      end,
      llm_query = function(p)
        return later("pong to " .. p)
      end,
    })
    local co = coroutine.create(function()
      return s:run()
    end)
    local ok, v, err = coroutine.resume(co)
    while coroutine.status(co) ~= "dead" do
      assert.is_true(ok, tostring(v))
      yields = yields + 1
      ok, v, err = coroutine.resume(co, v.resume_with)
    end
    s:close()
    assert.is_true(ok, tostring(v))
    assert.is_nil(err)
    assert.are.equal("pong to ping", v.answer)
    assert.are.equal(3, yields)
  end)

  it("still reports an error raised after a yield", function()
    local s = H.session({
      root_llm = function()
        coroutine.yield()
        error("after the yield")
      end,
    })
    local co = coroutine.create(function() return s:run() end)
    local _, result, err = coroutine.resume(co)
    while coroutine.status(co) ~= "dead" do
      _, result, err = coroutine.resume(co)
    end
    s:close()
    assert.is_nil(result)
    assert.are.equal("callback_error", err.kind)
    assert.matches("after the yield", err.message)
  end)
end)
