-- macOS: the sandbox-exec profile's text. It cannot run here (Linux); these
-- pin what it says.

local function read(path)
  local f = assert(io.open(path, "r"))
  local s = f:read("*a")
  f:close()
  return s
end

describe("the macOS sandbox", function()
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
