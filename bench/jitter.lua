-- Figure 14, a batch under 429s: 64 llm_query calls in one llm_query_batch
-- (rlm.llm.openai over LuaSocket, all side by side) against a stand-in that
-- answers at most CAPACITY requests a window (bench/rate_limited.py) and a
-- 429 without Retry-After to the rest, so that the client's backoff decides
-- when they come back: with full jitter (the default: a uniform draw from 0
-- to retry_base_ms * 2^n) and without (exactly retry_base_ms * 2^n, the
-- calls of a burst coming back together). For each: the time the batch
-- takes, the requests it sent, and the most requests that reached the
-- server within one 10 ms. Floor: the same calls paced by a client that
-- knows the limit, CAPACITY at once every window, never refused.
local common = require("bench.common")
local cjson = require("cjson")
local socket = require("socket")
local http = require("socket.http")
local ltn12 = require("ltn12")
local openai = require("rlm.llm.openai")

local M = {}

local SIZES = {
  full = { calls = 64, capacity = 8, window_ms = 100, base_ms = 100, rounds = 3 },
  tiny = { calls = 16, capacity = 4, window_ms = 50, base_ms = 50, rounds = 1 },
}

local function start_server(env, size)
  local p = assert(io.popen(("exec %s -I -S %s %d %d"):format(env.python, common.path(env, "rate_limited.py"),
    size.capacity, size.window_ms), "r"))
  local port = tonumber(((p:read("*l") or ""):match("^(%d+)")))
  assert(port, "bench/rate_limited.py did not start")
  local base = "http://127.0.0.1:" .. port
  local function control(method, path)
    local chunks = {}
    local ok, status = http.request({ url = base .. path, method = method, sink = ltn12.sink.table(chunks),
      headers = { ["content-length"] = "0" }, source = method == "POST" and ltn12.source.string("") or nil })
    assert(ok and status == 200, "rate_limited.py control " .. path .. ": " .. tostring(status))
    return table.concat(chunks)
  end
  return {
    url = base .. "/v1",
    reset = function()
      control("POST", "/_control/reset")
    end,
    stats = function()
      return cjson.decode(control("GET", "/_control/stats"))
    end,
    stop = function()
      pcall(control, "POST", "/_control/stop")
      p:close()
    end,
  }
end

-- The most arrivals within any span of 10 ms, leaving out the first
-- `skip` (the batch's first attempts, which all go at once in every mode).
local function peak_10ms(arrivals, skip)
  table.sort(arrivals)
  local best, j = 0, skip + 1
  for i = skip + 1, #arrivals do
    while arrivals[i] - arrivals[j] >= 10 do
      j = j + 1
    end
    best = math.max(best, i - j + 1)
  end
  return best
end

local function prompts(n)
  local out = {}
  for i = 1, n do
    out[i] = "p" .. i
  end
  return out
end

-- One batch with the client's backoff: { ms =, requests =, peak =, failed = }.
local function batch(srv, size, jitter)
  local client = openai.new({ base_url = srv.url, model = "m", retries = 30, retry_base_ms = size.base_ms,
    retry_max_ms = 60000, jitter = jitter })
  srv.reset()
  local t0 = socket.gettime()
  local answers = client.llm_query_batch(prompts(size.calls))
  local ms = (socket.gettime() - t0) * 1000
  local failed = 0
  for _, a in ipairs(answers) do
    failed = failed + (a.text and 0 or 1)
  end
  local s = srv.stats()
  return { ms = ms, requests = #s.arrivals_ms, peak = peak_10ms(s.arrivals_ms, size.calls), failed = failed }
end

-- The floor: capacity calls at once, at the start of each of the server's
-- windows (its clock read once, here), the best a client can do. On a
-- loaded machine a call may still land in the next window and be refused:
-- it is asked again a window later (its requests show it).
local function paced(srv, size)
  local client = openai.new({ base_url = srv.url, model = "m", retries = 5, retry_base_ms = size.window_ms,
    jitter = false })
  srv.reset()
  local before = socket.gettime()
  local server_ms = srv.stats().now_ms
  local offset = server_ms - (before + socket.gettime()) / 2 * 1000 -- server clock - ours, ms
  local function next_window()
    local now = socket.gettime() * 1000 + offset
    local start = (math.floor(now / size.window_ms) + 1) * size.window_ms + 2
    socket.sleep((start - now) / 1000)
  end
  next_window()
  local t0 = socket.gettime()
  local left = size.calls
  while left > 0 do
    local n = math.min(size.capacity, left)
    local answers = client.llm_query_batch(prompts(n))
    for _, a in ipairs(answers) do
      assert(a.text, "the paced floor was refused: " .. tostring(a.error))
    end
    left = left - n
    if left > 0 then
      next_window()
    end
  end
  local ms = (socket.gettime() - t0) * 1000
  local s = srv.stats()
  return { ms = ms, requests = #s.arrivals_ms, peak = peak_10ms(s.arrivals_ms, 0) }
end

function M.run(env)
  local size = common.sizes(env, SIZES)
  local srv = start_server(env, size)
  local ok, err = pcall(function()
    local runs = { jitter = {}, lockstep = {}, floor = {} }
    for _ = 1, size.rounds do
      runs.floor[#runs.floor + 1] = paced(srv, size)
      runs.jitter[#runs.jitter + 1] = batch(srv, size, true)
      runs.lockstep[#runs.lockstep + 1] = batch(srv, size, false)
    end
    M.results = runs
  end)
  srv.stop()
  assert(ok, err)
  local runs = M.results
  local function med(list, field)
    local xs = {}
    for i, r in ipairs(list) do
      xs[i] = r[field]
    end
    return common.summary(xs)
  end
  local floor = med(runs.floor, "ms")
  local label = ("%d calls in one llm_query_batch, server answers %d per %d ms, 429 to the rest"):format(
    size.calls, size.capacity, size.window_ms)
  local floor_name = ("paced: %d at once every %d ms, never refused"):format(size.capacity, size.window_ms)
  local rows = {}
  for _, mode in ipairs({ { "jitter", "full jitter (default)" }, { "lockstep", "no jitter (jitter = false)" } }) do
    local list = runs[mode[1]]
    local requests, peak = med(list, "requests"), med(list, "peak")
    local failed = med(list, "failed")
    rows[#rows + 1] = common.time_row({
      figure = "14", name = label .. ", " .. mode[2], stats = med(list, "ms"), floor = floor,
      floor_name = floor_name,
      note = ("requests sent %d (floor %d); after the first %d at once, at most %d within 10 ms (the floor: %d); "
        .. "%d calls failed; retry_base_ms %d"):format(
        requests.median, med(runs.floor, "requests").median, size.calls, peak.median, med(runs.floor, "peak").median,
        failed.median, size.base_ms),
    })
    rows[#rows + 1] = common.context_row("14", "  " .. mode[2] .. ": most retries within 10 ms", peak.median,
      "requests", ("%d"):format(peak.median), peak.n, ("of %d requests sent; the first %d went at once"):format(
        requests.median, size.calls))
  end
  return rows
end

return M
