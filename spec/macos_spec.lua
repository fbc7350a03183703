-- macOS: the sandbox-exec command and the profile text. They cannot run
-- here (Linux); these pin what they say.
local core = require("rlm.core")

local function read(path)
  local f = assert(io.open(path, "r"))
  local s = f:read("*a")
  f:close()
  return s
end

describe("the macOS sandbox", function()
  local spec = {
    sandbox_exec = "/usr/bin/sandbox-exec", profile = "/opt/rlm/macos.sb",
    python = "/opt/homebrew/bin/python3.12", python_prefix = "/opt/homebrew/Frameworks/Python.framework",
    driver = "/opt/rlm/repl_driver.py", workdir = "/private/tmp/rlm-abc123",
  }

  it("builds the sandbox-exec command with the profile's parameters", function()
    assert.are.same({
      "/usr/bin/sandbox-exec",
      "-D", "PYTHON=/opt/homebrew/bin/python3.12",
      "-D", "PYTHON_PREFIX=/opt/homebrew/Frameworks/Python.framework",
      "-D", "DRIVER=/opt/rlm/repl_driver.py",
      "-D", "WORKDIR=/private/tmp/rlm-abc123",
      "-f", "/opt/rlm/macos.sb",
      "/opt/homebrew/bin/python3.12", "-I", "-S", "-B", "/opt/rlm/repl_driver.py",
    }, core.macos_argv(spec))
  end)

  it("refuses a relative or empty path", function()
    for _, key in ipairs({ "python", "python_prefix", "driver", "workdir" }) do
      local bad = {}
      for k, v in pairs(spec) do
        bad[k] = v
      end
      bad[key] = "relative/path"
      local argv, err = core.macos_argv(bad)
      assert.is_nil(argv)
      assert.matches("must be an absolute path", err)
    end
  end)

  local profile = read("sandbox/macos.sb")
  local rules = {
    -- what the profile must say, and what it must not
    { "denies by default", "(deny default)", true },
    { "denies the network", "(deny network*)", true },
    { "denies new processes", "(deny process-fork)", true },
    { "runs only the interpreter", '(allow process-exec (literal (param "PYTHON")))', true },
    { "writes only to the workdir", '(allow file-read* file-write* (subpath (param "WORKDIR")))', true },
    { "allows no network", "(allow network", false },
    { "allows no fork", "(allow process-fork", false },
    { "imports no broad system profile", "(import", false },
    { "writes nowhere else", "file-write* (subpath \"/", false },
  }
  for _, r in ipairs(rules) do
    it("profile " .. r[1], function()
      assert.are.equal(r[3], profile:find(r[2], 1, true) ~= nil)
    end)
  end
end)
