-- The benchmarks keep working: each figure of bench/ runs once at its tiny
-- sizes and must report numbers. How fast anything was is never looked at:
-- the machine is shared, and bench/run is where speed is judged.
local H = require("helpers")

-- bench.* lives at the root of the checkout, beside spec/.
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "spec"
local root = here .. "/.."
if root:sub(1, 1) ~= "/" then
  -- Absolute: figure 13 mounts the echo driver into a container by it,
  -- and podman takes a relative source for a named volume's name.
  root = assert(os.getenv("PWD")) .. "/" .. root
end
package.path = root .. "/?.lua;" .. package.path
local common = require("bench.common")

local function is_number(v)
  return type(v) == "number" and v == v and v > -math.huge and v < math.huge
end

-- A row reports a number, or says why it has none; a floor it has is a
-- number too, and so is the ratio that goes with it.
local function check_rows(name, rows)
  assert.is_true(#rows > 0, name .. " reported no rows")
  for _, row in ipairs(rows) do
    local label = name .. ": " .. tostring(row.name)
    assert.is_string(row.figure, label)
    assert.is_string(row.name, label)
    assert.is_string(row.text, label)
    if row.value ~= nil then
      assert.is_true(is_number(row.value), label .. " value " .. tostring(row.value))
    else
      assert.is_string(row.note or row.text, label)
    end
    if row.floor then
      assert.is_true(is_number(row.floor.value), label .. " floor " .. tostring(row.floor.value))
      assert.is_true(is_number(row.ratio), label .. " ratio " .. tostring(row.ratio))
    elseif row.floor_missing then
      print(("\n# %s: %s: no floor: %s"):format(H.lua_name(), label, row.floor_missing))
    end
    if row.target and row.floor then
      assert.is_boolean(row.met, label)
    end
  end
end

describe("the benchmarks, at tiny sizes", function()
  local env

  setup(function()
    -- The bench's own files (the compiled floor helper, context files) go
    -- in a scratch directory of their own: H.tmpdir must hold only workdirs.
    env = common.env({ root = root, tmpdir = H.tmpdir, scratch = common.mkdtemp(), size = "tiny" })
  end)

  teardown(function()
    common.remove_tree(env.scratch)
  end)

  after_each(H.assert_clean)

  for _, name in ipairs(common.FIGURES) do
    it("runs " .. name, function()
      check_rows(name, require("bench." .. name).run(env))
    end)
  end

  it("runs bench/callpath.lua, which counts the Lua calls of one run()", function()
    local lua, abi = "lua5.4", "5.4" -- spec/groups runs this spec under lua5.4
    if _VERSION ~= "Lua 5.4" then
      lua, abi = "lua5.1", "5.1"
    end
    local out = H.sh(("cd %s && TMPDIR=%s LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='build/%s/?.so;;' "
      .. "%s bench/callpath.lua 2>&1"):format(common.quote(root), common.quote(H.tmpdir), abi, lua))
    assert.matches("^calls %d+ files %d+ changes %d+ %(to llm_query %d+, then to the second root call %d+, "
      .. "then %d+%)%s*$", out)
  end)

  it("computes medians and nearest-rank quantiles", function()
    assert.are.equal(2, common.median({ 3, 1, 2 }))
    assert.are.equal(2.5, common.median({ 4, 1, 3, 2 }))
    local xs = {}
    for i = 100, 1, -1 do
      xs[#xs + 1] = i
    end
    assert.are.equal(99, common.quantile(xs, 0.99))
    assert.are.equal(100, common.quantile(xs, 1))
  end)
end)
