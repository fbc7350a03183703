-- :checkhealth rlm. What the sandbox needs on this machine
-- (rlm.diagnose: bubblewrap and a trial run of it, user namespaces, the
-- interpreter, the memory cgroup), the C core this Neovim loads, and one
-- real session end to end with a stand-in model.
-- luacheck: read globals vim jit
local M = {}

-- vim.health.start/ok/... from 0.10, report_* in 0.8 and 0.9, the
-- health#report_* functions in 0.7.
local function reporter()
  local h = vim.health or {}
  if h.start then
    return h
  end
  if h.report_start then
    return { start = h.report_start, ok = h.report_ok, warn = h.report_warn, error = h.report_error,
      info = h.report_info }
  end
  local function fn(name)
    return function(msg, advice)
      if advice ~= nil then
        vim.fn["health#report_" .. name](msg, advice)
      else
        vim.fn["health#report_" .. name](msg)
      end
    end
  end
  return { start = fn("start"), ok = fn("ok"), warn = fn("warn"), error = fn("error"), info = fn("info") }
end

local function uv()
  return vim.uv or vim.loop
end

-- The clone (or install) root holding lua/rlm/health.lua.
local function source_root()
  local src = debug.getinfo(1, "S").source:sub(2)
  return src:match("^(.*)/lua/rlm/health%.lua$")
end

local function check_core(h)
  h.start("rlm: the C core")
  h.info(("Neovim %s, %s (the Lua 5.1 ABI)"):format(tostring(vim.version and vim.version() and
    ("%d.%d.%d"):format(vim.version().major, vim.version().minor, vim.version().patch) or "?"),
    jit and jit.version or _VERSION))
  local found = vim.api.nvim_get_runtime_file("lua/rlm/core.so", true)
  local ok, core = pcall(require, "rlm.core")
  if not ok then
    h.error("require('rlm.core') fails: " .. tostring(core):match("^[^\n]*"),
      { "build it in the clone: make nvim (plugin managers: build = \"make nvim\")",
        "it puts the Lua 5.1 build at lua/rlm/core.so, where Neovim's loader looks on 'runtimepath'" })
    return false
  end
  h.ok(("%s loaded from %s"):format(tostring(core._VERSION), found[1] or "package.cpath"))
  if #found > 1 then
    h.warn("more than one lua/rlm/core.so on 'runtimepath'; the first wins: " .. table.concat(found, ", "))
  end
  -- A core older than the C sources of its clone was not rebuilt after an
  -- update.
  local root = source_root()
  local so = found[1] and uv().fs_stat(found[1])
  local dir = root and uv().fs_scandir(root .. "/csrc")
  if so and dir then
    while true do
      local name = uv().fs_scandir_next(dir)
      if not name then
        break
      end
      local st = uv().fs_stat(root .. "/csrc/" .. name)
      if st and st.mtime.sec > so.mtime.sec then
        h.warn(("lua/rlm/core.so is older than csrc/%s"):format(name), { "rebuild: make nvim" })
        break
      end
    end
  end
  local cj, cjson = pcall(require, "cjson")
  if cj then
    h.ok("lua-cjson " .. tostring(cjson._VERSION or ""))
  else
    h.error("require('cjson') fails: rlm needs lua-cjson for Lua 5.1", { "Debian: apt-get install lua-cjson" })
    return false
  end
  return true
end

local function check_machine(h)
  h.start("rlm: the sandbox on this machine")
  for _, row in ipairs(require("rlm.diagnose").checks()) do
    local say = h[row.level] or h.info
    say(row.name .. ": " .. row.message)
  end
  -- The models' HTTP client (rlm.llm.transport.nvim).
  if vim.fn.executable("curl") == 1 then
    h.ok("curl: " .. vim.fn.exepath("curl") .. " (the model calls' HTTP client)")
  else
    h.error("curl: not found; every model call runs it", { "make nvim installs it; Debian: apt-get install curl" })
  end
end

local function fence(code)
  return "```repl\n" .. code .. "\n```"
end

-- One session through the blocking run(): the sandbox starts, code runs,
-- the answer comes back; then one past a 64 MiB limit, to see which
-- mechanism stops it.
local function check_session(h)
  h.start("rlm: a session with a stand-in model")
  local rlm = require("rlm")
  local function run(opts)
    local s = rlm.Session.new(opts)
    local t0 = uv().hrtime()
    local result, err = s:run()
    s:close()
    return result, err, (uv().hrtime() - t0) / 1e6
  end
  local result, err, ms = run({ context = "health", max_iterations = 1,
    root_llm = function()
      return fence("FINAL(context + ' ' + str(6 * 7))")
    end,
    llm_query = function(p)
      return p
    end })
  if not (result and result.answer == "health 42") then
    h.error(("the session failed: %s"):format(err and (err.kind .. ": " .. err.message) or
      ("answer %q"):format(tostring(result and result.answer))),
      { "see the rows above and docs/containers.md" })
    return
  end
  h.ok(("a sandboxed session answered in %.0f ms"):format(ms))
  result, err = run({ context = "", max_iterations = 1, max_rss_bytes = 64 * 2 ^ 20,
    root_llm = function()
      return fence("b = bytearray(256 * 1024 * 1024)\nFINAL('not stopped')")
    end,
    llm_query = function(p)
      return p
    end })
  if err and err.kind == "memory_limit" then
    local say = err.mechanism == "poll" and h.warn or h.ok
    say(("the memory limit holds: %s stopped 256 MiB at a 64 MiB limit"):format(err.mechanism))
  else
    h.error("the memory limit did not stop 256 MiB at a 64 MiB limit: "
      .. (err and (err.kind .. ": " .. err.message) or tostring(result and result.answer)))
  end
end

function M.check()
  local h = reporter()
  local core_ok = check_core(h)
  check_machine(h)
  if core_ok then
    check_session(h)
  end
end

return M
