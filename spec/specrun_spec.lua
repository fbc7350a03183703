-- spec/run, the suite's runner: a line per spec file as it ends (so
-- `make test` shows where it is), and the totals line CI reads.
local H = require("helpers")

local root = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/[^/]*$") or "."
local LUA = os.getenv("RLM_SPEC_LUA") or "lua5.4"

describe("spec/run", function()
  local dir

  setup(function()
    dir = H.sh("mktemp -d /tmp/rlm-specrun.XXXXXX")
  end)

  teardown(function()
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("prints one line per spec file, then the totals", function()
    local f = assert(io.open(dir .. "/two_spec.lua", "w"))
    f:write('describe("two", function()\n',
      '  it("passes", function() assert.is_true(true) end)\n',
      '  it("fails", function() assert.is_true(false) end)\n',
      'end)\n')
    f:close()
    local p = assert(io.popen("cd '" .. root .. "' && BUSTED_ARGS='" .. dir .. "/two_spec.lua' ./spec/run "
      .. LUA .. " 2>&1"))
    local out = p:read("*a")
    p:close()
    assert.matches("\n?   " .. LUA:gsub("%p", "%%%0") .. " [^\n]*two_spec%.lua: 1 ok, 1 failed, %d+ s\n", out)
    assert.matches("\n1 passed, 1 failed, 0 skipped\n$", out)
  end)
end)
