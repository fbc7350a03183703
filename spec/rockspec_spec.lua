-- The rockspec builds what the checkout has: every Lua module under lua/
-- and every C file under csrc/ (through csrc/rlm.c, the one unit), nothing
-- more (luarocks would fail on a file that is gone and silently leave out
-- one that is new).
local function rockspec()
  local env = {}
  local chunk
  if setfenv then
    chunk = assert(loadfile("rlm-scm-1.rockspec"))
    setfenv(chunk, env)
  else
    chunk = assert(loadfile("rlm-scm-1.rockspec", "t", env))
  end
  chunk()
  return env
end

local function lines(cmd)
  local out = {}
  local p = assert(io.popen(cmd))
  for line in p:lines() do
    out[#out + 1] = line
  end
  p:close()
  table.sort(out)
  return out
end

describe("the rockspec", function()
  local spec = rockspec()

  it("lists every Lua module of lua/rlm, each at its path", function()
    local listed = {}
    for name, src in pairs(spec.build.modules) do
      if type(src) == "string" then
        assert.are.equal("lua/" .. name:gsub("%.", "/") .. (src:match("/init%.lua$") and "/init.lua" or ".lua"), src)
        listed[#listed + 1] = src
      end
    end
    table.sort(listed)
    assert.are.same(lines("find lua -name '*.lua'"), listed)
  end)

  it("installs the driver, its whole package and the probe beside the modules", function()
    local listed = {}
    for name, src in pairs(spec.build.install.lua) do
      if src:match("%.py$") then
        assert.are.equal("rlm." .. src:match("^python/(.*)%.py$"):gsub("/", "."), name)
        listed[#listed + 1] = src
      end
    end
    table.sort(listed)
    assert.are.same(lines("find python -name '*.py'"), listed)
  end)

  it("hands the sandbox every file of the driver's package (rlm.sandbox.driver_modules)", function()
    local modules = {}
    for _, m in ipairs(require("rlm.sandbox").driver_modules) do
      modules[#modules + 1] = "python/" .. m
    end
    table.sort(modules)
    assert.are.same(lines("find python/_rlm_driver -name '*.py'"), modules)
  end)

  it("builds rlm.core as one unit, csrc/rlm.c, that includes every other C file of csrc", function()
    assert.are.same({ "csrc/rlm.c" }, spec.build.modules["rlm.core"].sources)
    local included = {}
    for line in io.lines("csrc/rlm.c") do
      local name = line:match('^#include "([%w_]+%.c)"')
      if name then
        included[#included + 1] = "csrc/" .. name
      end
    end
    table.sort(included)
    local others = {}
    for _, f in ipairs(lines("ls csrc/*.c")) do
      if f ~= "csrc/rlm.c" then
        others[#others + 1] = f
      end
    end
    assert.are.same(others, included)
  end)

  -- What the shared object exports: luaopen_rlm_core, nothing else (a
  -- host that loads two modules with an rlm_argv_free each would otherwise
  -- bind one to the other's).
  local function exports(so)
    return lines("nm -D --defined-only " .. so .. " | awk '{print $3}'")
  end

  it("exports luaopen_rlm_core alone, from every ABI's core.so", function()
    local build = os.getenv("RLM_SPEC_BUILD") or "build"
    for _, abi in ipairs({ "5.1", "5.3", "5.4" }) do
      local so = build .. "/" .. abi .. "/rlm/core.so"
      assert.is_truthy(io.open(so), so .. " is built")
      assert.are.same({ "luaopen_rlm_core" }, exports(so), so)
    end
  end)

  it("exports luaopen_rlm_core alone when built without -fvisibility, as luarocks builds it", function()
    local so = os.tmpname()
    local cmd = ("env -u LD_PRELOAD cc -std=c11 -O0 -fPIC -shared -I/usr/include/lua5.4 -o %s csrc/rlm.c -luv -lpthread 2>&1")
      :format(so)
    local p = assert(io.popen(cmd))
    local out = p:read("*a")
    p:close()
    assert.are.equal("", out)
    local syms = exports(so)
    os.remove(so)
    assert.are.same({ "luaopen_rlm_core" }, syms)
  end)
end)
