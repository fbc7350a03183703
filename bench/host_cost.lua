-- Figure 6, what sessions cost the host: the VmRSS this Lua process gains per
-- open idle session (each after one step), and the time to start 100
-- sessions one after another, each kept open until all are started. The
-- start's floor is that many spawns of bubblewrap with the echo driver
-- (as in figure 1), measured here.
local common = require("bench.common")

local M = {}

local SIZES = {
  full = { idle = 50, starts = 100, floor_samples = 10 },
  tiny = { idle = 2, starts = 3, floor_samples = 1 },
}

local function settle()
  collectgarbage()
  collectgarbage()
  return common.status_kb("self", "VmRSS") * 1024, collectgarbage("count") * 1024
end

function M.run(env)
  local size = common.sizes(env, SIZES)
  -- One session first, so that what a process sets up once (the
  -- interpreter probe, the first allocations of libuv and cjson) is not
  -- charged to the sessions.
  local warm = common.start(env)
  warm:close()
  local rss0, lua0 = settle()
  local sessions, times, total = {}, {}, 0
  local rss_idle, lua_idle
  local ok, err = pcall(function()
    for i = 1, size.starts do
      local t = common.now_ms()
      sessions[i] = common.start(env)
      times[i] = common.now_ms() - t
      total = total + times[i]
      if i == size.idle then
        rss_idle, lua_idle = settle()
      end
    end
  end)
  local t_close = common.now_ms()
  for _, s in ipairs(sessions) do
    s:close()
  end
  local close_ms = common.now_ms() - t_close
  assert(ok, err)

  local workdir = env.scratch .. "/host-cost-workdir"
  os.execute("mkdir -p " .. common.quote(workdir))
  local floor, why = common.floor(env, "first", size.floor_samples, common.sandbox_echo_argv(env, workdir))
  common.remove_tree(workdir)

  local per = (rss_idle - rss0) / size.idle
  local per_lua = (lua_idle - lua0) / size.idle
  local limit = 256 * 1024
  local rows = {
    {
      figure = "6", name = ("host VmRSS per open idle session (%d open)"):format(size.idle),
      value = per / 1024, unit = "KB", n = size.idle,
      text = ("%.0f KB (Lua heap %.0f KB)"):format(per / 1024, per_lua / 1024),
      no_floor = "none: the target is absolute",
      target = "< 256 KB", met = per < limit,
    },
  }
  local row = common.time_row({
    figure = "6", name = ("start %d sessions, sequentially, all kept open"):format(size.starts),
    stats = { median = total, n = 1 },
    floor = floor and { median = common.median(floor) * size.starts, n = #floor },
    floor_missing = why,
    floor_name = ("%d x the median bwrap + echo driver first answer"):format(size.starts),
  })
  row.note = ("median start %.3g ms; no target"):format(common.median(times))
  rows[#rows + 1] = row
  rows[#rows + 1] = common.context_row("6", ("close %d sessions"):format(size.starts), close_ms, "ms",
    ("%.3g ms"):format(close_ms), size.starts)
  return rows
end

return M
