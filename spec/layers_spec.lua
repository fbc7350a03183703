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
  journal = { uses = { "base" }, core = true },
  engine = { uses = { "base", "sandbox", "journal" }, core = true },
  drive = { uses = { "base", "sandbox", "journal", "engine" }, core = true },
  api = { uses = { "base", "sandbox", "journal", "engine", "drive", "llm", "tools" }, core = true },
  -- the command line (bin/rlm): a host over the public API (its journal's
  -- store and lease owner, the model client, the status line, the log and
  -- the viewer beside it), that no module of lua/rlm uses
  cli = { uses = { "base", "journal", "llm", "tools", "api" }, core = true },
}

-- A folder's modules are its layer's; the public modules at the top of
-- lua/rlm/ each name theirs.
local FOLDERS = {
  base = "base", llm = "llm", tools = "tools", sandbox = "sandbox", journal = "journal", engine = "engine",
  drive = "drive", adapters = "api", nvim = "api", cli = "cli",
}
local TOP = {
  rlm = "api", ["rlm.nvim"] = "api", ["rlm.health"] = "api",
  ["rlm.async"] = "drive", ["rlm.journal"] = "journal", ["rlm.diagnose"] = "sandbox", ["rlm.log"] = "tools",
  ["rlm.view"] = "tools",
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
    -- The command line is on top: nothing below may reach up into it.
    assert.are.equal("cli", layer_of("rlm.cli.main"))
    for layer in pairs(LAYERS) do
      assert.are.equal(layer == "cli", allowed(layer, "cli"), layer)
    end
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

  -- The sandbox layer's modules that serve every backend: the pool, the
  -- start's messages and checks, the rlimits the driver must set.
  local NEUTRAL = { ["rlm/sandbox/pool.lua"] = true, ["rlm/sandbox/start.lua"] = true,
    ["rlm/sandbox/selftest.lua"] = true }

  it("is the only way the engine, the drivers, the hosts and the pool reach a sandbox", function()
    local wrong = {}
    for _, path in ipairs(lua_files()) do
      local layer = layer_of(module_name(path))
      if layer == "engine" or layer == "drive" or layer == "api" or NEUTRAL[path] then
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

describe("the session's objects", function()
  -- The session and its collaborators, each a class whose fields are
  -- declared once, in a ---@class block of its file, and set only by the
  -- code of that class. SELF: the files whose `self` is one of the class
  -- (the Session's and the Conversation's methods are in several, by job);
  -- every other engine, drive and api file is the Session's, or sets no
  -- fields.
  local CLASSES = {
    Session = { file = "rlm/engine/session.lua" },
    Conversation = { file = "rlm/engine/conversation.lua" },
    Compactor = { file = "rlm/engine/compact.lua" },
    Engine = { file = "rlm/engine/loop.lua" },
    Budgets = { file = "rlm/engine/budgets.lua" },
    Clock = { file = "rlm/engine/clock.lua" },
    Scheduler = { file = "rlm/engine/subcalls.lua" },
    Nested = { file = "rlm/engine/nested.lua" },
    Handle = { file = "rlm/engine/handle.lua" },
    Cache = { file = "rlm/engine/cache.lua" },
    Journal = { file = "rlm/engine/journal.lua" },
    Renewal = { file = "rlm/engine/renewal.lua" },
  }
  -- The files whose `self` is not a Session, and the class it is (false:
  -- no class of the session's; their fields are their own business).
  local SELF = {
    ["rlm/engine/loop.lua"] = "Engine",
    ["rlm/engine/budgets.lua"] = "Budgets", ["rlm/engine/clock.lua"] = "Clock",
    ["rlm/engine/subcalls.lua"] = "Scheduler", ["rlm/engine/calls.lua"] = "Scheduler",
    ["rlm/engine/nested.lua"] = "Nested",
    ["rlm/engine/handle.lua"] = "Handle", ["rlm/engine/boot.lua"] = "Handle",
    ["rlm/engine/cache.lua"] = "Cache", ["rlm/engine/journal.lua"] = "Journal",
    ["rlm/engine/renewal.lua"] = "Renewal", ["rlm/engine/seeds.lua"] = false,
    ["rlm/engine/journal_option.lua"] = false,
    ["rlm/engine/conversation.lua"] = "Conversation", ["rlm/engine/turn.lua"] = "Conversation",
    ["rlm/engine/exec.lua"] = "Conversation", ["rlm/engine/finals.lua"] = "Conversation",
    ["rlm/engine/answer.lua"] = "Conversation", ["rlm/engine/compact.lua"] = "Compactor",
    ["rlm/engine/options.lua"] = false,
    ["rlm/engine/prompt.lua"] = false, ["rlm/engine/feedback.lua"] = false, ["rlm/engine/reply.lua"] = false,
    ["rlm/engine/markup.lua"] = false, ["rlm/engine/forms.lua"] = false,
  }
  -- The names the code gives these objects besides `self`.
  local NAMES = { s = "Session", session = "Session", child = "Session", tree = "Budgets", clock = "Clock",
    scheduler = "Scheduler", nested = "Nested", sandbox = "Handle", conversation = "Conversation",
    conv = "Conversation", compactor = "Compactor", engine = "Engine" }
  -- The session's fields that hold its collaborators: a.<field>.x = ... sets
  -- a collaborator's field from outside it.
  local HOLDERS = { tree = "Budgets", clock = "Clock", scheduler = "Scheduler", nested = "Nested",
    sandbox = "Handle", session = "Session", conversation = "Conversation", compactor = "Compactor",
    engine = "Engine", journal = "Journal" }

  local function read(path)
    local f = assert(io.open("lua/" .. path, "rb"))
    local src = f:read("*a")
    f:close()
    return src
  end

  -- The ---@field names of the ---@class block of `class` in its file.
  local function declared(class)
    local out, inside = {}, false
    for line in read(CLASSES[class].file):gmatch("[^\n]*") do
      if line:match("^%-%-%-@class " .. class .. "%f[^%w_]") then
        inside = true
      elseif inside and line:match("^%-%-") then
        local name = line:match("^%-%-%-@field ([%w_]+) ")
        if name then
          out[name] = true
        end
      elseif inside and line ~= "" then
        break
      end
    end
    return out
  end

  -- What one line sets: { object name, field } for each target of an
  -- assignment of the form name.field (a plain name beside them is a
  -- local), and the targets a.b.c whose b holds a collaborator.
  local function set_by(line)
    local code = line:gsub("%-%-.*$", "")
    local lhs = code:match("^%s*([%w_.,%s]-)%s*=[^=]")
    local out, through = {}, {}
    if not lhs or lhs:find("^local") then
      return out, through
    end
    for item in (lhs .. ","):gmatch("([^,]*),") do
      local obj, name = item:match("^%s*([%w_]+)%.([%w_]+)%s*$")
      if obj then
        out[#out + 1] = { obj, name }
      end
      local holder = item:match("^%s*[%w_]+%.([%w_]+)%.[%w_]+%s*$")
      if holder and HOLDERS[holder] then
        through[#through + 1] = HOLDERS[holder]
      end
    end
    return out, through
  end

  -- The fields each class's constructor table gives (setmetatable({...}, Class)).
  local function constructed(class)
    local out = {}
    local src = read(CLASSES[class].file)
    local ctor = src:match("setmetatable%((%b{}),%s*" .. class .. "%)")
    if ctor then
      local inner = ctor:sub(2, -2):gsub("%b{}", "{}"):gsub("%-%-[^\n]*", "")
      for name in ("," .. inner):gmatch("[,\n]%s*([%w_]+)%s*=[^=]") do
        out[name] = true
      end
    end
    return out
  end

  local function scan()
    local set, wrong = {}, {}
    for class in pairs(CLASSES) do
      set[class] = {}
      for name in pairs(constructed(class)) do
        set[class][name] = CLASSES[class].file .. " (its constructor)"
      end
    end
    local p = assert(io.popen("cd lua && ls rlm/engine/*.lua rlm/drive/*.lua rlm/init.lua"))
    for path in p:lines() do
      local own = SELF[path]
      if own == nil then
        own = "Session"
      end
      local n = 0
      for line in read(path):gmatch("[^\n]*\n?") do
        n = n + 1
        local targets, through = set_by(line)
        for _, t in ipairs(targets) do
          local class = t[1] == "self" and own or NAMES[t[1]]
          if class then
            if class ~= own and not (class == "Session" and own == "Session") then
              wrong[#wrong + 1] = ("%s:%d sets %s.%s, a field of %s's, from outside it")
                :format(path, n, t[1], t[2], class)
            end
            set[class][t[2]] = set[class][t[2]] or ("%s:%d"):format(path, n)
          end
        end
        for _, class in ipairs(through) do
          wrong[#wrong + 1] = ("%s:%d sets a field of %s's from outside it"):format(path, n, class)
        end
      end
    end
    p:close()
    return set, wrong
  end

  it("are declared once, each in its class's ---@class block, and set only by that class", function()
    local set, wrong = scan()
    local undeclared, unused = {}, {}
    for class in pairs(CLASSES) do
      local decl = declared(class)
      assert.is_true(next(decl) ~= nil, class .. " declares no fields")
      for name, where in pairs(set[class]) do
        if not decl[name] then
          undeclared[#undeclared + 1] = ("%s.%s (%s)"):format(class, name, where)
        end
      end
      for name in pairs(decl) do
        if not set[class][name] then
          unused[#unused + 1] = class .. "." .. name
        end
      end
    end
    table.sort(undeclared)
    table.sort(unused)
    table.sort(wrong)
    assert.are.same({}, undeclared)
    assert.are.same({}, unused)
    assert.are.same({}, wrong)
  end)

  it("are read by a scan that sees multiple assignments and skips locals", function()
    assert.are.same({ { "self", "a" }, { "s", "b" } }, (set_by("  self.a, s.b = 1, 2 -- x")))
    assert.are.same({ { "self", "c" }, { "entry", "d" } }, (set_by("  self.c, text, entry.d = 1, 2, 3")))
    assert.are.same({}, (set_by("  local x, y = self.a, 2")))
    assert.are.same({}, (set_by("  if self.a == 1 then")))
    assert.are.same({ "Budgets" }, select(2, set_by("  self.tree.sub_calls = 0")))
    assert.are.same({ "Session" }, select(2, set_by("  self.session.iterations = 0")))
  end)
end)

describe("rlm.Session", function()
  it("shows only what docs/api.md documents; the rest is private (_name) or a metamethod", function()
    local DOCUMENTED = { "ask", "cancel", "close", "fd", "follow_up", "journal_id", "new", "poll", "reply",
      "resume", "run", "step", "timeout" }
    local public = {}
    for k in pairs(require("rlm").Session) do
      if type(k) == "string" and not k:find("^_") then
        public[#public + 1] = k
      end
    end
    table.sort(public)
    assert.are.same(DOCUMENTED, public)
  end)

  -- It holds its collaborators and does not absorb their methods (issue
  -- 40: 65 functions when the engine's, the opening's and the turns' were
  -- mixed in; 20 once they were not). Issue 40's bar is 40.
  it("has at most 40 functions: its collaborators' methods are theirs", function()
    local n = 0
    for _, v in pairs(require("rlm").Session) do
      if type(v) == "function" then
        n = n + 1
      end
    end
    assert.is_true(n <= 40, n .. " functions on rlm.Session")
  end)
end)

-- The driver's package (python/_rlm_driver): its modules import one another
-- one way, so that each can be read knowing only those it imports (the
-- loader loads them in that order: loader.py's MODULES and LATER).
describe("the driver's modules", function()
  local DIR = "python/_rlm_driver"

  -- The package's modules a source imports: `from . import a, b as c`
  -- (a and b), `from .d import x` (d), a parenthesised list over lines
  -- too; at the top of the file or inside a function alike.
  local function py_imports(src)
    local out, pending = {}, nil
    local function names(list)
      for item in list:gsub("#[^\n]*", ""):gsub("[()]", ""):gmatch("[^,]+") do
        local name = item:match("^%s*([%w_]+)")
        if name then
          out[#out + 1] = name
        end
      end
    end
    for line in (src .. "\n"):gmatch("([^\n]*)\n") do
      if pending then
        pending = pending .. " " .. line
        if line:find(")", 1, true) then
          names(pending)
          pending = nil
        end
      else
        local module, list = line:match("^%s*from%s+%.([%w_]*)%s+import%s+(.-)%s*$")
        if module and module ~= "" then
          out[#out + 1] = module
        elseif module and list:find("(", 1, true) and not list:find(")", 1, true) then
          pending = list
        elseif module then
          names(list)
        end
      end
    end
    return out
  end

  -- A cycle in graph (name -> list of names), as "a -> b -> a", or nil.
  local function cycle_of(graph)
    local state, stack = {}, {}
    local keys = {}
    for k in pairs(graph) do
      keys[#keys + 1] = k
    end
    table.sort(keys)
    local function visit(node)
      state[node] = "open"
      stack[#stack + 1] = node
      for _, next_node in ipairs(graph[node] or {}) do
        if state[next_node] == "open" then
          local path, from = {}, nil
          for i, n in ipairs(stack) do
            if n == next_node then
              from = i
            end
          end
          for i = from, #stack do
            path[#path + 1] = stack[i]
          end
          path[#path + 1] = next_node
          return table.concat(path, " -> ")
        elseif not state[next_node] then
          local found = visit(next_node)
          if found then
            return found
          end
        end
      end
      stack[#stack] = nil
      state[node] = "done"
    end
    for _, k in ipairs(keys) do
      if not state[k] then
        local found = visit(k)
        if found then
          return found
        end
      end
    end
  end

  it("import one another without a cycle", function()
    local graph, edges, unknown = {}, 0, {}
    local p = assert(io.popen("cd " .. DIR .. " && ls *.py"))
    local files = {}
    for name in p:lines() do
      files[#files + 1] = name:gsub("%.py$", "")
    end
    p:close()
    local is_module = {}
    for _, m in ipairs(files) do
      is_module[m] = true
    end
    for _, m in ipairs(files) do
      local f = assert(io.open(DIR .. "/" .. m .. ".py", "rb"))
      graph[m] = py_imports(f:read("*a"))
      f:close()
      for _, dep in ipairs(graph[m]) do
        edges = edges + 1
        if not is_module[dep] then
          unknown[#unknown + 1] = m .. " imports " .. dep
        end
      end
    end
    assert.are.same({}, unknown) -- what the parser read is the package's modules
    assert.is_true(edges > 20, "the parser found the imports")
    assert.is_nil(cycle_of(graph))
  end)

  it("are read by a parser and a cycle check that see what they must", function()
    assert.are.same({ "a", "b", "d", "e", "f", "g" }, py_imports(table.concat({
      "from . import a, b as c  # why", "def f():", "    from .d import x", "import os",
      "from .e import (x,", "                y)", "from . import (f,", "    g)", "from os import path",
    }, "\n")))
    assert.are.equal("guard -> shield -> guard", cycle_of({ guard = { "shield", "state" }, shield = { "guard" },
      state = {} }))
    assert.are.equal("a -> b -> c -> a", cycle_of({ a = { "b" }, b = { "c" }, c = { "a" } }))
    assert.is_nil(cycle_of({ a = { "b", "c" }, b = { "c" }, c = {} }))
  end)
end)

describe("the Lua files of the project", function()
  -- Every Lua file git holds but the specs and the benchmarks' harness
  -- (bench/, which no rock and no make install ships): lua/rlm, bin/rlm
  -- (Lua by its shebang), the examples, k8s/.
  local function shipped()
    local out = {}
    local p = assert(io.popen("git ls-files 2>/dev/null"))
    for path in p:lines() do
      if not path:find("^spec/") and not path:find("^bench/") then
        local f = io.open(path, "rb")
        local first = f and f:read("*l") or ""
        if f then
          f:close()
        end
        if f and (path:find("%.lua$") or first:find("^#!.*lua")) then
          out[#out + 1] = path
        end
      end
    end
    p:close()
    return out
  end

  -- Issue 40: a file does one job; past 400 lines it is doing more (the
  -- viewer's page, HTML and script in one, is the exception).
  it("are at most 400 lines each, but the viewer", function()
    local files, seen = shipped(), {}
    local long = {}
    for _, path in ipairs(files) do
      seen[path] = true
      local n = 0
      for _ in io.lines(path) do
        n = n + 1
      end
      if n > 400 and path ~= "lua/rlm/view.lua" then
        long[#long + 1] = ("%s: %d lines"):format(path, n)
      end
    end
    assert.are.same({}, long)
    -- what the list must hold: the modules, the command line, an example
    assert.are.same({ true, true, true, true }, { seen["lua/rlm/init.lua"], seen["lua/rlm/cli/main.lua"],
      seen["bin/rlm"], seen["examples/demo.lua"] })
  end)
end)
