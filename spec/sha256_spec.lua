-- rlm.core.sha256_hex (csrc/sha256.c): the sub-call cache's keys
-- (lua/rlm/engine/cache.lua).
local core = require("rlm.core")
local H = require("helpers")

describe("sha256_hex", function()
  -- FIPS 180-4's examples (NIST's SHA256.pdf) and the padding's edges: a
  -- tail of 55 bytes fits one block with the length, 56 needs two.
  local cases = {
    { "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
    { "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
    { "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
    { ("a"):rep(1000000), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0" },
    { ("a"):rep(55), "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318" },
    { ("a"):rep(56), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a" },
    { ("a"):rep(64), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb" },
    { "\0", "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d" },
  }
  for _, case in ipairs(cases) do
    it(("hashes %d bytes of %q"):format(#case[1], case[1]:sub(1, 8)), function()
      assert.equals(case[2], core.sha256_hex(case[1]))
    end)
  end

  it("hashes as python's hashlib does, at every length from 0 to 299", function()
    local out = H.sh("python3 -c 'import hashlib, os\nfor n in range(300): b = os.urandom(n); "
      .. "print(b.hex(), hashlib.sha256(b).hexdigest())'")
    local n = 0
    for hex, digest in out:gmatch("(%x*) (%x+)\n?") do
      local bytes = hex:gsub("%x%x", function(h)
        return string.char(tonumber(h, 16))
      end)
      assert.equals(digest, core.sha256_hex(bytes), hex)
      n = n + 1
    end
    assert.equals(300, n)
  end)

  it("raises for a value that is not a string", function()
    assert.has_error(function()
      core.sha256_hex({})
    end)
  end)
end)
