-- What spec/resume_attach_spec.lua and its host (spec/helpers/resume_host.lua)
-- share: the run they both drive, its session options over a local
-- rlm-keeper that lingers (helpers.linger's sandbox), and a file journal
-- whose writes can be watched.
local journal = require("rlm.journal")
local D = require("helpers.linger")

local R = {}

local function fence(code)
  return "```repl\n" .. code .. "\n```"
end

-- Three turns: step 1 sets x, n = 0 and tok, and prints tok (random: a
-- token of the REPL's own, which a fresh REPL would make otherwise, and
-- whose replay would print otherwise; else fixed, so that a replay can do
-- the same); step 2 counts itself in n and asks q1 (with tok) and q2;
-- step 3 answers with all of them. n is 1 in the answer only if step 2's
-- code ran once in that REPL.
function R.turns(random)
  return {
    fence("import random\ntok = " .. (random and "'%x' % random.SystemRandom().getrandbits(64)" or "'fixed'") .. "\nx = 42\nn = 0\nprint('set', tok)"),
    fence("n += 1\na = llm_query('q1 ' + tok)\nb = llm_query('q2')\nprint('two', n, b)"),
    fence("FINAL(f'{x} {n} {a} {b}')"),
  }
end

-- The answer when tok is as said.
function R.answer(tok)
  return ("42 1 sub:q1 %s sub:q2"):format(tok)
end

-- A file store in dir; after(key), when given, is called once each write
-- of the lease's (set_if) is in.
function R.store(dir, after)
  local file = assert(journal.file(dir))
  local store = {}
  for _, m in ipairs({ "get", "set", "delete", "set_if" }) do
    store[m] = function(_, ...)
      return file[m](file, ...)
    end
  end
  function store.set_if(_, guard, expected, key, value)
    local ok, current = file:set_if(guard, expected, key, value)
    if ok and after then
      after(key)
    end
    return ok, current
  end
  return store
end

-- The session's options: the turns, the exec backend lingering ms in dir,
-- the journal store, a scratch tmpdir; asked(what) is told of each call
-- before its answer ("root 2": the root model's second turn; "llm q2").
function R.options(turns, store, dir, ms, tmpdir, asked)
  local sandbox = D.sandbox(dir, ms, { tmpdir = tmpdir })
  return {
    context = "the same context",
    query = "join the answers",
    step_timeout_ms = 30000,
    root_llm = function(messages)
      local turn = 1
      for _, m in ipairs(messages) do
        turn = turn + (m.role == "assistant" and 1 or 0)
      end
      asked("root " .. turn)
      return turns[turn]
    end,
    llm_query = function(p)
      asked("llm " .. p)
      return "sub:" .. p
    end,
    sandbox = sandbox,
    journal = store,
  }
end

return R
