-- The rockspec builds what the checkout has: every Lua module under lua/
-- and every C file under csrc/ (through csrc/rlm.c, the one unit), nothing
-- more (luarocks would fail on a file that is gone and silently leave out
-- one that is new).
local function rockspec(file)
  file = file or "rlm-scm-1.rockspec"
  local env = {}
  local chunk
  if setfenv then
    chunk = assert(loadfile(file))
    setfenv(chunk, env)
  else
    chunk = assert(loadfile(file, "t", env))
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
  local tools = rockspec("rlm-tools-scm-1.rockspec")

  -- luarocks itself, offline, into a scratch tree: the core rock alone,
  -- then the tools rock beside it.
  local has_luarocks = os.execute("command -v luarocks >/dev/null 2>&1")
  has_luarocks = has_luarocks == true or has_luarocks == 0
  local it_luarocks = has_luarocks and it or function(name)
    pending(name .. " (luarocks is not installed)")
  end
  it_luarocks("builds with luarocks: the core rock without the CLI, then the tools rock and rlm-keeper's beside it",
    function()
    local tree = os.tmpname()
    os.remove(tree)
    local function make(file)
      local p = assert(io.popen(("env -u LD_PRELOAD luarocks --lua-version=5.4 make --tree=%s --deps-mode=none %s 2>&1; echo rc=$?")
        :format(tree, file)))
      local out = p:read("*a")
      p:close()
      assert.matches("rc=0\n$", out, nil, false)
    end
    make("rlm-scm-1.rockspec")
    local core_files = lines("cd " .. tree .. " && find bin share lib/lua -type f 2>/dev/null")
    make("rlm-tools-scm-1.rockspec")
    local all_files = lines("cd " .. tree .. " && find bin share lib/lua -type f 2>/dev/null")
    local so = tree .. "/lib/lua/5.4/rlm/core.so"
    local syms = lines("nm -D --defined-only " .. so .. " | awk '{print $3}'")
    -- rlm-keeper, the third rock: a program (luarocks' make backend, the
    -- Makefile's keeper-rock and install-keeper), which finds the driver's
    -- files in its rock's tree from wherever it runs.
    make("rlm-keeper-scm-1.rockspec")
    local keeper_files = lines("cd " .. tree .. " && find bin share lib/lua -type f 2>/dev/null")
    local keeper = tree .. "/bin/rlm-keeper"
    local kind = lines("head -c 4 " .. keeper .. " | od -An -c | tr -d ' '")[1]
    local hello = lines("cd / && echo | env -u RLM_DRIVER_DIR -u LD_PRELOAD " .. keeper .. " 2>&1 | head -1")[1]
    local driver = lines("find " .. tree .. "/lib/luarocks/rocks-5.4/rlm-keeper -name repl_driver.py")
    os.execute("rm -rf " .. tree)
    local with_keeper = { "bin/rlm-keeper" }
    for _, f in ipairs(all_files) do
      with_keeper[#with_keeper + 1] = f
    end
    table.sort(with_keeper)
    assert.are.same(with_keeper, keeper_files) -- bin/rlm-keeper, nothing of rlm's
    assert.are.equal("177ELF", kind)
    assert.matches('^K{"type":"hello","keeper":"1","protocol":1,"sandbox":"', hello)
    assert.are.equal(1, #driver)
    local has = function(list, f)
      for _, x in ipairs(list) do
        if x == f then
          return true
        end
      end
      return false
    end
    assert.is_true(has(core_files, "share/lua/5.4/rlm/init.lua"))
    assert.is_true(has(core_files, "share/lua/5.4/rlm/llm/openai.lua"))
    -- where rlm.sandbox.container looks for its seccomp profile
    assert.is_true(has(core_files, "share/lua/5.4/rlm/rlm-seccomp.json"))
    assert.is_false(has(core_files, "bin/rlm"))
    assert.is_true(has(all_files, "bin/rlm"))
    -- the tools rock owns bin/rlm and nothing of rlm's
    table.insert(core_files, "bin/rlm")
    table.sort(core_files)
    assert.are.same(core_files, all_files)
    assert.are.same({ "luaopen_rlm_core" }, syms)
  end)

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

  it("makes the core rock depend on lua and lua-cjson only, the tools rock on rlm and luasocket", function()
    assert.are.same({ "lua >= 5.1", "lua-cjson" }, spec.dependencies)
    assert.are.same({ "lua >= 5.1", "rlm", "luasocket" }, tools.dependencies)
    assert.is_nil(spec.build.install.bin)
    assert.are.same({ rlm = "bin/rlm" }, tools.build.install.bin)
    assert.are.same("none", tools.build.type)
  end)

  it("builds rlm-keeper as a rock of its own, with the Makefile's targets for it", function()
    local keeper = rockspec("rlm-keeper-scm-1.rockspec")
    assert.are.same({ "lua >= 5.1" }, keeper.dependencies)
    assert.are.same({ "make", "keeper-rock", "install-keeper" },
      { keeper.build.type, keeper.build.build_target, keeper.build.install_target })
    local makefile = assert(io.open("Makefile")):read("*a")
    assert.matches("\nkeeper%-rock:", makefile)
    assert.matches("\ninstall%-keeper:", makefile)
  end)

  -- Loads every module of the core rock in a Lua where LuaSocket and LuaSec
  -- cannot be found: none but the LuaSocket transport may need them to load
  -- (rlm.llm.openai looks for it only when it is given no transport).
  it("loads every module of the core rock but the LuaSocket transport without LuaSocket", function()
    local names = {}
    for name, src in pairs(spec.build.modules) do
      if type(src) == "string" and not name:find("^rlm%.llm%.transport%.luasocket") then -- LuaSocket's own
        names[#names + 1] = name
      end
    end
    table.sort(names)
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
for _, m in ipairs({ "socket", "socket.http", "socket.url", "ltn12", "ssl", "mime" }) do
  package.preload[m] = function() error("no LuaSocket here: " .. m) end
end
for name in io.lines() do
  local ok, err = pcall(require, name)
  if not ok and tostring(err):find("no LuaSocket here", 1, true) then
    print(name .. ": " .. tostring(err):match("^[^\n]*"))
  end
end
local ok, err = pcall(require("rlm.llm.openai").new, { base_url = "http://127.0.0.1:1/v1", model = "m",
  api_key_env = "PATH" })
print(ok and "openai.new without a transport worked" or tostring(err):match("^[^\n]*"))
]])
    f:close()
    local lua = os.getenv("RLM_SPEC_LUA") or "lua5.4"
    local p = assert(io.popen(("printf '%%s\\n' %s | %s %s 2>&1"):format(table.concat(names, " "), lua, script)))
    local out = p:read("*a")
    p:close()
    os.remove(script)
    assert.matches("^rlm%.llm%.openai%.new: no transport: install LuaSocket %(the rock rlm%-tools", out)
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
    for _, m in ipairs(require("rlm.sandbox.bwrap").driver_modules) do
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
    -- rlm-keeper's own files (the program, csrc/rlm_keeper.c, and what only
    -- it includes: farside*.c, jsonread.c) are not rlm.core's.
    local keeper_only = { ["csrc/rlm_keeper.c"] = true, ["csrc/jsonread.c"] = true }
    local others = {}
    for _, f in ipairs(lines("ls csrc/*.c")) do
      if f ~= "csrc/rlm.c" and not keeper_only[f] and not f:match("^csrc/farside") then
        others[#others + 1] = f
      end
    end
    assert.are.same(others, included)
  end)

  it("builds rlm-keeper as one unit, csrc/rlm_keeper.c, from rlm.core's units without its Lua bindings", function()
    local included = {}
    for line in io.lines("csrc/rlm_keeper.c") do
      local name = line:match('^#include "([%w_]+%.c)"')
      if name then
        included[#included + 1] = "csrc/" .. name
      end
    end
    table.sort(included)
    local want = {}
    for _, f in ipairs(lines("ls csrc/*.c")) do
      -- (waitset.c is the host's set behind a session's fd(), sha256.c the
      -- keys of the host's sub-call cache, jsonscan.c the host's bound on
      -- what a driver's line may build)
      if f ~= "csrc/rlm.c" and f ~= "csrc/rlm_keeper.c" and not f:match("^csrc/core")
        and f ~= "csrc/waitset.c" and f ~= "csrc/sha256.c" and f ~= "csrc/jsonscan.c" then
        want[#want + 1] = f
      end
    end
    assert.are.same(want, included)
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
