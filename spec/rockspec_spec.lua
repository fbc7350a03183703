-- The rockspec builds what the checkout has: every Lua module under lua/
-- and every C file under csrc/, nothing more (luarocks would fail on a file
-- that is gone and silently leave out one that is new).
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

  it("builds rlm.core from every C file of csrc", function()
    local sources = {}
    for _, s in ipairs(spec.build.modules["rlm.core"].sources) do
      sources[#sources + 1] = s
    end
    table.sort(sources)
    assert.are.same(lines("ls csrc/*.c"), sources)
  end)
end)
