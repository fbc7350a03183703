-- rlm.journal.file's directory and files (docs/durability.md, "Where the
-- journal may live"): it holds the conversation, so that only its owner
-- reads or writes it, what another user planted is refused, and a write
-- lands whole. rlm.core's journal_* functions check as much as the Lua
-- does, so that the store cannot be led out of its directory by either.
local core = require("rlm.core")
local journal = require("rlm.journal")
local H = require("helpers")

local function mode(path)
  return H.sh("stat -c %a " .. path)
end

local is_root = H.sh("id -u") == "0"

describe("rlm.journal.file", function()
  local tmp

  before_each(function()
    tmp = H.scratch("rlm-journal-spec")
  end)

  after_each(function()
    H.remove_scratch(tmp)
  end)

  it("makes its directory 0700 and its entries 0600, whatever the umask", function()
    local child = tmp .. "/make.lua"
    local f = assert(io.open(child, "w"))
    f:write(([[
local s = assert(require("rlm.journal").file(%q))
assert(s:set("s1.head", "secret conversation"))
assert(s:set_if("s1.lease", nil, "s1.lease", "x"))
]]):format(tmp .. "/j"))
    f:close()
    H.sh(("umask 000 && %s %s"):format(H.lua_name(), child))
    assert.equals("700", mode(tmp .. "/j"))
    assert.equals("600", mode(tmp .. "/j/s1.head"))
    assert.equals("600", mode(tmp .. "/j/s1.lease"))
    assert.equals("600", mode(tmp .. "/j/.lock"))
  end)

  -- Directories it must refuse: name, how the spec makes it (a path).
  local BAD_DIRS = {
    { "writable by all", function()
      os.execute("mkdir -m 0777 " .. tmp .. "/j")
      return tmp .. "/j"
    end },
    { "writable by its group", function()
      os.execute("mkdir -m 0770 " .. tmp .. "/j")
      return tmp .. "/j"
    end },
    { "another user's", function()
      if is_root then
        os.execute("mkdir -m 0700 " .. tmp .. "/j && chown 65534 " .. tmp .. "/j")
        return tmp .. "/j"
      end
      return "/usr" -- root's, 0755
    end },
    { "a link to a directory of this user's", function()
      os.execute(("mkdir -m 0700 %s/real && ln -s %s/real %s/j"):format(tmp, tmp, tmp))
      return tmp .. "/j"
    end },
    { "a regular file", function()
      os.execute("touch " .. tmp .. "/j")
      return tmp .. "/j"
    end },
  }
  for _, case in ipairs(BAD_DIRS) do
    it("refuses a directory " .. case[1], function()
      local path = case[2]()
      local s, err = journal.file(path)
      assert.is_nil(s)
      assert.is_string(err)
      local ok, why = core.journal_write(path, "s1.head", "x")
      assert.is_nil(ok)
      assert.is_string(why)
      assert.is_nil(io.open(path .. "/s1.head"))
    end)
  end

  it("refuses its directory once others may write it, at the next call", function()
    local s = assert(journal.file(tmp .. "/j"))
    assert.is_true(s:set("s1.head", "x"))
    os.execute("chmod 0777 " .. tmp .. "/j")
    local v, err = s:get("s1.head")
    assert.is_nil(v)
    assert.matches("not this user's alone", err)
    local ok
    ok, err = s:set("s1.head", "y")
    assert.is_nil(ok)
    assert.matches("not this user's alone", err)
    ok, err = s:set_if("s1.lease", nil, "s1.lease", "y")
    assert.is_nil(ok)
    assert.matches("not this user's alone", err)
  end)

  it("needs an absolute path", function()
    assert.error_matches(function()
      journal.file("relative/dir")
    end, "needs an absolute path")
  end)

  -- Entries it did not write: planted under a key's name, each must be
  -- refused by get (nil, message), and must not hang it.
  local PLANTED = {
    { "a link to a file of this user's, 0600", "chmod 0600 %s/target && ln -s %s/target %s/j/s1.head" },
    { "a FIFO", "mkfifo %s/j/s1.head" },
    { "a file others may read", "printf planted > %s/j/s1.head && chmod 0644 %s/j/s1.head" },
    { "a directory", "mkdir %s/j/s1.head" },
    { "a file past max_value_bytes", "head -c 2048 /dev/zero > %s/j/s1.head && chmod 0600 %s/j/s1.head" },
  }
  for _, case in ipairs(PLANTED) do
    it("refuses to read an entry that is " .. case[1], function()
      local s = assert(journal.file(tmp .. "/j", { max_value_bytes = 1024 }))
      local f = assert(io.open(tmp .. "/target", "w"))
      f:write("the target's text")
      f:close()
      os.execute(case[2]:gsub("%%s", tmp))
      local v, err = s:get("s1.head")
      assert.is_nil(v)
      assert.is_string(err)
    end)
  end

  if is_root then
    it("refuses to read an entry of another user's", function()
      local s = assert(journal.file(tmp .. "/j"))
      assert.is_true(s:set("s1.head", "x"))
      os.execute("chown 65534 " .. tmp .. "/j/s1.head")
      local v, err = s:get("s1.head")
      assert.is_nil(v)
      assert.matches("is not the store's", err)
    end)
  end

  it("replaces a link planted under a key, never writing through it", function()
    local s = assert(journal.file(tmp .. "/j"))
    local f = assert(io.open(tmp .. "/target", "w"))
    f:write("the target's text")
    f:close()
    os.execute(("ln -s %s/target %s/j/s1.head"):format(tmp, tmp))
    assert.is_true(s:set("s1.head", "journal"))
    assert.equals("the target's text", H.read_file(tmp .. "/target"))
    assert.equals("journal", s:get("s1.head"))
    assert.equals("", H.sh("find " .. tmp .. "/j -type l"))
  end)

  it("leaves no temporary file behind its writes", function()
    local s = assert(journal.file(tmp .. "/j"))
    for i = 1, 50 do
      assert.is_true(s:set("s1.step." .. (i % 5), ("x"):rep(i * 100)))
    end
    assert.equals("s1.step.0\ns1.step.1\ns1.step.2\ns1.step.3\ns1.step.4", H.sh("ls -A " .. tmp .. "/j | sort"))
  end)

  it("checks names in rlm.core too: no function there leaves the directory", function()
    local s = assert(journal.file(tmp .. "/j"))
    assert(s)
    for _, name in ipairs({ "../x", "/tmp/x", "a/b", ".lock", "..", "" }) do
      assert.error_matches(function()
        core.journal_read(tmp .. "/j", name, 10)
      end, "not a journal key")
      assert.error_matches(function()
        core.journal_write(tmp .. "/j", name, "x")
      end, "not a journal key")
      assert.error_matches(function()
        core.journal_remove(tmp .. "/j", name)
      end, "not a journal key")
    end
    assert.is_nil(io.open(tmp .. "/x"))
  end)

  it("runs docs/durability.md's example as it stands, in a directory of the spec's", function()
    local doc = H.read_file("docs/durability.md")
    local after = assert(doc:match("<!%-%- spec/journal_file_spec%.lua runs this block %-%->%s*\n(.*)$"))
    local block = assert(after:match("^```lua\n(.-)\n```\n"))
    local code, n = block:gsub("/var/lib/myapp/rlm%-journal", tmp .. "/j")
    assert.equals(1, n)
    local printed = {}
    local env = setmetatable({ print = function(...)
      printed[#printed + 1] = table.concat({ tostring(select(1, ...)), tostring(select(2, ...)),
        tostring(select(3, ...)) }, " ")
    end }, { __index = _G })
    local chunk = assert((loadstring or load)(code, "=durability.md", "t", env))
    if setfenv then
      setfenv(chunk, env)
    end
    chunk()
    assert.are.same({ "nil lease_held host-a:4711" }, printed)
    assert.equals("", H.sh("ls " .. tmp .. "/j"))
  end)

  it("sweeps the entries past their lifetime and the temporary files as old, and only those", function()
    local s = assert(journal.file(tmp .. "/j", { ttl = 60 }))
    assert.is_true(s:set("old.head", "x"))
    assert.is_true(s:set("new.head", "y"))
    os.execute("touch -d '-2 minutes' " .. tmp .. "/j/old.head")
    -- What writers that died between their create and their rename left:
    -- one long ago, one that may be a write in progress.
    os.execute(("cd %s/j && echo x > .tmp-old.head-1-1 && touch -d '-2 minutes' .tmp-old.head-1-1"
      .. " && echo y > .tmp-new.head-1-2"):format(tmp))
    assert.is_nil(s:get("old.head"))
    assert.equals(1, s:sweep())
    assert.is_nil(io.open(tmp .. "/j/old.head"))
    assert.equals("y", s:get("new.head"))
    assert.equals(".lock .tmp-new.head-1-2 new.head", H.sh("ls -A " .. tmp .. "/j | sort | tr '\\n' ' '"):gsub(" $", ""))
    assert.equals(0, s:sweep())
  end)
end)
