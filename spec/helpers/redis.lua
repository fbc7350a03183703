-- A redis-server of the spec's own, for the journal's Redis store
-- (spec/journal_spec.lua): started on a unix socket in a directory the
-- spec made (no TCP port, nothing saved), and stopped by its pid; never the
-- system's service. Debian's lua-redis is the client (as scripts use it):
-- it ships redis.lua for Lua 5.1 to 5.3, pure Lua, and Lua 5.4 loads the
-- 5.3 copy.
local H = require("helpers")

local R = {}

-- The redis-lua module, or nil, why.
function R.client_module()
  local ok, redis = pcall(require, "redis")
  if ok then
    return redis
  end
  local path = "/usr/share/lua/5.3/redis.lua"
  if not io.open(path) then
    return nil, "lua-redis is not installed (make deps: apt-get install lua-redis)"
  end
  return dofile(path)
end

local function alive(pid)
  return io.open("/proc/" .. pid .. "/stat") ~= nil
end

-- A running server: { dir =, socket =, pid =, connect = function() ->
-- client, stop = function() }, or nil, why (no redis-server, or no
-- lua-redis: make deps installs both).
function R.start()
  if H.sh("command -v redis-server || true") == "" then
    return nil, "redis-server is not installed (make deps: apt-get install redis-server)"
  end
  local redis, why = R.client_module()
  if not redis then
    return nil, why
  end
  local dir = H.sh("mktemp -d /tmp/rlm-redis-spec.XXXXXX")
  assert(dir:match("^/tmp/rlm%-redis%-spec%.%w+$"), dir)
  local socket = dir .. "/redis.sock"
  local pid = tonumber(H.sh(("cd %s && redis-server --port 0 --unixsocket %s --unixsocketperm 700 --dir %s"
    .. " --save '' --appendonly no --logfile %s/redis.log >/dev/null 2>&1 & echo $!"):format(dir, socket, dir, dir)))
  local server = { dir = dir, socket = socket, pid = pid }
  function server.connect()
    return redis.connect({ scheme = "unix", path = socket })
  end
  function server.stop()
    if alive(pid) then
      os.execute("kill " .. pid)
      -- At a load of 12 a server may take its time to end.
      for _ = 1, 300 do
        if not alive(pid) then
          break
        end
        os.execute("sleep 0.05")
      end
    end
    os.execute(("rm -f %s/redis.sock %s/redis.log && rmdir %s"):format(dir, dir, dir))
  end
  for _ = 1, 400 do -- up to 20 s
    local ok, client = pcall(server.connect)
    if ok then
      client:quit()
      return server
    end
    if not alive(pid) then
      break
    end
    os.execute("sleep 0.05")
  end
  local log = H.sh("cat " .. dir .. "/redis.log 2>/dev/null")
  server.stop()
  error("redis-server did not start: " .. log)
end

return R
