-- rlm.core.base64_decode (csrc/base64.c): the probe's driver_zip and
-- driver_pyc, decoded by the host and by rlm-keeper at every cold start.
local core = require("rlm.core")
local H = require("helpers")

describe("base64_decode", function()
  local cases = {
    { "", "" },
    { "QQ==", "A" },
    { "QUI=", "AB" },
    { "QUJD", "ABC" },
    { "QUJDRA==", "ABCD" },
    { "+/+/", "\251\255\191" },
    { "AAAA", "\0\0\0" },
  }
  for _, case in ipairs(cases) do
    it(("decodes %q"):format(case[1]), function()
      assert.equals(case[2], core.base64_decode(case[1]))
    end)
  end

  local refused = {
    "QQ=", "QQ", "A===", "====", "QU=D", "=QUJ", "QUJD====", "QQ==QUJD", "Q Q=", "QUJD\n", "QUJ-", "QUJ_",
    "\0\0\0\0", "\255\255==", "QUJ\128",
  }
  for _, text in ipairs(refused) do
    it(("refuses %q"):format(text), function()
      assert.is_nil(core.base64_decode(text))
    end)
  end

  it("decodes what python's base64 encodes, at every length from 0 to 299", function()
    local out = H.sh("python3 -c 'import base64, os\nfor n in range(300): b = os.urandom(n); "
      .. "print(base64.b64encode(b).decode(), b.hex())'")
    local n = 0
    for b64, hex in out:gmatch("(%S*) (%x*)\n?") do
      local want = hex:gsub("%x%x", function(h)
        return string.char(tonumber(h, 16))
      end)
      assert.equals(want, core.base64_decode(b64), b64)
      n = n + 1
    end
    assert.equals(300, n)
  end)
end)
