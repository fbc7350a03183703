-- rlm.llm.transport.nvim: rlm.llm.openai's transport inside Neovim. Each
-- request is a curl process started with jobstart(), so the editor never
-- waits on the network: the transport yields the coroutine it runs in (the
-- one rlm.adapters.nvim runs each model callback in) and curl's exit resumes
-- it.
--
-- Why curl through jobstart: Neovim has no HTTP client of its own; curl is
-- what its own plugins shell out to, and jobstart() is there from 0.5 on
-- (vim.system only from 0.10; Debian 12 ships 0.7). The API key and every
-- other header go to curl on its stdin, as a config file (-K -), never on
-- its command line, where other users' `ps` would see them; the body goes
-- through a file in Neovim's private temporary directory (mode 0700).
-- luacheck: read globals vim
local unpack = require("rlm.base.util").unpack

local checks = require("rlm.base.checks")
local http1 = require("rlm.llm.transport.http1")

local M = {}

-- The largest reply body kept; a longer one fails the request.
M.DEFAULT_MAX_BODY_BYTES = 32 * 2 ^ 20

-- A value in curl's config syntax: double quotes, with \ and " escaped.
-- Newlines cannot be in a header; they are refused.
local function quoted(s)
  if s:find("[\r\n%z]") then
    error("rlm.llm.transport.nvim: a header value holds a line break", 0)
  end
  return '"' .. s:gsub('[\\"]', "\\%0") .. '"'
end

local function read_file(path, max)
  local f = io.open(path, "rb")
  if not f then
    return nil
  end
  local size = f:seek("end")
  if max and size > max then
    f:close()
    return nil, size
  end
  f:seek("set", 0)
  local s = f:read("*a")
  f:close()
  return s
end

-- The headers of the last response in a -D dump (a 100 Continue comes
-- first when curl sent "Expect"), with lower-case names.
local function parse_headers(dump)
  local last = {}
  for block in (dump .. "\r\n\r\n"):gmatch("(.-)\r\n\r\n") do
    if block:match("^HTTP/") then
      last = {}
      for name, value in block:gmatch("\n([^:\r\n]+):[ \t]*([^\r\n]*)") do
        last[name:lower()] = value
      end
    end
  end
  return last
end

-- Yields the running coroutine until resume_with() is called with its
-- results (at once is fine too).
local function suspend(start)
  local co, main = coroutine.running()
  if not co or main then
    error("rlm.llm.transport.nvim: must run in a coroutine (rlm.adapters.nvim runs model callbacks in one)", 0)
  end
  local results, waiting = nil, false
  start(function(...)
    results = { n = select("#", ...), ... }
    if waiting then
      waiting = false
      local ok, err = coroutine.resume(co)
      if not ok then
        error(err, 0)
      end
    end
  end)
  if not results then
    waiting = true
    repeat
      coroutine.yield()
    until results
  end
  return unpack(results, 1, results.n)
end

-- Why curl failed: its exit code and what it said on stderr (lines).
local function curl_failure(code, stderr)
  local why = table.concat(stderr, " "):gsub("%s+$", "")
  return ("curl exit %d: %s"):format(code, why ~= "" and why or "no reply")
end

