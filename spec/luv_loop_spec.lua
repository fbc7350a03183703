-- rlm.adapters.luv and the life of luv's loop: the loop a session is driven
-- on outlives a reload of the luv module, and the session's descriptor
-- outlives the poll handle that watches it.
local H = require("helpers")
local fence = H.fence

local L = require("helpers.luv")
local luv_adapter = L and require("rlm.adapters.luv")

-- Two spec files in one Lua state, as busted runs them: each loads luv and
-- drives sessions on it, and between them every module the first loaded is
-- dropped (busted's insulation). The collector then meets the first file's
-- luv table, whose _loop field was all that held luv's loop: with luv 1.44
-- the second file's handles were made on the freed loop (luv.lua:18: EEXIST,
-- or a segfault in the next handle call).
local TWO_FILES = [=[
io.stdout:setvbuf("no")
local H = require("helpers")
local fence = H.fence
local before = {}
for name in pairs(package.loaded) do
  before[name] = true
end

local function to_end(opts)
  local uv = require("luv")
  local out
  require("rlm.adapters.luv").run(H.opts(opts), function(err, result)
    out = { err = err, result = result }
  end)
  while not out do
    uv.run("once")
  end
  uv.run("nowait")
  return out.result and out.result.answer or tostring(out.err)
end

-- The first file.
print("first: " .. to_end({}))

-- Between the files.
for name in pairs(package.loaded) do
  if not before[name] then
    package.loaded[name] = nil
  end
end
collectgarbage()
collectgarbage()

-- The second file: nested_spec's case, a run cancelled while its children
-- run, then a run to its end.
local uv = require("luv")
local s, err, over, asked
s = require("rlm.adapters.luv").run(H.opts({
  max_depth = 2,
  root_llm = function(messages)
    if messages[2].content:match("^Question: (.-)\n\nStart by looking") then
      if not asked then
        asked = true
        local t = uv.new_timer()
        t:start(300, 0, function()
          t:close()
          s:close()
        end)
      end
      return fence("import time\ntime.sleep(30)")
    end
    return fence("rlm_query_batched(['a', 'b'])")
  end,
}), function(e)
  err, over = e, true
end)
while not over do
  uv.run("once")
end
uv.run("nowait")
print("second: " .. (err and err.kind or "no error"))
print("third: " .. to_end({ root_llm = H.script({ fence("FINAL('again')") }) }))
]=]

H.describe_luv("rlm.adapters.luv and luv's loop", function()
  after_each(H.assert_clean)

  it("drives sessions after the luv module was dropped and required again, as busted does between files",
    function()
      local path = H.tmpdir .. "-two-files.lua"
      local f = assert(io.open(path, "w"))
      f:write(TWO_FILES)
      f:close()
      local out = H.sh(("timeout 120 %s %s 2>&1; echo \"exit $?\""):format(H.lua_name(), path))
      os.remove(path)
      assert.are.equal("first: done\nsecond: cancelled\nthird: again\nexit 0", out)
    end)

  -- libuv's rule: a poll handle's descriptor stays open until the handle
  -- is stopped. A session closed while the adapter watches fd() keeps it
  -- until the loop has let go (rlm.drive.dispatch.closing); had close()
  -- closed it at once, the next descriptor would take its number while
  -- libuv still held the old handle there (uv_poll_init: EEXIST).
  it("keeps fd() open until its poll handle is closed, when the session is closed mid-run", function()
    local uv = L.uv
    local s, open_after_close, err, over, answer, over2
    s = luv_adapter.run(H.opts({
      root_llm = H.script({ fence("import time\ntime.sleep(30)") }),
    }), function(e)
      err, over = e, true
    end)
    L.after(300, function()
      local fd = s:fd()
      s:close()
      open_after_close = uv.fs_fstat(fd) ~= nil
      -- A new session in the same loop turn: its descriptor and poll handle
      -- are made while the closed one's are still there.
      luv_adapter.run(H.opts({}), function(_, r)
        answer, over2 = r and r.answer, true
      end)
    end)
    L.run_until(function()
      return over and over2
    end)
    assert.are.equal("cancelled", err.kind)
    assert.is_true(open_after_close)
    assert.are.equal("done", answer)
  end)
end)
