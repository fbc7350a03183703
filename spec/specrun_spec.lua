-- spec/run, the suite's runner: a line per spec file as it ends (so
-- `make test` shows where it is), and the totals line CI reads.
local H = require("helpers")

local root = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/[^/]*$") or "."
local LUA = os.getenv("RLM_SPEC_LUA") or "lua5.4"

describe("spec/run", function()
  local dir

  setup(function()
    dir = H.scratch("rlm-specrun")
  end)

  teardown(function()
    H.remove_scratch(dir)
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

  it("adds up two Luas run side by side", function()
    local p = assert(io.popen("cd '" .. root .. "' && RLM_SPEC_JOBS=2 BUSTED_ARGS='" .. dir .. "/two_spec.lua' "
      .. "./spec/run " .. LUA .. " " .. LUA .. " 2>&1"))
    local out = p:read("*a")
    p:close()
    -- a progress line each (the logs of failed runs follow, with theirs)
    local _, lines = ("\n" .. out):gsub("\n   %S+ [^\n]*two_spec%.lua: 1 ok, 1 failed", "")
    assert.are.equal(2, lines, out)
    assert.matches("\n2 passed, 2 failed, 0 skipped\n$", out)
  end)
end)

-- busted run by hand, without spec/run: the helpers' scratch directory is
-- one of their own, removed when busted ends; spec/run's is left to it.
describe("spec/helpers' scratch directory", function()
  local dir

  before_each(function()
    dir = H.scratch("rlm-specrun")
    local f = assert(io.open(dir .. "/scratch_spec.lua", "w"))
    f:write('local H = require("helpers")\n',
      'local out = assert(io.open(', ("%q"):format(dir .. "/tmpdir"), ', "w"))\n',
      'out:write(H.tmpdir)\nout:close()\n',
      'assert(io.open(H.tmpdir .. "/a workdir", "w")):close()\n',
      'describe("scratch", function()\n',
      '  it("passes", function() assert.is_true(true) end)\n',
      '  it("fails", function() assert.is_true(false) end)\n',
      'end)\n')
    f:close()
  end)

  after_each(function()
    H.remove_scratch(dir)
  end)

  -- Runs the spec above under busted as spec/run does, with env's
  -- variables; returns the scratch directory the helpers used.
  local function busted(env)
    local p = assert(io.popen("cd '" .. root .. "' && env -u RLM_SPEC_TMPDIR " .. env .. " " .. LUA
      .. " /usr/bin/busted '" .. dir .. "/scratch_spec.lua' >/dev/null 2>&1; echo $?"))
    local rc = p:read("*a")
    p:close()
    assert.are.equal("1\n", rc) -- one failed
    return H.read_file(dir .. "/tmpdir")
  end

  it("is made, and removed when busted ends, when spec/run did not give one", function()
    local made = busted("")
    assert.matches("^/tmp/rlm%-spec%.%w+$", made)
    assert.is_nil(io.open(made .. "/a workdir"))
    assert.are.equal("gone", H.sh("test -e '" .. made .. "' || echo gone"))
  end)

  it("is spec/run's when it gives one (RLM_SPEC_TMPDIR), and left to it", function()
    local given = dir .. "/given"
    H.sh("mkdir '" .. given .. "'")
    assert.are.equal(given, busted("RLM_SPEC_TMPDIR='" .. given .. "'"))
    assert.are.equal("a workdir", H.sh("ls '" .. given .. "'"))
  end)
end)

-- spec/groups: the plan of make test (spec/run --plan) runs every spec at
-- least once, a spec in no group under every Lua, and every name the
-- groups give is a spec that exists (a misspelt name would drop a spec
-- from the run as a user without privileges).
describe("spec/groups", function()
  local LUAS = "lua5.1 lua5.3 lua5.4 luajit"

  local function plan(env, luas)
    local p = assert(io.popen("cd '" .. root .. "' && " .. env .. " ./spec/run --plan " .. luas))
    local runs = {}
    for lua, spec in p:read("*a"):gmatch("(%S+) spec/(%S+)%.lua\n") do
      runs[spec] = runs[spec] or {}
      table.insert(runs[spec], lua)
    end
    p:close()
    return runs
  end

  local function group(name)
    local p = assert(io.popen("cd '" .. root .. "' && sh -c '. spec/groups; echo $" .. name .. "'"))
    local list = {}
    for w in p:read("*a"):gmatch("%S+") do
      list[#list + 1] = w
    end
    p:close()
    assert.is_true(#list > 0, name)
    return list
  end

  it("names only specs that exist", function()
    for _, g in ipairs({ "once", "two", "privileged", "sanitized" }) do
      for _, name in ipairs(group(g)) do
        local f = io.open(root .. "/spec/" .. name .. ".lua", "r")
        assert.is_truthy(f, "spec/groups' " .. g .. " names " .. name .. ", which is not a spec")
        f:close()
      end
    end
  end)

  it("runs every spec under make test's Luas, and a spec of no group under all four", function()
    local runs = plan("", LUAS)
    local p = assert(io.popen("cd '" .. root .. "' && ls spec/*_spec.lua"))
    local count = 0
    for spec in p:read("*a"):gmatch("spec/(%S+)%.lua") do
      count = count + 1
      assert.is_truthy(runs[spec], spec .. " runs under no Lua")
    end
    p:close()
    assert.is_true(count > 50)
    assert.are.same({ "lua5.1", "lua5.3", "lua5.4", "luajit" }, runs.session_spec)
    assert.are.same({ "lua5.4", "luajit" }, runs.cli_spec)
    assert.are.same({ "lua5.4" }, runs.attack_spec)
  end)

  it("runs the privileged group's specs alone, each once, as CI does as a user", function()
    local runs = plan("RLM_SPEC_GROUP=privileged", "lua5.4")
    local want = group("privileged")
    local n = 0
    for _, lua in pairs(runs) do
      assert.are.same({ "lua5.4" }, lua)
      n = n + 1
    end
    assert.are.equal(#want, n)
    for _, name in ipairs(want) do
      assert.is_truthy(runs[name], name)
    end
  end)
end)
