-- The resume specs' journal directories: a path of this process's own
-- under H.tmpdir for each test (the file store makes it), the entries a
-- store left there, and its removal by those names; a describe's store
-- for each test; a session abandoned mid-run; and a wait until a lease
-- taken now has run out.
local H = require("helpers")

local J = {}

local seq = 0
function J.fresh_dir(tag)
  seq = seq + 1
  return ("%s/journal-%s-%d-%d"):format(H.tmpdir, tag, H.pid(), seq)
end

-- The names in dir, sorted, its lock file left out.
function J.entries(dir)
  local names = {}
  local p = assert(io.popen("ls -A " .. dir .. " 2>/dev/null"))
  for name in p:read("*a"):gmatch("[^\n]+") do
    if name ~= ".lock" then
      names[#names + 1] = name
    end
  end
  p:close()
  table.sort(names)
  return names
end

function J.remove_dir(dir)
  for _, name in ipairs(J.entries(dir)) do
    os.remove(dir .. "/" .. name)
  end
  os.remove(dir .. "/.lock")
  os.remove(dir)
end

-- In a describe: before each test a fresh directory (tag's) and a file
-- store over it, handed to set(dir, store); after it the directory
-- removed and nothing of the session's left (H.assert_clean).
function J.each_store(tag, set)
  local busted, dir = require("busted"), nil
  busted.before_each(function()
    dir = J.fresh_dir(tag)
    set(dir, assert(require("rlm.journal").file(dir)))
  end)
  busted.after_each(function()
    J.remove_dir(dir)
    H.assert_clean()
  end)
end

-- Runs new_session()'s session until a callback of its yields "gone", then
-- drops it unclosed, as a host that went away: its sandbox is ended
-- (Handle:teardown: the driver and nothing of the journal), not left to
-- the garbage collector, which on LuaJIT was seen to keep an abandoned
-- session for 30 s after the spec's collections. Its journal id.
function J.abandon(new_session)
  local id, s
  local co = coroutine.create(function()
    s = new_session()
    id = s:journal_id()
    s:run()
  end)
  local ok, what = coroutine.resume(co)
  assert(ok, what)
  assert(what == "gone", "the session did not stop where asked: " .. tostring(what))
  s.sandbox:teardown()
  s, co = nil, nil -- luacheck: ignore 311
  collectgarbage()
  collectgarbage()
  return id
end

-- Waits until a lease of ttl seconds taken now has run out.
function J.past_lease(ttl)
  local until_s = os.time() + ttl + 1
  while os.time() < until_s do
    os.execute("sleep 0.1")
  end
end

return J
