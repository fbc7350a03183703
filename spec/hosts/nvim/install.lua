-- The Neovim install test: a copy of the clone, built with the documented
-- command (`make nvim`), is the only thing added to 'runtimepath'; nothing
-- touches package.path or package.cpath. Run by spec/hosts/run:
--
--   nvim --headless --clean -u NONE -i NONE -n --cmd "set rtp^=$CLONE" \
--     -c "luafile spec/hosts/nvim/install.lua"
--
-- with RLM_CLONE (that copy) and RLM_HOSTS_TMPDIR (an empty directory for
-- the workdirs). Prints one "ok - ..." / "not ok - ..." line per case and
-- the :checkhealth rlm report as "# " lines, then quits.
-- luacheck: globals vim
local clone = assert(os.getenv("RLM_CLONE"), "RLM_CLONE")
local tmpdir = assert(os.getenv("RLM_HOSTS_TMPDIR"), "RLM_HOSTS_TMPDIR")
local uv = vim.uv or vim.loop
local out = io.stdout
local cpath_before, path_before = package.cpath, package.path
-- Messages as comment lines of the report, not glued to its "ok" lines.
-- Kept too, for the cases on errors.
local notified = {}
vim.notify = function(msg, level)
  notified[#notified + 1] = { msg = msg, level = level }
  out:write("# notify: " .. tostring(msg) .. "\n")
end

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local harness = dofile(here .. "/harness.lua").new("nvim-install", tmpdir)
local report, fence, workdirs, wait_for = harness.report, harness.fence, harness.workdirs, harness.wait_for

local function answer_buffer()
  local buf = vim.fn.bufnr("rlm://answer")
  return buf >= 0 and table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), "\n") or ""
end

local cases = {}
local plugin

