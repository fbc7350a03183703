-- The layers of lua/rlm/ (docs/architecture.md): each module requires only
-- modules of its own layer or of a layer it is allowed to use, so that a
-- newcomer can read a layer knowing only those below it. And the model
-- client is usable without the compiled core.

-- name = { uses = the layers below it that it may require, core = whether
-- it may require rlm.core (the C module, under every layer) }.
local LAYERS = {
  base = { uses = {}, core = true },
  llm = { uses = { "base" }, core = false },
  tools = { uses = { "base" }, core = false },
  sandbox = { uses = { "base" }, core = true },
  engine = { uses = { "base", "sandbox" }, core = true },
  drive = { uses = { "base", "sandbox", "engine" }, core = true },
  api = { uses = { "base", "sandbox", "engine", "drive", "llm", "tools" }, core = true },
}

-- A folder's modules are its layer's; the public modules at the top of
-- lua/rlm/ each name theirs.
local FOLDERS = {
  base = "base", llm = "llm", tools = "tools", sandbox = "sandbox", engine = "engine",
  drive = "drive", adapters = "api",
}
local TOP = {
  rlm = "api", ["rlm.nvim"] = "api", ["rlm.health"] = "api",
  ["rlm.async"] = "drive", ["rlm.diagnose"] = "sandbox", ["rlm.log"] = "tools", ["rlm.view"] = "tools",
}

local function layer_of(name)
  if TOP[name] then
    return TOP[name]
  end
  local folder = name:match("^rlm%.([%w_]+)%.")
  return folder and FOLDERS[folder]
end

