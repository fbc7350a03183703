-- The driver's own start stays cheap (issue 17): what it imports before the
-- first step's answer is bounded here, on top of what the interpreter
-- imports for itself (-I -S). json (which imports re, enum, functools and
-- collections), ast, threading, difflib, linecache and the like cost the
-- cold start tens of ms on a loaded host; the driver imports them only where
-- used, and model code that imports them still gets them.
local H = require("helpers")
local fence = H.fence

-- What the driver may add to the interpreter's own start: its package, and
-- these. A module added to the start must be added here, on purpose: each
-- extension module is a dlopen, 0.15-0.5 ms of a cold start (resource:
-- the rlimits, set at configure). Not among them: fcntl and mmap (a
-- context up to 1 MiB is read; one past it is mapped, its seals checked
-- first).
-- _ast is not among them: a cold start's first step of plain code
-- (screen.plain) is compiled without a tree; one that is not adds it.
local EXPECTED = {}
for m in ([[ resource _json _collections _string _socket ]]):gmatch("%S+") do
  EXPECTED[m] = true
end

-- The ones that came back would be named among the extra modules anyway;
-- these are checked apart so that the failure is plain.
local HEAVY = { "json", "re", "enum", "ast", "threading", "difflib", "linecache", "tokenize",
  "traceback", "string", "collections", "functools", "types", "weakref", "signal", "importlib",
  "warnings", "contextlib", "typing", "keyword", "operator", "os", "_collections_abc", "itertools" }

local function words(s)
  local t = {}
  for w in s:gmatch("%S+") do
    t[w] = true
  end
  return t
end

local quote = require("rlm.base.util").shell_quote

-- The interpreter as a command, without the sanitizer build's preload (make
-- check): its leak report is not the interpreter's output.
local function py(python)
  return "env -u LD_PRELOAD " .. quote(python)
end

-- The modules of the interpreter's own start.
local function interpreter_start(python)
  return words(H.sh(py(python) .. [[ -I -S -c 'import sys; print(" ".join(sys.modules))']]))
end

