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

  -- Allowed functions that evaluate strings or fetch attributes named by
  -- data, with the real builtins or in another module's globals: each case
  -- prints ESCAPED if it reaches what the guardrails hide.
  local bypasses = {
    { "typing.get_type_hints on a string annotation", [[
import typing
class A:
    x: "print('ESCAPED', __import__('os').getcwd())"
typing.get_type_hints(A)]], "ImportError" },
    { "a string annotation in a module named by __module__", [[
import typing
class A:
    __module__ = 'os'
    x: "print('ESCAPED', getcwd())"
typing.get_type_hints(A)]], "NameError" },
    { "a string annotation in the globals of a wrapped driver function", [[
import typing, functools
def g(x: "print('ESCAPED', os.getcwd())"): pass
functools.update_wrapper(g, FINAL, assigned=())
typing.get_type_hints(g)]], "NameError" },
    { "a string annotation with empty globals, where eval adds the real builtins", [[
import typing
def g(x: "print('ESCAPED', __loader__.load_module('posix').getcwd())"): pass
typing.get_type_hints(g, globalns={})]], "GuardrailError" },
    { "a string annotation that walks dunders", [[
import typing
class A:
    x: "print('ESCAPED', ().__class__.__base__.__subclasses__()[0])"
typing.get_type_hints(A)]], "GuardrailError" },
    { "string.Formatter().get_field", [[
import string
print('ESCAPED', string.Formatter().get_field('0.__globals__', (FINAL,), {})[0]['os'])]],
      "GuardrailError" },
    { "Formatter.get_field through super()", [[
import string
class F(string.Formatter): pass
print('ESCAPED', super(F, F()).get_field('0.__globals__', (FINAL,), {})[0]['os'])]],
      "GuardrailError" },
    { "operator.attrgetter", [[
import operator
print('ESCAPED', operator.attrgetter('__globals__')(FINAL)['os'])]], "GuardrailError" },
    { "operator.attrgetter's own type", [[
import operator
print('ESCAPED', type(operator.attrgetter('real'))('__globals__')(FINAL)['os'])]], "TypeError" },
    { "operator.methodcaller", [[
import operator
print('ESCAPED', operator.methodcaller('__getattribute__', '__globals__')(FINAL)['os'])]],
      "GuardrailError" },
    { "a format template built at run time", [[
t = '{0.__glo' + 'bals__[os]}'
print('ESCAPED', t.format(FINAL))]], "GuardrailError" },
    { "str.format called unbound", [[
t = '{0.__glo' + 'bals__[os]}'
print('ESCAPED', str.format(t, FINAL))]], "GuardrailError" },
    { "str.format_map", [[
t = '{x.__glo' + 'bals__[os]}'
print('ESCAPED', t.format_map({'x': FINAL}))]], "GuardrailError" },
    { "str.format passed as a value", [[
t = '{0.__glo' + 'bals__[os]}'
print('ESCAPED', list(map(str.format, [t], [FINAL])))]], "GuardrailError" },
    { "str.format through methodcaller", [[
import operator
t = '{0.__glo' + 'bals__[os]}'
print('ESCAPED', operator.methodcaller('format', FINAL)(t))]], "GuardrailError" },
  }
  for _, case in ipairs(bypasses) do
    it("closes " .. case[1], function()
      local err, out = step_error(case[2])
      assert.is_string(err)
      assert.is_nil(out:find("ESCAPED", 1, true), out)
      assert.matches(case[3], err, 1, true)
    end)
  end

  -- A string annotation resolves in the REPL's namespace (its __main__).
  it("lets dataclasses, typing, namedtuple, enum and format through", function()
    local err, out = step_error([[
from dataclasses import dataclass, field, asdict
import typing, collections, enum, operator, string
@dataclass
class P:
    x: int
    y: "list[int]" = field(default_factory=list)
    format: str = 'f'
    def __post_init__(self):
        self.z = 1
@dataclass(frozen=True, order=True)
class Q:
    a: int
class T(typing.NamedTuple):
    a: int
    b: 'str' = 'x'
class Tree:
    kids: 'typing.List[Tree]'
N = collections.namedtuple('N', 'a b')
E = enum.Enum('E', 'x y')
fmt = '{} {name}'
print(P(1), Q(2) < Q(3), asdict(P(2))['x'], typing.get_type_hints(T)['b'].__name__, N(1, 2).b,
      E.x.name, operator.attrgetter('real', 'imag')(3), operator.methodcaller('upper')('a'),
      fmt.format(1, name='n'), str.format('{0.x}', P(7)), string.Formatter().format('{0.z}', P(3)),
      typing.get_type_hints(Tree)['kids'] == typing.List[Tree])]])
    assert.is_nil(err)
    assert.are.equal("P(x=1, y=[], format='f') True 2 str 2 x (3, 0) A 1 n 7 1 True\n", out)
  end)

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
      { sandbox = { allowed_modules = { "zlib" } } })
    assert.is_nil(err)
    assert.matches("^%d+\n$", out)
  end)

  it("keeps the driver's own package out of reach, even when allowed_modules names it", function()
    local err = step_error("import _rlm_driver")
    assert.matches("ImportError: import of '_rlm_driver' is refused", err, 1, true)
    err = step_error("import _rlm_driver.protocol", { sandbox = { allowed_modules = { "_rlm_driver" } } })
    assert.matches("ImportError: import of private module '_rlm_driver.protocol' is refused", err, 1, true)
    -- Not on the import path either: /rlm is where the sandbox keeps it.
    local _, out = step_error("import json\nprint(json.dumps([p for p in __import__('sys').path if p.startswith('/rlm')]))",
      { guardrails = false })
    assert.are.equal("[]\n", out)
  end)

  it("steps aside with guardrails = false", function()
    local err, out = step_error("import os\nprint(os.getcwd())", { guardrails = false })
    assert.is_nil(err)
    assert.are.equal("/session\n", out)
  end)
end)