local function lua_files()
  local out = {}
  local p = assert(io.popen("cd lua && find rlm -name '*.lua' | sort"))
  for path in p:lines() do
    out[#out + 1] = path
  end
  p:close()
  return out
end

local function module_name(path)
  local name = path:gsub("%.lua$", ""):gsub("/", ".")
  return (name:gsub("%.init$", ""))
end

-- The rlm modules a file requires: literal names, and for a name built at
-- run time (require("rlm.engine." .. name)) the literal prefix, which
-- names the folder.
local function requires(path)
  local f = assert(io.open("lua/" .. path, "rb"))
  local src = f:read("*a")
  f:close()
  local out = {}
  for q, name, rest in src:gmatch("require%s*%(?%s*([\"'])(rlm[%w_.]*)%1%s*(%.?%.?)") do
    assert(q)
    out[#out + 1] = rest == ".." and name .. "x" or name
  end
  return out
end

local function allowed(from, to)
  if from == to then
    return true
  end
  for _, l in ipairs(LAYERS[from].uses) do
    if l == to then
      return true
    end
  end
  return false
end

describe("the layers of lua/rlm", function()
  it("give every module a layer", function()
    local missing = {}
    for _, path in ipairs(lua_files()) do
      local name = module_name(path)
      if not layer_of(name) then
        missing[#missing + 1] = name
      end
    end
    assert.are.same({}, missing)
  end)

  it("have each module require only its own layer or one it may use", function()
    local wrong = {}
    local edges = 0
    for _, path in ipairs(lua_files()) do
      local name = module_name(path)
      local from = layer_of(name)
      for _, dep in ipairs(requires(path)) do
        edges = edges + 1
        if dep == "rlm.core" then
          if not LAYERS[from].core then
            wrong[#wrong + 1] = ("%s (%s) requires rlm.core"):format(name, from)
          end
        else
          local to = layer_of(dep)
          if not to then
            wrong[#wrong + 1] = ("%s (%s) requires %s, which is in no layer"):format(name, from, dep)
          elseif not allowed(from, to) then
            wrong[#wrong + 1] = ("%s (%s) requires %s (%s)"):format(name, from, dep, to)
          end
        end
      end
    end
    assert.are.same({}, wrong)
    assert.is_true(edges > 50) -- the parser found the requires
  end)

  it("read a require the layers would refuse", function()
    -- The check itself: an engine module that reached up into drive/.
    assert.is_false(allowed("engine", "drive"))
    assert.is_false(allowed("base", "engine"))
    assert.is_false(allowed("llm", "engine"))
    assert.are.equal("drive", layer_of("rlm.drive.blocking"))
    assert.are.equal("engine", layer_of("rlm.engine.x"))
  end)

  it("let rlm.llm.openai, .anthropic and .gemini load and make a client where rlm.core is unavailable", function()
    local lua = os.getenv("RLM_SPEC_LUA") or "lua5.4"
    -- A cpath with no rlm/core.so on it (the system's, for lua-cjson), and
    -- a searcher that refuses rlm.core should one be installed there.
    local empty = os.tmpname()
    os.remove(empty)
    assert.is_truthy(os.execute("mkdir " .. empty))
    local script = empty .. "/client.lua"
    local f = assert(io.open(script, "wb"))
    f:write([[
      table.insert(package.searchers or package.loaders, 1, function(name)
        if name == "rlm.core" then
          error("rlm.core is unavailable in this process")
        end
      end)
      assert(not pcall(require, "rlm.core"), "rlm.core loaded")
      local openai = require("rlm.llm.openai")
      local c = openai.new({ model = "m", api_key_env = "HOME", base_url = "http://127.0.0.1:1/v1",
        transport = function() return 200, '{"choices":[{"message":{"content":"hi"}}]}', {} end })
      assert(c.root_llm({ { role = "user", content = "q" } }) == "hi")
      c = require("rlm.llm.anthropic").new({ model = "m", api_key_env = "HOME", retries = 0,
        transport = function() return 200, '{"content":[{"type":"text","text":"hi"}]}', {} end })
      assert(c.root_llm({ { role = "user", content = "q" } }) == "hi")
      c = require("rlm.llm.gemini").new({ model = "m", api_key_env = "HOME", retries = 0,
        transport = function() return 200, '{"candidates":[{"content":{"parts":[{"text":"hi"}]}}]}', {} end })
      assert(c.root_llm({ { role = "user", content = "q" } }) == "hi")
      assert(package.loaded["rlm.core"] == nil)
      print("loaded without the core")
    ]])
    f:close()
    local p = assert(io.popen(("cd lua && env LUA_PATH='./?.lua;./?/init.lua;;' LUA_CPATH='%s/?.so;;' %s %s 2>&1")
      :format(empty, lua, script)))
    local out = p:read("*a")
    p:close()
    os.remove(script)
    os.remove(empty)
    assert.are.equal("loaded without the core\n", out)
  end)
end)

describe("the sandbox seam (rlm.sandbox.backend)", function()
  it("is what the bubblewrap backend implements, every function of it", function()
    local backend = require("rlm.sandbox.backend")
    local bwrap = require("rlm.sandbox.bwrap")
    assert.are.same({}, backend.missing(bwrap))
    assert.are.equal(bwrap, backend.for_options({}))
    -- The check itself: a backend short of one function is told so.
    local short = {}
    for k, v in pairs(bwrap) do
      short[k] = v
    end
    short.check_ready = nil
    assert.are.same({ "check_ready" }, backend.missing(short))
  end)

  it("is what every backend a sandbox option names implements", function()
    local backend = require("rlm.sandbox.backend")
    for _, name in ipairs(backend.NAMES) do
      local b = backend.for_options({ sandbox = { backend = name } })
      assert.are.same({}, backend.missing(b), name)
    end
    -- exec's sandboxes may be claimed (sandbox.claim): the functions a
    -- claim needs.
    local exec = require("rlm.sandbox.exec")
    assert.are.same({ "function", "function" }, { type(exec.claimed), type(exec.release_claim) })
  end)

  -- What only a backend may do: spawn, or look at a sandbox's processes
  -- from outside (/proc, the pids, their uids and descriptors).
  local BACKEND_ONLY = {
    "rlm%.sandbox%.bwrap", "core%.spawn", "core%.helper", "/proc", ":tree%(", ":uid%(", ":foreign_fds%(",
    ":adopt%(", ":interpreter_runs%(", "check_uids", "check_rlimits",
  }

  it("is the only way the engine, the drivers and the hosts reach a sandbox", function()
    local wrong = {}
    for _, path in ipairs(lua_files()) do
      local layer = layer_of(module_name(path))
      if layer == "engine" or layer == "drive" or layer == "api" then
        local f = assert(io.open("lua/" .. path, "rb"))
        local n = 0
        for line in f:lines() do
          n = n + 1
          local code = line:gsub("%-%-.*$", "")
          for _, pattern in ipairs(BACKEND_ONLY) do
            if code:find(pattern) then
              wrong[#wrong + 1] = ("%s:%d: %s"):format(path, n, line:match("^%s*(.-)%s*$"))
            end
          end
        end
        f:close()
      end
    end
    assert.are.same({}, wrong)
  end)
end)

describe("the session's fields", function()
  -- The modules whose code sets a session's fields (`self`, or the session
  -- under another name), and the names they give it.
  local SESSION_NAMES = { self = true, s = true, session = true, child = true }
  -- Not the session's: the pool, plain functions, and the collaborators
  -- (each declares its own fields).
  local NOT_SESSION = {
    ["rlm/engine/clock.lua"] = true, ["rlm/engine/pool.lua"] = true, ["rlm/engine/start.lua"] = true, ["rlm/engine/options.lua"] = true,
    ["rlm/engine/prompt.lua"] = true, ["rlm/engine/reply.lua"] = true,
  }

  local function declared()
    local f = assert(io.open("lua/rlm/engine/session.lua", "rb"))
    local out = {}
    for line in f:lines() do
      local name = line:match("^%-%-%-@field ([%w_]+) ")
      if name then
        out[name] = true
      end
    end
    f:close()
    return out
  end

  -- The fields set by one line: the targets of an assignment that are a
  -- session's fields (a plain name beside them is a local).
  local function set_by(line)
    local code = line:gsub("%-%-.*$", "")
    local lhs = code:match("^%s*([%w_.,%s]-)%s*=[^=]")
    local out = {}
    if not lhs or lhs:find("^local") then
      return out
    end
    for item in (lhs .. ","):gmatch("([^,]*),") do
      local obj, name = item:match("^%s*([%w_]+)%.([%w_]+)%s*$")
      if obj and SESSION_NAMES[obj] then
        out[#out + 1] = name
      end
    end
    return out
  end

  local function fields_set()
    local out = {}
    local p = assert(io.popen("cd lua && ls rlm/engine/*.lua rlm/drive/*.lua rlm/init.lua"))
    for path in p:lines() do
      if not NOT_SESSION[path] then
        local f = assert(io.open("lua/" .. path, "rb"))
        local n = 0
        for line in f:lines() do
          n = n + 1
          for _, name in ipairs(set_by(line)) do
            out[name] = out[name] or ("%s:%d"):format(path, n)
          end
        end
        f:close()
      end
    end
    -- The constructor's table.
    local f = assert(io.open("lua/rlm/engine/session.lua", "rb"))
    local src = f:read("*a")
    f:close()
    local ctor = assert(src:match("local self = setmetatable%((%b{}), Session%)"))
    for name in ctor:gmatch("\n%s+([%w_]+) = ") do
      out[name] = out[name] or "rlm/engine/session.lua (new_session)"
    end
    return out
  end

  it("are declared in one place, session.lua's ---@class Session, and nowhere else set", function()
    local decl, set = declared(), fields_set()
    local undeclared, unused = {}, {}
    for name, where in pairs(set) do
      if not decl[name] then
        undeclared[#undeclared + 1] = name .. " (" .. where .. ")"
      end
    end
    for name in pairs(decl) do
      if not set[name] then
        unused[#unused + 1] = name
      end
    end
    table.sort(undeclared)
    table.sort(unused)
    assert.are.same({}, undeclared)
    assert.are.same({}, unused)
    -- The scan itself: it sees a multiple assignment and skips locals.
    assert.are.same({ "a", "b" }, set_by("  self.a, s.b = 1, 2 -- x"))
    assert.are.same({ "c" }, set_by("  self.c, text, entry.d = 1, 2, 3"))
    assert.are.same({}, set_by("  local x, y = self.a, 2"))
    assert.are.same({}, set_by("  if self.a == 1 then"))
    assert.is_true(next(decl) ~= nil)
  end)
end)

describe("rlm.Session", function()
  it("shows only what docs/api.md documents; the rest is private (_name) or a metamethod", function()
    local DOCUMENTED = { "ask", "cancel", "close", "fd", "follow_up", "new", "poll", "reply", "run", "step",
      "timeout" }
    local public = {}
    for k in pairs(require("rlm").Session) do
      if type(k) == "string" and not k:find("^_") then
        public[#public + 1] = k
      end
    end
    table.sort(public)
    assert.are.same(DOCUMENTED, public)
  end)
end)
