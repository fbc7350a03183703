-- One version, from one place (lua/rlm/base/version.lua): the library's
-- _VERSION, `rlm --version`, the sandbox image's tag in the Lua code and
-- in the Makefile, the rockspec's module list and the docs all say it,
-- and no file spells one of its own.
local util = require("rlm.base.util")
local VERSION = require("rlm.base.version")

local function run(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("*a")
  p:close()
  return out
end

local function files(cmd)
  local out = {}
  for path in run(cmd):gmatch("[^\n]+") do
    out[#out + 1] = path
  end
  return out
end

describe("the version", function()
  it("is a version string", function()
    assert.matches("^%d+%.%d+%.%d+$", VERSION)
  end)

  it("is the library's _VERSION", function()
    assert.equals("rlm " .. VERSION, require("rlm")._VERSION)
  end)

  it("is what rlm --version prints", function()
    assert.equals("rlm " .. VERSION .. "\n", run("bin/rlm --version"))
  end)

  it("is the sandbox image's tag, in the code and in the Makefile", function()
    assert.equals("localhost/rlm-sandbox:" .. VERSION, require("rlm.sandbox.container").IMAGE)
    assert.equals("localhost/rlm-sandbox:" .. VERSION .. "\n",
      run([[printf 'spec-image-tag:\n\t@echo $(IMAGE_TAG)\n' | make --no-print-directory -s -f Makefile -f - spec-image-tag]]))
  end)

  it("is installed by the rockspec (scm-1: the checkout's version)", function()
    local env = {}
    local chunk = assert(loadfile("rlm-scm-1.rockspec"))
    if setfenv then
      setfenv(chunk, env)
    else
      chunk = assert(loadfile("rlm-scm-1.rockspec", "t", env))
    end
    chunk()
    assert.equals("scm-1", env.version)
    assert.equals("lua/rlm/base/version.lua", env.build.modules["rlm.base.version"])
  end)

  it("is spelt nowhere else in the code, and the docs' image tags are it", function()
    local wrong = {}
    for _, path in ipairs(files("git ls-files lua bin Makefile sandbox examples '*.rockspec'")) do
      local text = util.read_file(path) or ""
      for v in text:gmatch("rlm%-sandbox:(%d+%.%d+%.%d+)") do
        wrong[#wrong + 1] = path .. ": rlm-sandbox:" .. v
      end
      for v in text:gmatch("\"rlm (%d+%.%d+%.?%d*)\"") do
        wrong[#wrong + 1] = path .. ": rlm " .. v
      end
    end
    for _, path in ipairs(files("git ls-files README.md CHANGES.md docs")) do
      local text = util.read_file(path) or ""
      for v in text:gmatch("rlm%-sandbox[:%-](%d+%.%d+%.%d+)") do
        if v ~= VERSION then
          wrong[#wrong + 1] = path .. ": rlm-sandbox " .. v
        end
      end
    end
    assert.same({}, wrong)
  end)
end)
