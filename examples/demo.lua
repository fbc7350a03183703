-- make demo: an RLM session over 20 MB of synthetic service logs with three
-- facts hidden in them. By default the root model and the sub-model are
-- scripted stand-ins; the REPL, the sandbox and the sub-calls are real.
-- With RLM_MODEL set (and RLM_BASE_URL for an endpoint other than OpenAI's)
-- a real model does the same task through rlm.llm.openai:
--   RLM_BASE_URL   an OpenAI-compatible endpoint, up to /v1
--   RLM_MODEL      the root model; RLM_SUB_MODEL the sub-model (default: the same)
--   RLM_API_KEY_ENV  the variable that holds the key (default OPENAI_API_KEY)
--   RLM_DEMO_MAX_USD the spending cap where the models' prices are known (default 1)
--   RLM_DEMO_MB    the size of the logs (default 20)
--   RLM_DEMO_STYLE=prose  the scripted root model writes the paper's format
--                  instead: blocks indented in a numbered list, ```python
--                  fences, and the answer as a FINAL(...) line of prose
-- `lua5.4 examples/demo.lua --write FILE` writes the logs alone (make big.log).
local rlm = require("rlm")

local MB = tonumber(os.getenv("RLM_DEMO_MB") or "20")
local function env(name)
  local v = os.getenv(name)
  return v ~= "" and v or nil
end

-- The haystack ---------------------------------------------------------------

local services = { "checkout-api", "cart-svc", "search", "auth", "inventory",
  "payments-gateway", "email-worker", "recommender", "cdn-edge", "billing" }
local paths = { "/cart/items", "/login", "/search?q=boots", "/checkout", "/pay",
  "/profile", "/orders/recent", "/health" }
local noise_errors = { "upstream timeout code=UPS-504", "cache miss storm code=CCH-201",
  "slow query code=DB-LAT", "token expired code=AUTH-401", "retry budget exhausted code=RTY-429" }

local facts = {
  service = "payments-gateway",
  code = "PGW-503-POOL",
  approver = "m.okafor",
}

local function timestamp(i, n)
  local seconds = math.floor(i / n * 86400)
  return ("2026-03-14T%02d:%02d:%02d.%03dZ"):format(math.floor(seconds / 3600),
    math.floor(seconds / 60) % 60, seconds % 60, i % 1000)
end

local function generate(bytes)
  math.randomseed(20260314)
  local n = math.floor(bytes / 110)
  local needles = {
    [math.floor(n * 0.41)] = "incident-bot WARN INCIDENT INC-4471 opened: elevated 5xx rate on checkout",
    [math.floor(n * 0.43)] = ("%s ERROR root cause identified: connection pool exhausted code=%s")
      :format(facts.service, facts.code),
    [math.floor(n * 0.47)] = ("deploy-controller INFO rollback of %s to v2.14.3 approved by %s")
      :format(facts.service, facts.approver),
  }
  local out = {}
  for i = 1, n do
    local body = needles[i]
    if not body then
      local svc = services[math.random(#services)]
      if math.random() < 0.01 then
        body = ("%s ERROR %s"):format(svc, noise_errors[math.random(#noise_errors)])
      else
        body = ("%s INFO request completed path=%s status=200 latency_ms=%d"):format(
          svc, paths[math.random(#paths)], math.random(2, 900))
      end
    end
    out[i] = ("%s host-%02d %s trace=%08x"):format(timestamp(i, n), math.random(1, 48), body,
      math.random(0, 0x7fffffff))
  end
  return table.concat(out, "\n")
end

-- `lua5.4 examples/demo.lua --write FILE` (make big.log): the logs alone,
-- for the examples of README.md and docs/cli.md to ask about.
if arg and arg[1] == "--write" then
  local path = arg[2] or "big.log"
  local f = assert(io.open(path, "wb"))
  local logs = generate(MB * 2 ^ 20)
  assert(f:write(logs, "\n"))
  assert(f:close())
  print(("%s: %.1f MB of synthetic service logs; during incident INC-4471 a service failed: ask which, and why")
    :format(path, #logs / 2 ^ 20))
  os.exit(0)
end

-- The stand-in models --------------------------------------------------------

local function fence(code)
  return "```repl\n" .. code .. "\n```"
end

-- What a capable root model writes, turn by turn: look, search, read the
-- candidates with sub-calls, assemble, answer.
local root_turns = {
  "Let me look at the data first.\n" .. fence([[
print(type(context).__name__, len(context))
lines = context.split('\n')
print(len(lines), 'lines; first two:')
print('\n'.join(lines[:2]))]]),
  "Log lines. First, when did the incident start?\n" .. fence([[
import re
hits = [l for l in lines if 'INC-4471' in l]
print(len(hits), 'lines mention INC-4471')
for l in hits[:5]:
    print(l[:160])]]),
  "Only the opening line names it. The cause and the fix must be in the errors and deploy actions; "
    .. "I will have a sub-model read those in chunks.\n" .. fence([[
candidates = [l for l in lines if ' ERROR ' in l or 'rollback' in l]
print(len(candidates), 'candidate lines')
chunks = ['\n'.join(candidates[i:i + 400]) for i in range(0, len(candidates), 400)]
question = ('These are log lines from a day with incident INC-4471. Report the failing '
            'service, the root-cause error code and who approved the rollback, as '
            'service=...; code=...; approver=... with NONE for what is not in these lines.\n\n')
answers = llm_query_batched([question + c for c in chunks])
print(len(chunks), 'chunks read')
for a in answers:
    if 'NONE; code=NONE; approver=NONE' not in a:
        print(a)]]),
  "Assemble the findings.\n" .. fence([[
found = {}
for a in answers:
    for part in a.split(';'):
        key, _, value = part.strip().partition('=')
        if value and value != 'NONE':
            found[key] = value
print(found)]]),
  "All three facts are found.\n" .. fence("FINAL_VAR('found')"),
}

-- The same work written the way the paper's trajectories (and many chat
-- models) write it: a plan as a numbered list with the code indented in
-- it, ```python fences, and the answer as a FINAL(...) line of prose,
-- several lines long, taken from what the REPL printed.
local prose_turns = {
  "I'll start by examining the context to understand its structure.\n\n```python\n"
    .. "print(type(context).__name__, len(context))\nlines = context.split('\\n')\n"
    .. "print(len(lines), 'lines')\nprint(lines[0])\n```",
  "These are service logs. My plan:\n\n"
    .. "1. Find where the incident is mentioned:\n"
    .. "   ```python\n   hits = [l for l in lines if 'INC-4471' in l]\n   for l in hits[:5]:\n"
    .. "       print(l[:160])\n   ```\n"
    .. "2. Then have a sub-model read the errors and deploy actions in chunks.",
  "Only the opening line names the incident. Next, the candidates:\n\n```python\n"
    .. "candidates = [l for l in lines if ' ERROR ' in l or 'rollback' in l]\n"
    .. "chunks = ['\\n'.join(candidates[i:i + 400]) for i in range(0, len(candidates), 400)]\n"
    .. "question = ('These are log lines from a day with incident INC-4471. Report the failing '\n"
    .. "            'service, the root-cause error code and who approved the rollback, as '\n"
    .. "            'service=...; code=...; approver=... with NONE for what is not in these lines.\\n\\n')\n"
    .. "answers = llm_query_batched([question + c for c in chunks])\n"
    .. "for a in answers:\n    if 'NONE; code=NONE; approver=NONE' not in a:\n        print(a)\n```",
  function(messages)
    -- Reads the facts in the last REPL output, as a model would.
    local out = messages[#messages].content
    local service = out:match("service=([%w%-%.]+)")
    local code = out:match("code=([%w%-%.]+)")
    local approver = out:match("approver=([%w%-%.]+)")
    return "The sub-model found all three facts in the chunks it read.\n\n"
      .. ("FINAL(During incident INC-4471:\n- service: %s\n- code: %s\n- approver: %s)"):format(
        tostring(service), tostring(code), tostring(approver))
  end,
}

local style = os.getenv("RLM_DEMO_STYLE") or "code"
local turns = style == "prose" and prose_turns or root_turns

local function root_llm(messages)
  local turn = math.floor((#messages - 1) / 2) + 1
  local item = turns[math.min(turn, #turns)]
  return type(item) == "function" and item(messages) or item
end

-- A sub-model that reads its prompt the way a careful one would: it reports
-- only what the lines in front of it say.
local function llm_query(prompt)
  local service, code = prompt:match("%S+ host%-%d+ (%S+) ERROR root cause identified[^\n]*code=(%S+)")
  local approver = prompt:match("rollback of %S+ to %S+ approved by (%S+)")
  return ("service=%s; code=%s; approver=%s"):format(service or "NONE", code or "NONE",
    approver or "NONE")
end

-- A real model ----------------------------------------------------------------

-- The callbacks and budget options of rlm.llm.openai for RLM_MODEL, or nil.
local function real_model()
  local model = env("RLM_MODEL")
  if not model then
    if env("RLM_BASE_URL") then
      io.stderr:write("make demo: RLM_BASE_URL is set but RLM_MODEL is not: set both for a real model\n")
      os.exit(2)
    end
    return nil
  end
  local client = require("rlm.llm.openai").new({
    base_url = env("RLM_BASE_URL") or "https://api.openai.com/v1",
    model = model,
    sub_model = env("RLM_SUB_MODEL"),
    api_key_env = env("RLM_API_KEY_ENV") or "OPENAI_API_KEY",
  })
  local o = { root_llm = client.root_llm, llm_query = client.llm_query, client = client }
  local sub = env("RLM_SUB_MODEL") or model
  if client.has_price(model) and client.has_price(sub) then
    o.cost = { usd = client.cost_usd, max_usd = tonumber(env("RLM_DEMO_MAX_USD") or "1") }
  else
    o.max_total_tokens = 2000000 -- no prices for these models: cap the tokens instead
  end
  return o
end

-- The run ---------------------------------------------------------------------

local function clock()
  return require("rlm.core").now_ms()
end

local real = real_model()
if real then
  print(("rlm demo with a real model: %s at %s (sub-model %s)."):format(env("RLM_MODEL"),
    env("RLM_BASE_URL") or "https://api.openai.com/v1", env("RLM_SUB_MODEL") or env("RLM_MODEL")))
  print(real.cost and ("Spending stops at %.2f USD (RLM_DEMO_MAX_USD).\n"):format(real.cost.max_usd)
    or "No prices known for these models: the run stops at 2,000,000 tokens.\n")
else
  print("rlm demo: both the root model and the sub-model are SCRIPTED STAND-INS, not LLMs.")
  if style == "prose" then
    print("This root model writes the paper's format: a numbered plan, ```python fences, a prose FINAL(...).")
  end
  print("The REPL, the sandbox, the sub-calls and the data are real.")
  print("Set RLM_MODEL (and RLM_BASE_URL) to run the same task with a real model.\n")
end
local t0 = clock()
local logs = generate(MB * 2 ^ 20)
print(("Generated %.1f MB of service logs (%.0f ms). Three facts are hidden in them.")
  :format(#logs / 2 ^ 20, clock() - t0))

local question = "During incident INC-4471, which service failed, what was the root-cause " ..
  "error code, and who approved the rollback?"
print("Question: " .. question .. "\n")

local opts = {
  context = logs,
  query = question,
  root_llm = real and real.root_llm or root_llm,
  llm_query = real and real.llm_query or llm_query,
  cost = real and real.cost,
  max_total_tokens = real and real.max_total_tokens,
  max_iterations = real and 20 or 8,
  step_timeout_ms = real and 300000 or 60000,
  on_event = function(ev)
    if ev.type == "step_start" then
      io.write(("--- step %d ---\n"):format(ev.step))
    elseif ev.type == "root_response" and (real or style == "prose") then
      local prose = ev.response:gsub("```.*", ""):gsub("%s+$", "")
      if prose ~= "" then
        io.write("model: ", (prose:gsub("\n", "\n       ")), "\n")
      end
    elseif ev.type == "exec_result" then
      io.write("code:\n", (ev.code:gsub("[^\n]+", "  | %0")), "\n")
      io.write("output:\n", ev.stdout == "" and "  (nothing printed)\n" or (ev.stdout:gsub("[^\n]+", "  > %0")))
      if ev.error then
        io.write("error:\n", ev.error, "\n")
      end
    end
  end,
}
local session = rlm.Session.new(opts)
logs, opts.context = nil, nil -- luacheck: ignore (the session holds it until the sandbox has it)

t0 = clock()
local result, err = session:run()
session:close()
if not result then
  print("\nThe run failed: " .. tostring(err))
  os.exit(1)
end
print(("\nAnswer after %d steps and %d sub-calls, in %.1f s (from %s):"):format(result.iterations,
  result.sub_calls, (clock() - t0) / 1000, result.answer_source == "prose" and "a FINAL line of prose"
    or result.answer_source == "text" and "the last reply's plain text" or "the code"))
local right
if type(result.value) == "table" and not real then
  for _, k in ipairs({ "service", "code", "approver" }) do
    print(("  %-9s %s"):format(k, tostring(result.value[k])))
  end
  right = result.value.service == facts.service and result.value.code == facts.code
    and result.value.approver == facts.approver
else
  -- A real model answers in its own words: look for the three facts in them.
  print("  " .. result.answer:gsub("\n", "\n  "))
  right = true
  for _, fact in pairs(facts) do
    right = right and result.answer:lower():find(fact:lower(), 1, true) ~= nil
  end
end
if real then
  local u = real.client.usage()
  print(("Tokens: %d in, %d out over %d calls%s."):format(u.input_tokens, u.output_tokens, u.calls,
    real.cost and (", %.4f USD"):format(real.cost.usd()) or ""))
end
print(right and "\nThat is the right answer." or "\nThat is NOT the right answer.")
os.exit(right and 0 or 1)