-- Starts curl (argv, jobstart's opts) and hands it its config (the URL and
-- the headers: its stdin, never its argv); the job is in jobs while it
-- runs (stop() stops them). A job that cannot start cleans up and fails
-- the request; a curl that is not there says so in one line (jobstart
-- raised E475 with a traceback, and Debian's standard system has no curl).
local function start_curl(argv, opts, config, jobs, cleanup, finish)
  if vim.fn.executable(argv[1]) ~= 1 then
    cleanup()
    return finish(nil, ("%s is not installed: the plugin's model calls run it (make nvim installs it; "
      .. "Debian: apt-get install curl)"):format(argv[1]))
  end
  local job = vim.fn.jobstart(argv, opts)
  if job <= 0 then
    cleanup()
    return finish(nil, ("could not start %s (jobstart returned %d)"):format(argv[1], job))
  end
  jobs[job] = true
  vim.fn.chansend(job, table.concat(config, "\n") .. "\n")
  vim.fn.chanclose(job, "stdin")
  return job
end

-- new([opts]) -> transport(request): status, body, headers | nil, message;
-- and stop(), which ends the requests in flight (their curl is killed, each
-- fails with "cancelled") and fails every later one: a cancelled session's
-- model call must not run on to its end.
-- opts.curl: the curl binary (default "curl"); opts.max_body_bytes.
local SCHEMA = {
  curl = { checks.non_empty_string },
  max_body_bytes = { checks.integer(1) },
}

function M.new(opts)
  opts = checks.options("rlm.llm.transport.nvim.new", opts, SCHEMA)
  local curl = opts.curl or "curl"
  local max_body = opts.max_body_bytes or M.DEFAULT_MAX_BODY_BYTES
  local jobs, stopped = {}, false
  local function stop()
    stopped = true
    for job in pairs(jobs) do
      vim.fn.jobstop(job)
    end
  end
  local function transport(request)
    if stopped then
      return nil, "cancelled"
    end
    local base = vim.fn.tempname()
    local body_in, body_out, head_out = base .. ".req", base .. ".body", base .. ".head"
    local function cleanup()
      os.remove(body_in)
      os.remove(body_out)
      os.remove(head_out)
    end
    local f = assert(io.open(body_in, "wb"))
    f:write(request.body or "")
    f:close()
    local config = {}
    for name, value in pairs(request.headers or {}) do
      config[#config + 1] = "header = " .. quoted(name .. ": " .. value)
    end
    config[#config + 1] = "url = " .. quoted(request.url)
    if request.on_chunk then
      return suspend(function(finish)
        M._stream(curl, request, config, body_in, cleanup, max_body, jobs, function()
          return stopped
        end, finish)
      end)
    end
    return suspend(function(finish)
      local stdout, stderr = {}, {}
      start_curl({ curl, "-sS", "-K", "-", "-X", request.method or "POST",
        "--data-binary", "@" .. body_in, "-o", body_out, "-D", head_out, "-w", "%{http_code}",
        "--max-time", ("%.3f"):format((request.timeout_ms or 300000) / 1000),
        "--max-filesize", tostring(max_body), "--proto", "=http,https" }, {
        stdout_buffered = true,
        stderr_buffered = true,
        on_stdout = function(_, data)
          stdout = data
        end,
        on_stderr = function(_, data)
          stderr = data
        end,
        on_exit = function(job, code)
          jobs[job] = nil
          if stopped then
            cleanup()
            return finish(nil, "cancelled")
          end
          local status = tonumber(table.concat(stdout, ""))
          if code ~= 0 or not status or status == 0 then
            cleanup()
            return finish(nil, curl_failure(code, stderr))
          end
          local body, size = read_file(body_out, max_body)
          local headers = parse_headers(read_file(head_out) or "")
          cleanup()
          if not body then
            return finish(nil, size and ("the reply is %d bytes, more than %d"):format(size, max_body)
              or "curl wrote no reply body")
          end
          finish(status, body, headers)
        end,
      }, config, jobs, cleanup, finish)
    end)
  end
  return transport, stop
end

-- A request with on_chunk (a streamed reply): curl writes the reply's head
-- and body to its stdout as they come (-i -N), the head is read (bounded),
-- and a 2xx body goes to on_chunk piece by piece; any other body is kept,
-- up to max_body bytes. on_chunk's false (or nil, message) stops the job.
function M._stream(curl, request, config, body_in, cleanup, max_body, jobs, is_stopped, finish)
  local head, status, headers = {}, nil, nil
  local held, parts, stderr = 0, {}, {}
  local failed -- why the reply was given up
  local job
  local function take(bytes)
    if failed or bytes == "" then
      return
    end
    if not status then
      head[#head + 1] = bytes
      local all = table.concat(head)
      while true do
        local i = all:find("\r\n\r\n", 1, true)
        if not i then
          if #all > http1.MAX_HEAD_BYTES then
            failed = ("a reply head longer than %d bytes"):format(http1.MAX_HEAD_BYTES)
          end
          head = { all }
          return
        end
        local code, parsed = http1.parse_head(all:sub(1, i - 1))
        if not code then
          failed = parsed
          return
        end
        all = all:sub(i + 4)
        if code >= 200 then
          status, headers, head = code, parsed, nil
          bytes = all
          break
        end
      end
      if bytes == "" then
        return
      end
    end
    if status >= 200 and status < 300 then
      local ok, err = request.on_chunk(bytes)
      if not ok then
        failed = err or "the reply's reader stopped it"
      end
    else
      held = held + #bytes
      if held > max_body then
        failed = ("the reply is longer than %d bytes"):format(max_body)
      else
        parts[#parts + 1] = bytes
      end
    end
    if failed and job then
      vim.fn.jobstop(job)
    end
  end
  job = start_curl({ curl, "-sS", "-N", "-i", "-K", "-", "-X", request.method or "POST",
    "--data-binary", "@" .. body_in, "--max-time", ("%.3f"):format((request.timeout_ms or 300000) / 1000),
    "--proto", "=http,https" }, {
    -- Each call's lines: the first continues the last one of the call
    -- before, so joined with "\n" call after call they are the bytes.
    on_stdout = function(_, data)
      take(table.concat(data, "\n"))
    end,
    on_stderr = function(_, data)
      stderr[#stderr + 1] = table.concat(data, " ")
    end,
    on_exit = function(j, code)
      jobs[j] = nil
      cleanup()
      if is_stopped() then
        return finish(nil, "cancelled")
      elseif failed then
        return finish(nil, failed)
      elseif code ~= 0 or not status then
        return finish(nil, curl_failure(code, stderr))
      end
      finish(status, table.concat(parts), headers)
    end,
  }, config, jobs, cleanup, finish)
end

-- A sleep for rlm.llm.openai's retries that yields to the editor.
function M.sleep(seconds)
  return suspend(function(finish)
    vim.defer_fn(function()
      finish()
    end, math.floor(seconds * 1000))
  end)
end

return M
