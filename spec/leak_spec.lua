-- Sessions leave nothing behind: no child process, no descriptor, no workdir.
local H = require("helpers")
local fence = H.fence

describe("opening and closing sessions", function()
  after_each(H.assert_clean)

  it("leaves fds and child processes where they were after 200 sessions", function()
    local n = tonumber(os.getenv("RLM_SPEC_SESSIONS") or "200")
    H.run({}) -- the interpreter probe is cached after the first session
    H.assert_no_leaks(function()
      for i = 1, n do
        local s = H.session({ root_llm = H.script({ fence("FINAL(" .. i .. ")") }) })
        local result = assert(s:run())
        assert.are.equal(tostring(i), result.answer)
        s:close()
      end
    end)
  end)

  it("removes the workdir after the driver died, whatever it left in it", function()
    local result, err = H.run({
      guardrails = false,
      root_llm = H.script({ fence([[
import os
os.makedirs('a/' * 40, exist_ok=True)
os.symlink('/usr', 'link_out')
os.chmod('a', 0)
open('big', 'wb').write(b'x' * 1000)
os._exit(1)]]) }),
    })
    assert.is_nil(result)
    assert.are.equal("driver_exited", err.kind)
  end)

  it("lets a session dropped while it probes go, its probe with it, and the next one asks anew", function()
    -- A module list of its own: an interpreter probe no session of this Lua
    -- state has run yet. On a loaded machine the probe can be done before
    -- the spec looks (its child then gone): the case is then not what this
    -- test is about, and it tries again with a list not probed yet.
    local lists = { { "colorsys" }, { "colorsys", "bisect" }, { "colorsys", "heapq" }, { "colorsys", "fnmatch" } }
    local opts, s, in_flight
    for _, list in ipairs(lists) do
      opts = { sandbox = { allowed_modules = list }, root_llm = H.script({ fence("FINAL(1)") }) }
      s = H.session(opts)
      -- The probe is started, and its engine waits; the root model's
      -- first call goes out meanwhile (docs/api.md).
      assert.are.equal("root_llm", s:poll().type)
      in_flight = #H.children()
      if in_flight == 1 then
        break
      end
      s:close()
      H.settled_children()
    end
    assert.are.equal(1, in_flight)
    s = nil -- luacheck: ignore
    collectgarbage()
    collectgarbage()
    assert.are.same({}, H.settled_children())
    local result = assert(H.run(opts))
    assert.are.equal("1", result.answer)
  end)

  it("cleans up a session that is only garbage collected", function()
    local s = H.session({})
    assert(s:step())
    s = nil -- luacheck: ignore
    collectgarbage()
    collectgarbage()
  end)
end)
