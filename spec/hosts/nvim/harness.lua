-- What the two Neovim host scripts (test.lua, install.lua) share: one
-- "ok - NAME: case" line per case on stdout, the cases run one after
-- another on the editor's loop, a wait that never blocks it, the session
-- scratch directory's entries, and the quit with the totals (after
-- timeout_ms at most, when given).
-- luacheck: globals vim
local uv = vim.uv or vim.loop

local M = {}

function M.new(name, tmpdir)
  local out = io.stdout
  local results = { passed = 0, failed = 0 }
  local h = {}

  function h.report(ok, case, detail)
    if ok then
      results.passed = results.passed + 1
      out:write(("ok - %s: %s%s\n"):format(name, case, detail and (" (" .. detail .. ")") or ""))
    else
      results.failed = results.failed + 1
      out:write(("not ok - %s: %s: %s\n"):format(name, case, tostring(detail)))
    end
    out:flush()
  end

  function h.fence(code)
    return "```repl\n" .. code .. "\n```"
  end

  function h.workdirs()
    local names = {}
    local handle = uv.fs_scandir(tmpdir)
    while handle do
      local entry = uv.fs_scandir_next(handle)
      if not entry then
        break
      end
      names[#names + 1] = entry
    end
    return names
  end

  -- Waits until cond() holds (or ms pass) without blocking the loop, then
  -- calls k(held).
  function h.wait_for(cond, ms, k)
    local t0 = uv.hrtime()
    local t = uv.new_timer()
    t:start(5, 5, vim.schedule_wrap(function()
      if t:is_closing() then
        return
      end
      local held = cond()
      if held or (uv.hrtime() - t0) / 1e6 > ms then
        t:stop()
        t:close()
        k(held)
      end
    end))
  end

  -- Runs cases[1], cases[2]... each called with the function that starts
  -- the next; a case that raises is a failure. Quits the editor at the end.
  function h.run(cases, timeout_ms)
    local watchdog = uv.new_timer()
    local function finish()
      if not watchdog:is_closing() then
        watchdog:stop()
        watchdog:close()
      end
      out:write(("# %s: %d passed, %d failed\n"):format(name, results.passed, results.failed))
      out:flush()
      vim.cmd(results.failed == 0 and "qall!" or "cquit! 1")
    end
    if timeout_ms then
      watchdog:start(timeout_ms, 0, vim.schedule_wrap(function()
        h.report(false, "the cases finish", ("still running after %d ms"):format(timeout_ms))
        finish()
      end))
    end
    local i = 0
    local function next_case()
      i = i + 1
      local case = cases[i]
      if not case then
        return finish()
      end
      vim.schedule(function()
        local ok, e = pcall(case, next_case)
        if not ok then
          h.report(false, "case " .. i .. " runs", e)
          next_case()
        end
      end)
    end
    next_case()
  end

  return h
end

return M
