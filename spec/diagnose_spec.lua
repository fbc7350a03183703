-- rlm.diagnose: what the machine gives the sandbox, and the sentence that
-- says which need is missing when bubblewrap cannot start.
local diagnose = require("rlm.diagnose")
local H = require("helpers")

describe("rlm.diagnose", function()
  -- bubblewrap's output -> a pattern the explanation must match (one row a case)
  local cases = {
    { "bwrap: Unknown option --disable-userns", "older than 0%.8" },
    { "bwrap: Can't mount proc on /newroot/proc: Operation not permitted", "systempaths=unconfined" },
    { "bwrap: No permissions to creating new namespace, likely because the kernel does not allow "
      .. "non-privileged user namespaces.", "namespace" },
    { "bwrap: setting up uid map: Permission denied", "namespace" },
    -- The errno, not the step, says what to change (issue 32): none of
    -- these is a container's doing.
    { "bwrap: setting up uid map: Invalid argument", "below 2%^31" },
    { "bwrap: Creating new namespace failed: Resource temporarily unavailable", "RLIMIT_NPROC" },
    { "starting the sandbox's keeper thread: Resource temporarily unavailable", "ulimit %-u" },
    { "bwrap: Creating new namespace failed: No space left on device", "max_user_namespaces" },
  }
  for _, case in ipairs(cases) do
    it("explains " .. case[1]:sub(1, 50), function()
      local why = diagnose.explain(case[1])
      assert.is_string(why)
      assert.matches(case[2], why)
      assert.are.equal(" (" .. why .. ")", diagnose.hint(case[1]))
    end)
  end

  it("blames no container for an errno that is not a refusal", function()
    for _, out in ipairs({ "bwrap: setting up uid map: Invalid argument",
      "bwrap: Creating new namespace failed: Resource temporarily unavailable",
      "spawning /usr/bin/bwrap: Resource temporarily unavailable" }) do
      local why = diagnose.explain(out)
      assert.is_string(why, out)
      assert.is_nil(why:find("container", 1, true), why)
      assert.is_nil(why:find("user namespaces are off", 1, true), why)
    end
  end)

  it("says nothing about output it does not know", function()
    assert.is_nil(diagnose.explain("python3: not found"))
    assert.are.equal("", diagnose.hint("python3: not found"))
  end)

  it("finds bubblewrap runnable here, with the sandbox's namespaces and mounts", function()
    local rows = {}
    for _, row in ipairs(diagnose.checks()) do
      rows[row.name] = row
    end
    assert.are.equal("ok", rows.bubblewrap.level, rows.bubblewrap.message)
    assert.are.equal("ok", rows.sandbox.level, rows.sandbox.message)
    assert.are.equal("ok", rows.interpreter.level, rows.interpreter.message)
    -- "poll: why" where no cgroup may be made (an unprivileged user on v1),
    -- naming what the poll does not see
    local memory = rows["memory limit"].message
    assert.is_truthy(memory:match("^cgroup v[12]: ") or memory:match("^poll: .+kernel's own memory"), memory)
  end)

  -- CapEff masks: everything; all but CAP_SYS_ADMIN (bit 21); all but
  -- CAP_SETUID and CAP_SETGID (bits 7, 6); none.
  it("reads which capabilities a root start needs are missing", function()
    local function missing(mask)
      return diagnose.missing_root_caps("Name:\tlua\nCapEff:\t" .. mask .. "\n")
    end
    assert.are.same({}, missing("000001ffffffffff"))
    assert.are.same({ "CAP_SYS_ADMIN" }, missing("000001ffffdfffff"))
    assert.are.same({ "CAP_SETGID", "CAP_SETUID" }, missing("000001ffffffff3f"))
    assert.are.same({ "CAP_SETGID", "CAP_SETUID", "CAP_SYS_ADMIN" }, missing("0000000000000000"))
  end)

  -- As root, a start that the kernel refuses for want of a capability says
  -- so, and blames no user namespace (issue 31: it said "spawning bwrap as
  -- the sandbox's uid: Operation not permitted", or blamed the container's
  -- user namespaces). A real session under setpriv, the capability dropped.
  local is_root = H.sh("id -u"):match("^0") ~= nil
  local has_setpriv = H.sh("command -v setpriv || true") ~= ""
  local it_root = (is_root and has_setpriv) and it or function(name)
    it(name, function()
      print("\n# skipped: needs root and setpriv (util-linux) to drop a capability")
    end)
  end
  local SESSION = [[
local s = require("rlm").Session.new({ context = "x", sandbox = { tmpdir = os.getenv("TMPDIR") },
  root_llm = function() return "```repl\nFINAL('ok')\n```" end, llm_query = print })
local r, e = s:run()
s:close()
io.write(r and "answered" or tostring(e))
]]
  for _, case in ipairs({ { "sys_admin", "CAP_SYS_ADMIN" }, { "setuid,-setgid", "CAP_SETGID, CAP_SETUID" } }) do
    it_root("names the missing " .. case[2] .. " when a root host cannot start the sandbox", function()
      local script = os.tmpname()
      local f = assert(io.open(script, "wb"))
      f:write(SESSION)
      f:close()
      local out = H.sh(("TMPDIR=%s setpriv --bounding-set=-%s --inh-caps=-%s %s %s 2>&1"):format(H.tmpdir,
        case[1], case[1], H.lua_name(), script))
      os.remove(script)
      assert.matches("^rlm: sandbox_unavailable: ", out)
      assert.is_truthy(out:find("running as root without " .. case[2] .. " ", 1, true), out)
      assert.is_nil(out:find("user namespaces are off", 1, true), out)
      assert.is_nil(out:find("create user namespaces", 1, true), out)
    end)
  end

  it("reports a missing bubblewrap as an error naming the package", function()
    local rows = diagnose.checks({ bwrap = "/nonexistent/bwrap" })
    assert.are.equal("error", rows[1].level)
    assert.matches("apt%-get install bubblewrap", rows[1].message)
  end)
end)
