-- A busted output handler: TAP (what spec/run counts), and after each spec
-- file one TAP comment, "# file: <lua> <file>: N ok, N failed, N s", that
-- spec/run shows while the suite runs.
return function(options)
  local busted = require("busted")
  local handler = require("busted.outputHandlers.TAP")(options)
  local lua = os.getenv("RLM_SPEC_LUA") or "lua"
  local ok, failed, started = 0, 0, os.time()
  busted.subscribe({ "file", "start" }, function()
    ok, failed, started = 0, 0, os.time()
    return nil, true
  end)
  busted.subscribe({ "test", "end" }, function(_, _, status)
    if status == "success" or status == "pending" then
      ok = ok + 1
    else
      failed = failed + 1
    end
    return nil, true
  end)
  busted.subscribe({ "file", "end" }, function(file)
    io.write(string.format("# file: %s %s: %d ok, %d failed, %d s\n", lua, file.name, ok, failed,
      os.time() - started))
    io.flush()
    return nil, true
  end)
  return handler
end