-- Sorted: the loaded modules neither the interpreter's start nor EXPECTED
-- explain, and the HEAVY ones among them.
local function unexpected(loaded, start)
  local extra, heavy = {}, {}
  for m in pairs(loaded) do
    if not start[m] and not EXPECTED[m] and m ~= "_rlm_driver" and not m:match("^_rlm_driver%.") then
      extra[#extra + 1] = m
    end
  end
  for _, m in ipairs(HEAVY) do
    if loaded[m] and not start[m] then
      heavy[#heavy + 1] = m
    end
  end
  table.sort(extra)
  return extra, heavy
end

-- One session's first step, guardrails off so that the code can read
-- sys.modules: the interpreter and what was loaded by then.
local first_step
local function sandboxed_start()
  if not first_step then
    local result, err = H.run({
      guardrails = false, stdout_truncate_chars = 50000,
      root_llm = H.script({
        fence("import sys\nprint(sys.executable)\nprint(' '.join(sorted(sys.modules)))"),
        fence("FINAL('done')"),
      }),
    })
    assert.is_nil(err, err and tostring(err))
    local python, modules = result.history[1].stdout:match("^(%S+)\n(.-)\n$")
    assert.is_string(python, result.history[1].stdout)
    first_step = { python = python, modules = words(modules) }
  end
  return first_step
end

describe("the driver's start", function()
  after_each(H.assert_clean)

  it("imports nothing heavy before its first step's answer, in the sandbox", function()
    local s = sandboxed_start()
    assert.is_true(s.modules["_rlm_driver.main"] == true, "the list holds the driver's modules")
    local extra, heavy = unexpected(s.modules, interpreter_start(s.python))
    assert.are.same({}, heavy)
    assert.are.same({}, extra)
  end)

  -- A new directory holding the driver as the sandbox has it
  -- (repl_driver.py beside the zip the probe packs), and in it the file
  -- `in`: the messages of a cold start and a first step of `code`.
  local function packed_driver(python, code, guardrails)
    local dir = H.sh("mktemp -d " .. quote(H.tmpdir .. "/driver.XXXXXX"))
    local root = H.sh("pwd")
    H.sh(("cp %s %s/"):format(quote(root .. "/python/repl_driver.py"), quote(dir)))
    H.sh(("%s -I -S %s --driver %s | %s -I -S -c %s %s"):format(py(python),
      quote(root .. "/python/probe.py"), quote(root .. "/python"), py(python),
      quote("import base64, json, sys; open(sys.argv[1], 'wb').write("
        .. "base64.b64decode(json.load(sys.stdin)['driver_zip']))"),
      quote(dir .. "/driver.zip")))
    local f = assert(io.open(dir .. "/in", "w"))
    f:write('{"type":"configure","guardrails":', tostring(guardrails), ',"int_bits":64}\n',
      '{"type":"self_test"}\n', '{"type":"load_context","format":"text"}\n',
      '{"type":"exec","id":1,"code":' .. require("cjson").encode(code) .. '}\n')
    f:close()
    return dir
  end

  -- The driver outside the sandbox (packed_driver), under -X importtime,
  -- guardrails on: what it printed, and the modules it imported.
  local function first_step_imports(code, pause)
    local python = sandboxed_start().python
    local dir = packed_driver(python, code, true)
    -- With a pause, the driver is idle between its self-test and its
    -- session, as a pooled sandbox is: the pause starts once its
    -- self_test_result is out (up to 20 s: a loaded machine may take a
    -- while to start the interpreter, which a pause from the spawn lost).
    local feed = pause and ("(head -n 2 %s/in; i=0; while ! grep -q self_test_result %s/out && [ $i -lt 400 ]; "
      .. "do sleep 0.05; i=$((i+1)); done; sleep %s; tail -n 2 %s/in)"):format(quote(dir), quote(dir), pause,
      quote(dir)) or ("cat %s/in"):format(quote(dir))
    -- One file for both, in the order written: the replies and the imports.
    H.sh(("%s | %s -I -S -B -X importtime %s/repl_driver.py > %s/out 2>&1"):format(
      feed, py(python), quote(dir), quote(dir)))
    local out = H.read_file(dir .. "/out")
    local err = out
    H.sh("rm -rf " .. quote(dir))
    local loaded = {}
    for name in err:gmatch("import time:%s+%d+ |%s+%d+ |%s*([%w_.]+)") do
      loaded[name] = true
    end
    assert.is_true(loaded["_rlm_driver.step"] == true, err)
    return out, loaded, python
  end

  it("imports nothing heavy on the guardrails' path either (-X importtime, outside the sandbox)", function()
    local out, loaded, python = first_step_imports("x = '{}'.format(1)\nprint(x)")
    assert.matches('\n{"type": "hello"', out)
    assert.matches('{"type": "exec_result", "id": 1, "stdout": "1\\n", "error": null', out, 1, true)
    assert.is_true(loaded._ast, "the screen's path imports _ast")
    loaded._ast = nil
    local extra, heavy = unexpected(loaded, interpreter_start(python))
    assert.are.same({}, heavy)
    assert.are.same({}, extra)
  end)

  -- At the end of its input the session is over (the host is killing the
  -- sandbox): the driver leaves at once, without the interpreter's
  -- finalization (milliseconds of CPU, freeing every object), its atexit
  -- handlers, or a wait for the REPL's threads.
  it("leaves at the end of its input at once, whatever the REPL's code left running", function()
    local python = sandboxed_start().python
    local dir = packed_driver(python, "import atexit, sys, threading, time\n"
      .. "atexit.register(lambda: sys.__stderr__.write('atexit ran\\n'))\n"
      .. "threading.Thread(target=time.sleep, args=(30,)).start()\nprint('started')", false)
    local t0 = require("rlm.core").now_ms()
    local out = H.sh(("timeout 20 %s -I -S -B %s/repl_driver.py < %s/in 2>&1; echo \"status $?\""):format(
      py(python), quote(dir), quote(dir)))
    local ms = require("rlm.core").now_ms() - t0
    H.sh("rm -rf " .. quote(dir))
    assert.matches('"stdout": "started\\n"', out, 1, true)
    assert.matches("status 0$", out)
    assert.not_matches("atexit ran", out, 1, true)
    assert.is_true(ms < 5000, ("the driver took %.0f ms to leave"):format(ms))
  end)

  -- The warm-up's slow parts (the compiler's paths, the screen's _ast) wait
  -- for a quiet spell before the first step: a pooled sandbox idle after its
  -- self-test makes them, a cold start's ready-to-exec does not.
  it("warms the compiler while idle before its session, not between a cold start's messages", function()
    local function ast_before_answer(pause)
      local out, loaded = first_step_imports("x = 1", pause)
      local answer = out:find('{"type": "exec_result", "id": 1, "stdout": "", "error": null', 1, true)
      assert.is_number(answer, out)
      assert.is_true(loaded._ast, "the warm-up imports _ast, once idle after the first step if not before")
      return out:find("|%s*_ast\n") < answer
    end
    assert.is_true(ast_before_answer("0.3"), "the idle driver warms up before its session")
    assert.is_false(ast_before_answer(nil), "a driver whose messages are all there warms up after its first step")
  end)

  -- Plain code (screen.plain) is compiled as it stands, without its tree:
  -- nothing in it for the screen to refuse or rewrite. _ast (the module)
  -- comes with the first code that is not plain, or the driver's warm-up
  -- once it is idle after the self-test.
  it("compiles plain code without its tree, and screens the rest", function()
    local python = sandboxed_start().python
    local check = [[
import sys
sys.path.insert(0, sys.argv[1])
out = sys.stdout
from _rlm_driver import screen, step
cases = {"x = 1\nprint(x + 1)": True, "def f(a):\n    return [a, 2.5]": True,
         "x = eval('1')": False, "x.__class__": False, "'{}'.format(1)": False,
         "x = 1  # open": False, "print(vars())": False, "y = f.gi_frame": False,
         "\uff45val('1')": False, "x = 'caf\u00e9'": False}
wrong = [code for code, plain in cases.items() if screen.plain(code) != plain]
code, _ = step.compile_step("x = 1\nprint(x + 1)", "<repl-1>", True)
plain_ast = "_ast" in sys.modules
try:
    step.compile_step("x = eval('1')", "<repl-2>", True)
    refused = False
except screen.GuardrailError:
    refused = True
print(wrong, code.co_filename, plain_ast, refused, "_ast" in sys.modules, file=out)
]]
    local out = H.sh(("%s -I -S -B -c %s %s 2>&1"):format(py(python), quote(check),
      quote(H.sh("pwd") .. "/python")))
    assert.are.equal("[] <repl-1> False True True", out)
  end)

  -- The first plain step is compiled by exec of its text, whose code object
  -- a trace function takes at its frame's first event and aborts there
  -- (step.quick_compile): compile()'s first call would build the ast
  -- module's classes, ~1.5 ms of the cold start. The code must never run
  -- there (it would run unguarded, outside the step): a text that prints,
  -- or raises comes back compiled, having done none of it. Only the first
  -- step's: the model's code, once it has run, could have set a trace.
  it("compiles the first plain step without compile() and without running it", function()
    local python = sandboxed_start().python
    local check = [[
import sys
sys.path.insert(0, sys.argv[1])
out = sys.stdout
from _rlm_driver import step
cases = ["print(1)\nx = 2", "n = 3\nwhile n:\n    n = n - 1", "raise ValueError(1)",
         "def f(a):\n    return [a for a in range(3)]\nprint(f(1))", "x = 1 +"]
for code in cases:
    got = step.quick_compile(code, "<repl-7>")
    if got is None:
        print("none", file=out)
        continue
    want = compile(code, "<repl-7>", "exec", dont_inherit=True)
    inner = [c.co_filename for c in got.co_consts if hasattr(c, "co_filename")]
    print(got == want, got.co_filename, inner, file=out)
ns = {}
exec(step.quick_compile("x = 5\ny = x * 2", "<repl-8>"), ns)
print(ns["y"], file=out)
sys.settrace(lambda *a: None)
print(step.quick_compile("x = 1", "<repl-9>"), file=out)
sys.settrace(None)
calls, real = [], step.quick_compile
step.quick_compile = lambda code, name: calls.append(name) or real(code, name)
step.compiled_once[0] = False
step.compile_step("x = 1", "<repl-10>", True)
step.compile_step("x = 2", "<repl-11>", True)
print(calls, file=out)
]]
    local out = H.sh(("%s -I -S -B -c %s %s 2>&1"):format(py(python), quote(check),
      quote(H.sh("pwd") .. "/python")))
    assert.are.equal(table.concat({
      "True <repl-7> []", "True <repl-7> []", "True <repl-7> []",
      "True <repl-7> ['<repl-7>']", "none", "10", "None", "['<repl-10>']" }, "\n"), out)
  end)

  -- The package's loader reads the zip (one pread a member, no
  -- zipimport); it checks each module's bytecode against the source beside
  -- it, as zipimport does, and runs the source when they differ.
  it("runs a module's source, not its bytecode, when the zip's .pyc does not match it", function()
    local python = sandboxed_start().python
    local dir = H.sh("mktemp -d " .. quote(H.tmpdir .. "/stale.XXXXXX"))
    local root = H.sh("pwd")
    H.sh(("cp %s %s/"):format(quote(root .. "/python/repl_driver.py"), quote(dir)))
    -- The probe's zip, with one more line in state.py's source and its
    -- .pyc left as packed; a stored zip keeps its members' bytes as they are.
    local restamp = [[
import base64, json, sys, zipfile
packed = base64.b64decode(json.load(sys.stdin)['driver_zip'])
open(sys.argv[1] + '/packed.zip', 'wb').write(packed)
old = zipfile.ZipFile(sys.argv[1] + '/packed.zip')
with zipfile.ZipFile(sys.argv[1] + '/driver.zip', 'w', zipfile.ZIP_STORED) as new:
    for info in old.infolist():
        data = old.read(info)
        if info.filename == sys.argv[2]:
            data += b'\nsys.stderr.write("the source ran\\n")\n'
        new.writestr(info, data)
]]
    local function start(member)
      H.sh(("%s -I -S %s --driver %s | %s -I -S -c %s %s %s"):format(py(python),
        quote(root .. "/python/probe.py"), quote(root .. "/python"), py(python), quote(restamp),
        quote(dir), quote(member)))
      return H.sh(("%s -I -S -B %s/repl_driver.py < /dev/null 2>&1"):format(py(python), quote(dir)))
    end
    -- The loader's own bytecode, which the entry script reads, is checked too.
    local stale, stale_loader, fresh = start("_rlm_driver/state.py"), start("_rlm_driver/loader.py"),
      start("none")
    H.sh("rm -rf " .. quote(dir))
    assert.matches('^{"type": "hello"', stale)
    assert.matches("the source ran", stale, 1, true)
    assert.matches("the source ran", stale_loader, 1, true)
    assert.not_matches("fatal", stale_loader, 1, true)
    assert.not_matches("the source ran", fresh, 1, true)
    assert.not_matches("fatal", stale .. fresh, 1, true)
    assert.matches('^{"type": "hello"[^\n]*}$', fresh) -- then end of input, quietly
  end)

  -- What the driver no longer imports at its start is still there for the
  -- model's code, and still refused when not allowed.
  it("leaves json, re, string, collections and difflib to the code that imports them", function()
    local result, err = H.run({
      root_llm = H.script({
        fence([[
import json, re, string, difflib, collections
print(json.dumps({'a': [1, 2.5]}), re.findall(r'\d', 'a1b2'), string.Template('$x').substitute(x=1),
      difflib.get_close_matches('appel', ['apple']), collections.Counter('aab')['a'])]]),
        fence("FINAL('done')"),
      }),
    })
    assert.is_nil(err, err and tostring(err))
    assert.is_nil(result.history[1].error)
    assert.are.equal("{\"a\": [1, 2.5]} ['1', '2'] 1 ['apple'] 2\n", result.history[1].stdout)
  end)

  it("still refuses ast, threading, linecache and traceback unless allowed", function()
    for _, m in ipairs({ "ast", "threading", "linecache", "traceback" }) do
      local result, err = H.run({
        root_llm = H.script({ fence("import " .. m), fence("FINAL('done')") }),
      })
      assert.is_nil(err, err and tostring(err))
      assert.matches("ImportError: import of '" .. m .. "' is refused", result.history[1].error, 1, true)
    end
    local result, err = H.run({
      sandbox = { allowed_modules = { "ast", "threading" } },
      root_llm = H.script({
        fence([[
import ast, threading
box = []
t = threading.Thread(target=lambda: box.append(ast.dump(ast.Constant(value=1))))
t.start(); t.join()
print(box[0], threading.current_thread() is threading.main_thread())]]),
        fence("FINAL('done')"),
      }),
    })
    assert.is_nil(err, err and tostring(err))
    assert.is_nil(result.history[1].error)
    assert.are.equal("Constant(value=1) True\n", result.history[1].stdout)
  end)

  it("writes and reads JSON as the json package does (the codec on _json)", function()
    local python = sandboxed_start().python
    local out = H.sh(("%s -I %s python 2>&1; echo rc=$?"):format(py(python),
      quote(H.sh("pwd") .. "/spec/helpers/codec_check.py")))
    assert.matches("^ok %d+\nrc=0$", out)
  end)

  it("refuses a driver that holds a descriptor once ready (the host checks then, not at the hello)", function()
    -- The driver says hello before its imports, so the host lists the
    -- sandbox's descriptors once the driver is ready. A copy of the
    -- checkout whose driver keeps a file open from its context load on.
    local root, dir = H.sh("pwd"), H.sh("mktemp -d " .. quote(H.tmpdir .. "/hostile.XXXXXX"))
    H.sh(("cp -r %s %s %s/"):format(quote(root .. "/lua"), quote(root .. "/python"), quote(dir)))
    local main = dir .. "/python/_rlm_driver/main.py"
    local text, n = H.read_file(main):gsub("\n    length = len%(context%)",
      '\n    state.kept = open("/rlm/repl_driver.pyc", "rb")\n    length = len(context)')
    assert.are.equal(1, n)
    local f = assert(io.open(main, "w"))
    f:write(text)
    f:close()
    f = assert(io.open(dir .. "/run.lua", "w"))
    f:write(([[
local rlm = require("rlm")
local s = rlm.Session.new({ context = "x", sandbox = { tmpdir = %q }, llm_query = function() return "" end,
  root_llm = function() return "```repl\nFINAL('x')\n```" end })
local result, err = s:run()
s:close()
print(result and "ran" or err.kind .. ": " .. err.message)
]]):format(H.tmpdir))
    f:close()
    local out = H.sh(("cd %s && LUA_PATH=%s LUA_CPATH=%s %s run.lua 2>&1"):format(quote(dir),
      quote(dir .. "/lua/?.lua;" .. dir .. "/lua/?/init.lua;;"), quote(package.cpath),
      H.lua_name()))
    H.sh("rm -rf " .. quote(dir))
    assert.matches("^sandbox_violation: descriptors reach the sandbox: pid %d+ fd %d+: /rlm/repl_driver.pyc", out)
  end)

  it("shows a traceback's lines from earlier steps (linecache filled when first needed)", function()
    local result, err = H.run({
      root_llm = H.script({
        fence("def f():\n    return 1 / 0"),
        fence("f()"),
        fence("FINAL('done')"),
      }),
    })
    assert.is_nil(err, err and tostring(err))
    local e = result.history[2].error
    assert.matches("return 1 / 0", e, 1, true)
    assert.matches("ZeroDivisionError", e, 1, true)
  end)
  -- docs/api.md says Python 3.8 and later: the entry's loader and the
  -- package's bytecode on each of them.
  it("starts on every Python from 3.8 on that this machine has", function()
    local found = {}
    local list = H.sh("ls -d /root/.pyenv/versions/3.*/bin/python3 /usr/bin/python3.[0-9]* 2>/dev/null")
    for path in list:gmatch("%S+") do
      local minor = tonumber(path:match("3%.(%d+)"))
      if minor and minor >= 8 and not path:match("%-config$") then
        found[#found + 1] = path
      end
    end
    for _, python in ipairs(found) do
      local result, err = H.run({
        sandbox = { python = python },
        context = "hello",
        root_llm = H.script({ fence("FINAL(context + str(len(context)))") }),
      })
      assert.is_nil(err, python .. ": " .. tostring(err))
      assert.are.equal("hello5", result.answer, python)
    end
  end)
end)
