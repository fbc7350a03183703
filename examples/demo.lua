-- make demo: an RLM session over 20 MB of synthetic service logs with three
-- facts hidden in them. The root model and the sub-model are scripted
-- stand-ins (no LLM is reachable here); the REPL, the sandbox and the
-- sub-calls are real. Plug in a real model by replacing the two callbacks
-- (see README.md).
local rlm = require("rlm")

local MB = tonumber(os.getenv("RLM_DEMO_MB") or "20")

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

local function root_llm(messages)
  local turn = math.floor((#messages - 1) / 2) + 1
  return root_turns[math.min(turn, #root_turns)]
end

-- A sub-model that reads its prompt the way a careful one would: it reports
-- only what the lines in front of it say.
local function llm_query(prompt)
  local service, code = prompt:match("%S+ host%-%d+ (%S+) ERROR root cause identified[^\n]*code=(%S+)")
  local approver = prompt:match("rollback of %S+ to %S+ approved by (%S+)")
  return ("service=%s; code=%s; approver=%s"):format(service or "NONE", code or "NONE",
    approver or "NONE")
end

-- The run ---------------------------------------------------------------------

local function clock()
  return require("rlm.core").now_ms()
end

print("rlm demo: both the root model and the sub-model are SCRIPTED STAND-INS, not LLMs.")
print("The REPL, the sandbox, the sub-calls and the data are real.\n")
local t0 = clock()
local logs = generate(MB * 2 ^ 20)
print(("Generated %.1f MB of service logs (%.0f ms). Three facts are hidden in them.")
  :format(#logs / 2 ^ 20, clock() - t0))

local question = "During incident INC-4471, which service failed, what was the root-cause " ..
  "error code, and who approved the rollback?"
print("Question: " .. question .. "\n")

local sub_calls = 0
local session = rlm.Session.new({
  context = logs,
  query = question,
  root_llm = root_llm,
  llm_query = function(p)
    sub_calls = sub_calls + 1
    return llm_query(p)
  end,
  max_iterations = 8,
  on_event = function(ev)
    if ev.type == "step_start" then
      io.write(("--- step %d ---\n"):format(ev.step))
    elseif ev.type == "exec_result" then
      io.write("code:\n", (ev.code:gsub("[^\n]+", "  | %0")), "\n")
      io.write("output:\n", ev.stdout == "" and "  (nothing printed)\n" or (ev.stdout:gsub("[^\n]+", "  > %0")))
      if ev.error then
        io.write("error:\n", ev.error, "\n")
      end
    end
  end,
})
logs = nil -- luacheck: ignore (the session holds it until the sandbox has it)

t0 = clock()
local result, err = session:run()
session:close()
if not result then
  print("\nThe run failed: " .. tostring(err))
  os.exit(1)
end
print(("\nAnswer after %d steps and %d sub-calls, in %.1f s:"):format(result.iterations,
  result.sub_calls, (clock() - t0) / 1000))
for _, k in ipairs({ "service", "code", "approver" }) do
  print(("  %-9s %s"):format(k, tostring(result.value[k])))
end
local right = result.value.service == facts.service and result.value.code == facts.code
  and result.value.approver == facts.approver
print(right and "\nThat is the right answer." or "\nThat is NOT the right answer.")
os.exit(right and 0 or 1)