-- 1. require("rlm") and its core come from the clone's lua/ directory.
cases[#cases + 1] = function(next_case)
  local ok, rlm = pcall(require, "rlm")
  local core_ok, core = pcall(require, "rlm.core")
  local so = vim.api.nvim_get_runtime_file("lua/rlm/core.so", true)[1] or "none"
  report(ok and core_ok and so == clone .. "/lua/rlm/core.so" and package.cpath == cpath_before
    and package.path == path_before,
    "require('rlm') works with only the clone on 'runtimepath' (no package.cpath edits)",
    ok and core_ok and ("%s from %s"):format(core._VERSION, so) or tostring(ok and core or rlm))
  plugin = require("rlm.nvim")
  next_case()
end

-- 2. :RlmAsk over the buffer, with a stand-in root model answering after
-- 300 ms; the progress float is up meanwhile, the answer lands in
-- rlm://answer.
cases[#cases + 1] = function(next_case)
  plugin.setup({
    sandbox = { tmpdir = tmpdir },
    root_llm = function(_, done)
      vim.defer_fn(function()
        done(fence("n = sum(1 for l in context.splitlines() if 'ERROR' in l)\nFINAL(str(n) + ' errors')"))
      end, 300)
    end,
    llm_query = function(p)
      return p
    end,
  })
  vim.api.nvim_buf_set_lines(0, 0, -1, false, { "ok", "ERROR one", "fine", "ERROR two", "ERROR three" })
  vim.cmd("RlmAsk how many errors?")
  local float_seen = false
  wait_for(function()
    float_seen = float_seen or plugin.status():find("rlm:", 1, true) ~= nil
      and #vim.tbl_filter(function(w)
        return vim.api.nvim_win_get_config(w).relative ~= ""
      end, vim.api.nvim_list_wins()) > 0
    return plugin.last_answer ~= nil or plugin.last_error ~= nil
  end, 30000, function()
    report(plugin.last_answer == "3 errors" and answer_buffer():find("3 errors", 1, true) and float_seen,
      ":RlmAsk answers about the buffer in rlm://answer, with progress in a float",
      plugin.last_error and tostring(plugin.last_error)
        or ("%q; float seen: %s"):format(answer_buffer(), tostring(float_seen)))
    next_case()
  end)
end

-- 3. A range (a visual selection gives '<,'>): only those lines.
cases[#cases + 1] = function(next_case)
  plugin.setup({
    sandbox = { tmpdir = tmpdir },
    root_llm = function()
      return fence("FINAL(context.replace('\\n', '|'))")
    end,
    llm_query = function(p)
      return p
    end,
  })
  vim.cmd("enew")
  vim.api.nvim_buf_set_lines(0, 0, -1, false, { "one", "two", "three", "four" })
  vim.cmd("2,3RlmAsk what is selected?")
  wait_for(function()
    return plugin.last_answer ~= nil or plugin.last_error ~= nil
  end, 30000, function()
    report(plugin.last_answer == "two|three", ":'<,'>RlmAsk asks about the selected lines only",
      tostring(plugin.last_answer or plugin.last_error))
    next_case()
  end)
end

-- 4. :RlmAskFiles over the argument list.
cases[#cases + 1] = function(next_case)
  local a, b = tmpdir .. "/../a.log", tmpdir .. "/../b.log"
  for path, text in pairs({ [a] = "alpha\nERROR x\n", [b] = "beta\nERROR y\nERROR z\n" }) do
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
  end
  vim.cmd("args " .. vim.fn.fnameescape(a) .. " " .. vim.fn.fnameescape(b))
  plugin.setup({
    sandbox = { tmpdir = tmpdir },
    root_llm = function()
      return fence("FINAL(str(context.count('=== ')) + ' files, ' + str(context.count('ERROR')) + ' errors')")
    end,
    llm_query = function(p)
      return p
    end,
  })
  vim.cmd("RlmAskFiles how many errors?")
  wait_for(function()
    return plugin.last_answer ~= nil or plugin.last_error ~= nil
  end, 30000, function()
    os.remove(a)
    os.remove(b)
    vim.cmd("%argdelete")
    report(plugin.last_answer == "2 files, 3 errors", ":RlmAskFiles asks about the files of the argument list",
      tostring(plugin.last_answer or plugin.last_error))
    next_case()
  end)
end

-- 5. The cancel key ends a session whose model never answers: the sandbox
-- and its workdir go, the float and the mapping too.
cases[#cases + 1] = function(next_case)
  plugin.setup({
    sandbox = { tmpdir = tmpdir },
    root_llm = function() end, -- never calls done
    llm_query = function(p)
      return p
    end,
  })
  vim.cmd("RlmAsk will this ever end?")
  wait_for(function()
    return #workdirs() > 0 and vim.fn.maparg("<C-c>", "n") ~= ""
  end, 10000, function(started)
    local t0 = uv.hrtime()
    vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes("<C-c>", true, false, true), "x", false)
    local key_ms = (uv.hrtime() - t0) / 1e6
    local closed = plugin.session == nil
    wait_for(function()
      return plugin.session == nil and #workdirs() == 0
    end, 10000, function(gone)
      local floats = #vim.tbl_filter(function(w)
        return vim.api.nvim_win_get_config(w).relative ~= ""
      end, vim.api.nvim_list_wins())
      report(started and gone and plugin.cancelled and floats == 0 and vim.fn.maparg("<C-c>", "n") == "",
        "<C-c> cancels the running session: no workdir, float or mapping is left",
        ("started %s; the key closed it %s (%.0f ms); no workdir after %.0f ms; %d floats"):format(
          tostring(started), closed and "at once" or "later", key_ms, (uv.hrtime() - t0) / 1e6, floats))
      next_case()
    end)
  end)
end

-- 6. With the model server down, the error is one line, as the command
-- line gives it: no "rlm: rlm:", no traceback, as wide as the message area
-- at most (a wider one stops the editor at a hit-enter prompt); the whole
-- line is in rlm://answer.
cases[#cases + 1] = function(next_case)
  local key = vim.env.OPENAI_API_KEY
  vim.env.OPENAI_API_KEY = "sk-test"
  -- port 9 (discard) on loopback: nothing listens there
  plugin.setup({ sandbox = { tmpdir = tmpdir }, base_url = "http://127.0.0.1:9/v1", model = "m" })
  local before = #notified
  vim.cmd("RlmAsk is anyone there?")
  wait_for(function()
    return plugin.last_error ~= nil or plugin.last_answer ~= nil
  end, 60000, function()
    vim.env.OPENAI_API_KEY = key
    local said = {}
    for i = before + 1, #notified do
      said[#said + 1] = tostring(notified[i].msg)
    end
    local line = said[1] or ""
    local whole = answer_buffer()
    report(#said == 1 and notified[before + 1].level == vim.log.levels.ERROR and not line:find("\n")
      and line:find("^rlm: callback_error: ") and not line:find("rlm: rlm:", 1, true)
      and not line:find("traceback", 1, true) and vim.fn.strdisplaywidth(line) < vim.v.echospace
      and not whole:find("\n") and whole:find("^rlm: callback_error: root_llm raised: .*curl exit 7")
      and not whole:find("traceback", 1, true),
      "with the model server down, :RlmAsk says one line that fits (the whole of it in rlm://answer)",
      ("said %d: %s | rlm://answer: %s"):format(#said, table.concat(said, " | "), whole))
    next_case()
  end)
end

-- 7. setup() checks its options at once: a misspelt one raises with the
-- name it most likely meant; a plugin option of the wrong type names it.
cases[#cases + 1] = function(next_case)
  local rows = {
    { { modle = "qwen3" }, "rlm.nvim.setup: unknown option 'modle' (did you mean 'model'? known: " },
    { { max_iteration = 3 }, "rlm.nvim.setup: unknown option 'max_iteration' (did you mean 'max_iterations'? " },
    { { progress = "flot" }, "rlm.nvim.setup: option 'progress' must be \"float\", \"statusline\" or false, got \"flot\"" },
    { { stream = "yes" }, "rlm.nvim.setup: option 'stream' must be a boolean, got \"yes\"" },
  }
  local wrong = {}
  for _, row in ipairs(rows) do
    local ok, err = pcall(function()
      plugin.setup(row[1])
    end)
    -- raised at the caller's line (this file), not inside the plugin
    local where, message = tostring(err):match("^(.-:%d+): (.*)$")
    if ok or not where or not where:find("install.lua", 1, true) or message:sub(1, #row[2]) ~= row[2] then
      wrong[#wrong + 1] = tostring(err)
    end
  end
  local ok = pcall(plugin.setup, { sandbox = { tmpdir = tmpdir }, max_iterations = 3, progress = "statusline" })
  report(#wrong == 0 and ok, "setup() raises at once on a misspelt option, with a \"did you mean\"",
    table.concat(wrong, " | "))
  next_case()
end

-- 8. :checkhealth rlm: printed, with no ERROR row and the session row OK.
cases[#cases + 1] = function(next_case)
  out:write("\n")
  vim.cmd("checkhealth rlm")
  local lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  local text = table.concat(lines, "\n")
  for _, line in ipairs(lines) do
    if line ~= "" then
      out:write("# " .. line .. "\n")
    end
  end
  report(not text:find("ERROR") and text:find("OK: a sandboxed session answered", 1, true) ~= nil
    and text:find("OK: rlm.core", 1, true) ~= nil,
    ":checkhealth rlm reports the core, the sandbox and a session, with no error",
    ("%d lines"):format(#lines))
  next_case()
end

harness.run(cases)
