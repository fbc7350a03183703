-- The Python-level guardrails: rails for a confused model, not the security
-- boundary (the OS sandbox is; see sandbox_spec). Each row is code and what
-- its step error must say.
local H = require("helpers")
local fence = H.fence

local function step_error(code, opts)
  local o = { root_llm = H.script({ fence(code), fence("FINAL('end')") }) }
  for k, v in pairs(opts or {}) do
    o[k] = v
  end
  local result, err = H.run(o)
  assert.is_nil(err, err and tostring(err))
  return result.history[1].error, result.history[1].stdout
end

describe("the guardrails", function()
  after_each(H.assert_clean)

  local refused = {
    { "import os", "ImportError" },
    { "import subprocess", "ImportError" },
    { "from io import open", "ImportError" },
    { "import collections\nprint(collections._sys)", "AttributeError" },
    { "import statistics\nprint(statistics.sys)", "AttributeError" },
    { "import random\nprint(random._os)", "AttributeError" },
    { "import typing\nprint(typing.sys)", "AttributeError" },
    { "open('/etc/hostname')", "GuardrailError" },
    { "eval('1+1')", "GuardrailError" },
    { "(_ for _ in ()).gi_frame.f_builtins", "GuardrailError" },
    { "print(().__class__.__bases__[0].__subclasses__())", "GuardrailError" },
    { "print('{0.__class__.__base__}'.format(1))", "GuardrailError" },
    { "getattr(1, 'real')", "GuardrailError" },
  }
  for _, case in ipairs(refused) do
    it(("refuses %q"):format(case[1]), function()
      local err = step_error(case[1])
      assert.is_string(err)
      assert.matches(case[2], err, 1, true)
    end)
  end

  it("lets ordinary code through", function()
    local err, out = step_error([[
import re, json, collections, itertools, math, statistics, textwrap, hashlib, base64
from collections import Counter
from dataclasses import dataclass
class Base:
    def __init__(self):
        self.n = 1
class Item(Base):
    def __init__(self):
        super().__init__()
        self.n += 1
print(Item().n, Item().__class__.__name__, Counter('aab').most_common(1),
      json.dumps({'a': 1}), re.findall(r'\d+', 'a1b22'), hashlib.sha256(b'x').hexdigest()[:8])]])
    assert.is_nil(err)
    assert.are.equal("2 Item [('a', 2)] {\"a\": 1} ['1', '22'] 2d711642\n", out)
  end)

  it("imports what allowed_modules adds", function()
    local err, out = step_error("import zlib\nprint(len(zlib.compress(b'aaaa')))",
      { allowed_modules = { "zlib" } })
    assert.is_nil(err)
    assert.matches("^%d+\n$", out)
  end)

  it("steps aside with guardrails = false", function()
    local err, out = step_error("import os\nprint(os.getcwd())", { guardrails = false })
    assert.is_nil(err)
    assert.are.equal("/session\n", out)
  end)
end)
