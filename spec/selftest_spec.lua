-- The start-up self-test refuses a weakened sandbox. Each case runs the
-- session through a bubblewrap wrapper that silently drops or adds one
-- protection, and the session must end with sandbox_violation, naming the
-- check that caught it, before any model code runs.
local H = require("helpers")
local core = require("rlm.core")

local real_bwrap = core.find_program("bwrap")
local bin = H.tmpdir .. "-bin"
local home = os.getenv("HOME") or "/root"
local is_root = H.sh("id -u") == "0"
-- Whether the sandbox's uid could write the interpreter's installation if
-- it were bound read-write: only when the host is not root and owns it.
local owns_install = not is_root and H.sh("stat -c %u \"$(readlink -f \"$(command -v python3)\")\"") == H.sh("id -u")

-- A wrapper that passes the arguments through `filter` (shell `case`
-- patterns on each argument, setting skip=N to drop the N after it), puts
-- `extra` (bwrap options) before the root is made read-only, and runs the
-- real bubblewrap.
local function wrapper(name, filter, extra)
  local path = bin .. "/" .. name
  local f = assert(io.open(path, "w"))
  f:write("#!/bin/sh\nskip=0\nfor a do\n  shift\n  if [ $skip -gt 0 ]; then skip=$((skip - 1)); continue; fi\n",
    "  case \"$a\" in\n", filter or "",
    "    --remount-ro) if [ -z \"$done\" ]; then done=1; set -- \"$@\" ", extra or "",
    " --remount-ro; continue; fi ;;\n",
    "  esac\n  set -- \"$@\" \"$a\"\ndone\n",
    "exec ", real_bwrap, " \"$@\"\n")
  f:close()
  os.execute("chmod +x " .. path)
  return path
end

local cases = {
  -- name, filter, extra options, the check that must fail
  { "no seccomp filter", "    --seccomp) skip=1; continue ;;\n", nil, "seccomp" },
  { "the host's network", "    --unshare-all) set -- \"$@\" --unshare-pid --unshare-ipc --unshare-uts; continue ;;\n",
    nil, "network" },
  { "the host's pid namespace", "    --unshare-all) set -- \"$@\" --unshare-net --unshare-ipc --unshare-uts; continue ;;\n",
    nil, "pid_namespace" },
  -- On a root host the sandbox's uid cannot even reach /root: bubblewrap
  -- fails to bind it, and the session never starts.
  { "the home directory bound in", nil, "--ro-bind " .. home .. " " .. home, "canaries",
    root_kind = "sandbox_unavailable" },
  -- The host's /proc/zoneinfo where /dev/null should cover each file.
  { "the host's kernel state in /proc", "    /dev/null) set -- \"$@\" /proc/zoneinfo; continue ;;\n", nil,
    "proc_hidden" },
  { "capabilities kept", "    --cap-drop) skip=1; continue ;;\n", "--cap-add ALL", "capabilities" },
  { "a variable from the host", nil, "--setenv AWS_SECRET_ACCESS_KEY leaked", "environment" },
  -- Only a bind of an installation the sandbox's uid owns makes it
  -- writable: root's files stay root's, whoever the host is.
  { "a writable installation", "    --ro-bind) set -- \"$@\" --bind; continue ;;\n", nil, "read_only_install",
    applies = owns_install },
}

describe("the self-test", function()
  setup(function()
    os.execute("mkdir -p " .. bin)
  end)
  teardown(function()
    os.execute("rm -rf " .. bin)
  end)
  after_each(H.assert_clean)

  it("passes the real sandbox", function()
    local result, err = H.run({})
    assert.is_nil(err, err and tostring(err))
    assert.are.equal("done", result.answer)
  end)

  for i, case in ipairs(cases) do
    it("refuses a sandbox with " .. case[1], function()
      if case.applies == false then
        pending("the interpreter's installation is not the sandbox uid's to write: " .. case[1])
        return
      end
      local ran = false
      local result, err = H.run({
        bwrap = wrapper("bwrap" .. i, case[2], case[3]),
        root_llm = function()
          ran = true
          return "FINAL(1)"
        end,
      })
      assert.is_nil(result)
      if is_root and case.root_kind then
        assert.are.equal(case.root_kind, err.kind)
      else
        assert.are.equal("sandbox_violation", err.kind)
        assert.matches(case[4], err.message, 1, true)
      end
      assert.is_false(ran)
    end)
  end
end)
