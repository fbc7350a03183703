-- rlm.view: the HTML page of a trajectory log. The page is rendered in Lua,
-- so most of it is pinned on the string; a headless Chromium then runs the
-- page's script on a real session's log and the DOM it leaves is checked.
local H = require("helpers")
local count = H.count
local log = require("rlm.log")
local view = require("rlm.view")
local cjson = require("cjson").new()

local ARTIFACTS = "spec/artifacts"

local function jsonl(events)
  local out = {}
  for i, ev in ipairs(events) do
    out[i] = cjson.encode(ev)
  end
  return table.concat(out, "\n") .. "\n"
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local HOSTILE_SCRIPT = [[</script><script>document.title="pwned"</script>]]
local HOSTILE_IMG = [[<img src=x onerror="document.body.setAttribute('data-pwned', '1')">]]

-- A two-level run as the session writes it: the child session's events
-- come while the parent's block runs, before the parent's sub_query.
local NESTED = {
  { type = "session_start", depth = 0, query = "the question", t_ms = 0, cost_usd = 0 },
  { type = "step_start", depth = 0, step = 1, t_ms = 1 },
  { type = "root_response", depth = 0, step = 1, response = "parent response", latency_ms = 10,
    usage = { input_tokens = 100, output_tokens = 10 }, cost_usd = 0.1 },
  { type = "session_start", depth = 1, query = "child question", t_ms = 12 },
  { type = "step_start", depth = 1, step = 1, t_ms = 13 },
  { type = "exec_result", depth = 1, step = 1, block = 1, code = "child_code()", stdout = "child out" },
  { type = "final", depth = 1, step = 1, answer = "child answer", kind = "value" },
  { type = "run_end", depth = 1, ok = true, answer = "child answer", iterations = 1, sub_calls = 0, t_ms = 20 },
  { type = "sub_query", depth = 0, step = 1, index = 1, prompt = "child question", response = "child answer",
    recursive = true, latency_ms = 9 },
  { type = "sub_query", depth = 0, step = 1, index = 2, prompt = "p2", error = "refused", batch_index = 1,
    batch_size = 2, latency_ms = 3 },
  { type = "exec_result", depth = 0, step = 1, block = 1, code = "parent_code()", stdout = "parent out" },
  { type = "step_start", depth = 0, step = 2, t_ms = 30 },
  { type = "exec_result", depth = 0, step = 2, block = 1, code = "FINAL(1)", stdout = "" },
  { type = "final", depth = 0, step = 2, answer = "parent answer", kind = "value" },
  { type = "from_the_future", depth = 0, step = 2, note = "<b>kept as text</b>" },
  { type = "run_end", depth = 0, ok = true, answer = "parent answer", iterations = 2, sub_calls = 2,
    tokens = { input = 150, output = 25, total = 175 }, t_ms = 1500, cost_usd = 0.125 },
}

describe("rlm.view.html", function()
  it("shows steps, blocks, sub-calls and the answer", function()
    local page = view.html(jsonl(NESTED))
    assert.matches("^<!DOCTYPE html>", page)
    assert.are.equal(3, count(page, '<details class="step"'))
    assert.are.equal(2, count(page, '<details class="sub"'))
    assert.matches('<pre class="answer">parent answer</pre>', page, 1, true)
    assert.matches('<pre class="code">parent_code()</pre>', page, 1, true)
    assert.matches('<pre class="error">refused</pre>', page, 1, true)
    assert.matches("batch 1/2", page, 1, true)
    assert.matches('<pre class="text">the question</pre>', page, 1, true)
  end)

  it("folds the sandbox_ready event into one closed line, its fields inside", function()
    local events = { NESTED[1], NESTED[2],
      { type = "sandbox_ready", depth = 0, start = "warm", backend = "bubblewrap", mode = "bubblewrap",
        detail = "<i>x</i>", not_promised = {} } }
    for i = 3, #NESTED do
      events[#events + 1] = NESTED[i]
    end
    local page = view.html(jsonl(events))
    local at = page:find('<details class="event" data-type="sandbox_ready"><summary>sandbox ready '
      .. '<span class="muted">bubblewrap · warm</span></summary><dl class="fields">', 1, true)
    assert.is_truthy(at, page)
    assert.is_nil(page:find('<details class="event" data-type="sandbox_ready" open', 1, true))
    assert.is_nil(page:find('<div class="event" data-type="sandbox_ready"', 1, true))
    -- its fields, escaped, inside the fold; an unknown event stays open
    assert.matches("<dt>detail</dt><dd><pre class=\"field\">&lt;i&gt;x&lt;/i&gt;</pre></dd>", page:sub(at), 1, true)
    assert.matches('<div class="event" data-type="from_the_future"><h4>', page, 1, true)
  end)

  it("puts a child run inside the parent's block that started it, before its sub-call", function()
    local page = view.html(jsonl(NESTED))
    local step1 = page:find('<details class="step" data-step="1" data-depth="0"', 1, true)
    local child = page:find('<section class="run child" data-depth="1">', 1, true)
    local child_step = page:find('<details class="step" data-step="1" data-depth="1"', 1, true)
    local sub = page:find("child question</pre><h4>Response</h4>", 1, true)
    local parent_out = page:find("parent out", 1, true)
    local step2 = page:find('<details class="step" data-step="2" data-depth="0"', 1, true)
    assert.truthy(step1 and child and child_step and sub and parent_out and step2)
    assert.is_true(step1 < child and child < child_step and child_step < sub and sub < parent_out
      and parent_out < step2)
  end)

  it("keeps the nested sessions of a batch apart, though their events interleave", function()
    local path = os.tmpname()
    local on_event, writer = assert(log.jsonl(path, { mode = "truncate" }))
    local result = assert(H.run({
      max_depth = 2,
      on_event = on_event,
      root_llm = function(messages)
        local q = messages[2].content:match("^Question: (%a+)")
        if not q then
          return H.fence("FINAL(' '.join(rlm_query_batched(['alpha', 'beta'])))")
        elseif #messages == 2 then
          -- alpha's first step outlasts beta's, so their events interleave
          local secs = q == "alpha" and 0.8 or 0.05
          return H.fence(("import time\ntime.sleep(%g)\nprint('first step of ' + context)"):format(secs))
        end
        return H.fence("FINAL(context + '-done')")
      end,
    }))
    writer:close()
    assert.are.equal("alpha-done beta-done", result.answer)
    local f = assert(io.open(path, "rb"))
    local text = f:read("*a")
    f:close()
    os.remove(path)
    -- Both children ran their first step before either ran its second.
    local a2 = text:find('"step":2[^\n]*"session":"1.1"') or text:find('"session":"1.1"[^\n]*"step":2')
    local b1 = text:find('"first step of beta')
    assert.truthy(a2 and b1 and b1 < a2, "the children's events did not interleave")

    local page = view.html(text)
    assert.are.equal(2, count(page, '<section class="run child" data-depth="1">'))
    local first = page:find('<section class="run child"', 1, true)
    local second = page:find('<section class="run child"', first + 1, true)
    local one, two = page:sub(first, second - 1), page:sub(second)
    assert.are.equal(2, count(one, '<details class="step" data-step="'))
    assert.matches("first step of alpha", one, 1, true)
    assert.matches("alpha-done", one, 1, true)
    assert.is_nil(one:find("beta", 1, true))
    assert.matches("first step of beta", two, 1, true)
    assert.matches("beta-done", two, 1, true)
  end)

  it("sums steps, sub-calls, tokens, cost and wall time at the top", function()
    local page = view.html(jsonl(NESTED))
    assert.matches('id="total-runs">1<', page, 1, true)
    assert.matches('id="total-steps">3 (1 in child runs)<', page, 1, true)
    assert.matches('id="total-sub-calls">2<', page, 1, true)
    assert.matches('id="total-tokens">175 (150 in, 25 out)<', page, 1, true)
    assert.matches('id="total-cost">$0.1250<', page, 1, true)
    assert.matches('id="total-wall">1.50 s<', page, 1, true)
  end)

  -- rlm.log leaves cost_usd out of a line when cost_usd() raises, as the
  -- model client's does for a model without a price; the lines before the
  -- first reply have $0.
  it("says the cost is unknown when a reply's tokens have no price", function()
    local events = {
      { type = "session_start", depth = 0, query = "q", t_ms = 0, cost_usd = 0 },
      { type = "step_start", depth = 0, step = 1, t_ms = 1, cost_usd = 0 },
      { type = "root_response", depth = 0, step = 1, response = "r", latency_ms = 10,
        usage = { input_tokens = 100, output_tokens = 10 } },
      { type = "exec_result", depth = 0, step = 1, block = 1, code = "FINAL(1)", stdout = "" },
      { type = "run_end", depth = 0, ok = true, answer = "1", iterations = 1, sub_calls = 0, t_ms = 20 },
    }
    local page = view.html(jsonl(events))
    assert.matches('id="total-cost">unknown<', page, 1, true)
    assert.matches("110 tok (100 in, 10 out) · cost unknown", page, 1, true)
    assert.is_nil(page:find("$0.0000", 1, true))
    -- priced: the rise in cost_usd
    events[3].cost_usd, events[4].cost_usd, events[5].cost_usd = 0.0042, 0.0042, 0.0042
    page = view.html(jsonl(events))
    assert.matches('id="total-cost">$0.0042<', page, 1, true)
  end)

  it("shows each block's code once, highlighted, and the response's prose around it", function()
    local code = "import re\n# find it\nhits = [l for l in context.split('\\n') if re.search(r'\\d+', l)]\n"
      .. "print(len(hits), 3.5)"
    local prose_code = "x = llm_query(\"sum up\")\nFINAL(x)"
    local page = view.html(jsonl({
      { type = "session_start", depth = 0, query = "q", t_ms = 0 },
      { type = "step_start", depth = 0, step = 1, t_ms = 1 },
      { type = "root_response", depth = 0, step = 1, response = "Let me look.\n```repl\n" .. code .. "\n```\nThen:\n"
        .. "1. sum up\n   ```python\n   " .. prose_code:gsub("\n", "\n   ") .. "\n   ```\n"
        .. "```repl\nnot_run()\n```" },
      { type = "exec_result", depth = 0, step = 1, block = 1, code = code, stdout = "2 3.5" },
      { type = "exec_result", depth = 0, step = 1, block = 2, code = prose_code, stdout = "" },
    }))
    -- the response keeps its prose; the fences that ran name their block
    assert.matches("Let me look.\n[code of block 1: below]\nThen:\n1. sum up\n   [code of block 2: below]\n"
      .. "```repl\nnot_run()\n```", page, 1, true)
    assert.are.equal(1, count(page, "hits = [l"))
    assert.are.equal(1, count(page, "sum up&quot;"))
    -- Python, highlighted
    assert.matches('<span class="k">import</span>', page, 1, true)
    assert.matches('<span class="c"># find it</span>', page, 1, true)
    assert.matches('<span class="b">context</span>', page, 1, true)
    assert.matches('<span class="s">r&#39;\\d+&#39;</span>', page, 1, true)
    assert.matches('<span class="n">3.5</span>', page, 1, true)
    assert.matches('<span class="b">llm_query</span>(<span class="s">&quot;sum up&quot;</span>)', page, 1, true)
  end)

  it("shows a streamed root call's time to first token, not its pieces", function()
    local page = view.html(jsonl({
      { type = "session_start", depth = 0, query = "q", t_ms = 0 },
      { type = "step_start", depth = 0, step = 1, t_ms = 100 },
      { type = "root_delta", depth = 0, step = 1, text = "PIECE-ONE", t_ms = 450 },
      { type = "root_delta", depth = 0, step = 1, text = "PIECE-TWO", t_ms = 900 },
      { type = "root_response", depth = 0, step = 1, response = "the whole reply", latency_ms = 1000, t_ms = 1101 },
      { type = "run_end", depth = 0, ok = true, answer = "a", iterations = 1, sub_calls = 0, t_ms = 1200 },
    }))
    assert.matches("first token 349 ms", page, 1, true) -- 450 - (1101 - 1000)
    assert.matches('<pre class="text">the whole reply</pre>', page, 1, true)
    assert.is_nil(page:find("PIECE", 1, true))
  end)

  it("shows a compaction in its step, and a cached sub-call apart from the paid ones", function()
    local page = view.html(jsonl({
      { type = "session_start", depth = 0, query = "q", t_ms = 0 },
      { type = "step_start", depth = 0, step = 14, t_ms = 100 },
      { type = "compaction", depth = 0, step = 14, index = 1, turns = 10, first_turn = 1, last_turn = 10,
        kept_turns = 3, bytes_before = 48213, bytes_after = 9412, tokens_before = 12054, tokens_after = 2353,
        at_tokens = 12000, summary = "digest", summary_error = "root_llm raised: down", latency_ms = 4 },
      { type = "root_response", depth = 0, step = 14, response = "next", latency_ms = 10 },
      { type = "sub_query", depth = 0, step = 14, index = 1, prompt = "p", response = "a", latency_ms = 800 },
      { type = "sub_query", depth = 0, step = 14, cache_hit = 1, cached = true, prompt = "p", response = "a",
        latency_ms = 0 },
      { type = "exec_result", depth = 0, step = 14, block = 1, code = "x = 1", stdout = "" },
      { type = "run_end", depth = 0, ok = true, answer = "a", iterations = 14, sub_calls = 1, cache_hits = 1,
        compactions = 1, t_ms = 1200 },
    }))
    assert.matches("<h4>Compaction 1</h4>", page, 1, true)
    assert.matches("turns 1 to 10 replaced by a digest · 48,213 → 9,412 bytes · 12,054 tokens measured, over "
      .. "12,000 · last 3 turns kept whole", page, 1, true)
    assert.matches('<pre class="error">root_llm raised: down</pre>', page, 1, true)
    assert.matches('<span class="badge info">compacted</span>', page, 1, true)
    assert.matches('<span class="badge ok">cached · hit 1</span>', page, 1, true)
    assert.matches("1 sub-call · 1 cached", page, 1, true) -- the step
    assert.matches("1 sub-call · 1 cache hit · 1 compaction", page, 1, true) -- the run
    assert.matches('<dd id="total-sub-calls">1</dd>', page, 1, true)
    assert.matches('<dd id="total-cache-hits">1</dd>', page, 1, true)
    assert.matches('<dd id="total-compactions">1</dd>', page, 1, true)
    assert.is_nil(page:find('data-type="compaction"', 1, true)) -- not shown as an unknown event
  end)

  it("shows a real session's compactions and cache hits from its log", function()
    local f = assert(io.tmpfile())
    local on_event, writer = log.jsonl(f)
    local t = 0
    local result = assert(H.run({
      root_llm = function()
        t = t + 1
        if t <= 12 then
          return H.fence(("v%d = llm_query('same')\nprint('x' * 900)"):format(t))
        end
        return H.fence("FINAL(v1)")
      end,
      max_iterations = 20, sub_call_cache = true, compact = { at_tokens = 2000, keep_turns = 2 },
      on_event = on_event,
    }))
    f:seek("set")
    local page = view.html(f:read("*a"))
    writer:close()
    f:close()
    assert.equals("echo: same", result.answer)
    assert.is_true(result.compactions >= 1)
    assert.equals(11, result.cache_hits)
    assert.equals(result.compactions, count(page, "<h4>Compaction "))
    assert.matches('<dd id="total-cache-hits">11</dd>', page, 1, true)
    assert.matches('<dd id="total-sub-calls">1</dd>', page, 1, true)
  end)

  it("shows events of unknown types, as text", function()
    local page = view.html(jsonl(NESTED))
    assert.matches('data-type="from_the_future"', page, 1, true)
    assert.matches("&lt;b&gt;kept as text&lt;/b&gt;", page, 1, true)
  end)

  it("escapes hostile text everywhere, so that it stays text", function()
    local events = {}
    for _, ev in ipairs(NESTED) do
      local copy = {}
      for k, v in pairs(ev) do
        copy[k] = type(v) == "string" and k ~= "type" and (v .. HOSTILE_SCRIPT .. HOSTILE_IMG) or v
      end
      events[#events + 1] = copy
    end
    events[#events + 1] = { type = HOSTILE_SCRIPT, depth = 0, [HOSTILE_IMG] = HOSTILE_IMG }
    local page = view.html(jsonl(events))
    assert.are.equal(1, count(page, "<script"))
    assert.are.equal(0, count(page, "<img"))
    assert.are.equal(0, count(page, "onerror=\""))
    assert.is_true(count(page, "&lt;/script&gt;&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt;") > 10)
  end)

  -- Trojan Source: every bidirectional control, in every field and in an
  -- attribute (the event type), shown as a marked escape, never as itself.
  it("shows bidirectional controls as visible escapes, never as the controls", function()
    local raw = { "\216\156", "\226\128\142", "\226\128\143", "\226\128\170", "\226\128\171",
      "\226\128\172", "\226\128\173", "\226\128\174", "\226\129\166", "\226\129\167", "\226\129\168",
      "\226\129\169" }
    local shown = { "061c", "200e", "200f", "202a", "202b", "202c", "202d", "202e", "2066", "2067", "2068", "2069" }
    local all = "if is_admin:" .. table.concat(raw, "x") .. "end"
    local events = {}
    for _, ev in ipairs(NESTED) do
      local copy = {}
      for k, v in pairs(ev) do
        copy[k] = type(v) == "string" and k ~= "type" and (v .. all) or v
      end
      events[#events + 1] = copy
    end
    events[#events + 1] = { type = "odd" .. all, depth = 0, note = all }
    local page = view.html(jsonl(events))
    for i, c in ipairs(raw) do
      assert.is_nil(page:find(c, 1, true), shown[i] .. " reached the page")
      assert.is_true(count(page, '<span class="ctl" title="a bidirectional control">\\u' .. shown[i] .. "</span>") > 10,
        shown[i])
    end
    assert.is_truthy(page:find('data-type="oddif is_admin:\\u061cx\\u200ex', 1, true))
  end)

  it("leaves other text alone (an em dash, accents, CJK)", function()
    local text = "caf\195\169 \226\128\148 \230\188\162\229\173\151 \226\128\168"
    local page = view.html(jsonl({ { type = "session_start", depth = 0, query = text, t_ms = 0 } }))
    assert.is_truthy(page:find(text, 1, true))
  end)

  it("keeps the page's own script and style to a per-page nonce", function()
    local page = view.html(jsonl(NESTED))
    local n = page:match("script%-src 'nonce%-(%w+)'")
    assert.truthy(n)
    assert.matches('<script nonce="' .. n .. '">', page, 1, true)
    assert.matches('<style nonce="' .. n .. '">', page, 1, true)
  end)

  it("skips malformed lines, counts them, and never fails", function()
    -- one malformed line each
    local bad = {
      "not json",
      "[1, 2, 3]",
      '{"type": 5}',
      '{"no": "type"}',
      '"just a string"',
      '{"type": "step_start", "step": ',
      ("["):rep(5000) .. ("]"):rep(5000),
      "\255\254{}",
    }
    local text = table.concat(bad, "\n") .. "\n\n   \n" .. jsonl(NESTED)
    local page = view.html(text)
    assert.matches('<p class="warn" id="malformed">' .. #bad .. " malformed lines skipped</p>", page, 1, true)
    assert.are.equal(3, count(page, '<details class="step"'))
  end)

  -- Lines that are JSON but hold the wrong things: rendered, not raised on.
  local odd = {
    { type = "step_start", step = "one", depth = -3 },
    { type = "step_start", step = 1, depth = 1e300 },
    { type = "exec_result", step = 1e308, code = { "a", "table" }, stdout = 42, error = false },
    { type = "sub_query", step = 1, usage = { input_tokens = "many" }, latency_ms = "slow", index = {} },
    { type = "run_end", ok = "yes", tokens = "lots", answer = { nested = true } },
    { type = "root_response", step = 2, response = ("x"):rep(300000), usage = { input_tokens = 1e20 } },
    { type = "final" },
    { type = "run_end", depth = 5 },
  }
  for i, ev in ipairs(odd) do
    it("renders an odd event without raising (" .. i .. ")", function()
      local page = view.html(jsonl({ { type = "session_start", depth = 0 }, { type = "step_start", step = 1 }, ev }))
      assert.matches("</html>\n$", page)
    end)
  end

  it("reads a log with a byte-order mark and CRLF line ends", function()
    local text = "\239\187\191" .. jsonl(NESTED):gsub("\n", "\r\n")
    local page = view.html(text)
    assert.is_nil(page:find('id="malformed"', 1, true))
    assert.are.equal(3, count(page, '<details class="step"'))
  end)

  it("renders an empty log", function()
    local page = view.html("")
    assert.matches('id="empty"', page, 1, true)
    assert.matches('id="total-steps">0<', page, 1, true)
  end)

  it("shows each run of a file appended to more than once", function()
    local one = {
      { type = "step_start", step = 1 },
      { type = "exec_result", step = 1, block = 1, code = "FINAL(1)", stdout = "" },
      { type = "final", step = 1, answer = "1", kind = "value" },
    }
    local page = view.html(jsonl(one) .. jsonl(one) .. jsonl({ { type = "session_start", depth = 0 } }) .. jsonl(one))
    assert.matches('id="total-runs">3<', page, 1, true)
    assert.are.equal(3, count(page, '<details class="step"'))
  end)

  it("raises when the log is not a string", function()
    local ok, err = pcall(view.html, {})
    assert.is_false(ok)
    assert.matches("the log must be a string, not table", err, 1, true)
  end)
end)

local shell_quote = require("rlm.base.util").shell_quote

-- Headless Chromium, when the machine has it (Debian: apt-get install
-- chromium), or the one RLM_CHROMIUM names.
local function find_chromium()
  local env = os.getenv("RLM_CHROMIUM")
  if env and env ~= "" then
    return H.sh("test -x " .. shell_quote(env) .. " && echo yes") == "yes" and env or nil
  end
  local found = H.sh("command -v chromium || command -v chromium-browser || command -v google-chrome || true")
  return found ~= "" and found or nil
end

describe("the page in headless Chromium", function()
  local chromium = find_chromium()
  local root = H.sh("pwd")
  local name = "view-" .. H.lua_name():gsub("[^%w.]", "")
  local page_path = root .. "/" .. ARTIFACTS .. "/" .. name .. ".html"
  local shot_path = root .. "/" .. ARTIFACTS .. "/" .. name .. ".png"
  local url = "file://" .. page_path
  local result, run_err

  local function browse(args)
    local profile = H.sh("mktemp -d /tmp/rlm-chromium.XXXXXX")
    local flags = {
      "--headless", "--disable-gpu", "--no-first-run", "--disable-extensions", "--disable-sync",
      "--disable-background-networking", "--disable-component-update", "--no-default-browser-check",
      "--user-data-dir=" .. shell_quote(profile),
    }
    if H.sh("id -u") == "0" then
      -- Chromium will not start its sandbox as root. These specs run as root
      -- only in a throwaway container, on a page they just made; never pass
      -- --no-sandbox to open pages you did not make.
      flags[#flags + 1] = "--no-sandbox"
    end
    -- Under make check the sanitizer runtime is preloaded into the spec's
    -- Lua; Chromium must not inherit it.
    local out = H.sh(("env -u LD_PRELOAD timeout 120 %s %s %s 2>/dev/null"):format(shell_quote(chromium), table.concat(flags, " "), args))
    os.execute("rm -rf " .. shell_quote(profile))
    return out
  end

  local function dom(fragment)
    return browse("--dump-dom " .. shell_quote(url .. (fragment or "")))
  end

  setup(function()
    os.execute("mkdir -p " .. ARTIFACTS)
    local log_path = root .. "/" .. ARTIFACTS .. "/" .. name .. ".jsonl"
    local spent = 0
    local on_event, writer = assert(log.jsonl(log_path, {
      mode = "truncate",
      cost_usd = function()
        return spent
      end,
    }))
    local script = H.script({
      "Look first.\n" .. H.fence(("print(%q)\nbad = %q\nprint(bad)\nr = llm_query('summarise: ' + context)\nprint(r)")
        :format(HOSTILE_SCRIPT, HOSTILE_IMG)),
      H.fence("raise ValueError('needle in the error')"),
      H.fence("FINAL('the answer is 42')"),
    })
    result, run_err = H.run({
      query = "What is the answer?",
      on_event = on_event,
      root_llm = function(messages)
        spent = spent + 0.01
        return script(messages), { input_tokens = 100, output_tokens = 20 }
      end,
      llm_query = function(p)
        spent = spent + 0.001
        return "echo: " .. p, { input_tokens = 7, output_tokens = 3 }
      end,
    })
    writer:close()
    local f = assert(io.open(log_path, "rb"))
    write(page_path, view.html(f:read("*a")))
    f:close()
  end)

  after_each(H.assert_clean)

  local function need_chromium()
    if not chromium then
      pending("no Chromium on this machine (apt-get install chromium, or set RLM_CHROMIUM)")
      return false
    end
    return true
  end

  it("comes from a real session", function()
    assert.is_nil(run_err, run_err and tostring(run_err))
    assert.are.equal("the answer is 42", result.answer)
  end)

  it("runs its script and shows every step and the answer", function()
    if not need_chromium() then
      return
    end
    local d = dom()
    assert.matches('data-ready="1"', d, 1, true)
    assert.are.equal(3, count(d, '<details class="step"'))
    assert.matches('<pre class="answer">the answer is 42</pre>', d, 1, true)
    assert.matches('<pre class="text">What is the answer?</pre>', d, 1, true)
    assert.matches('id="total-sub-calls">1<', d, 1, true)
    assert.matches('id="total-tokens">370 (307 in, 63 out)<', d, 1, true)
    assert.matches('id="total-cost">$0.0310<', d, 1, true)
    assert.matches('<span id="count">3 steps</span>', d, 1, true)
  end)

  it("keeps hostile code and output inert text", function()
    if not need_chromium() then
      return
    end
    local d = dom()
    assert.matches("<title>rlm trajectory</title>", d, 1, true)
    assert.is_nil(d:find("<body[^>]*data%-pwned"))
    assert.are.equal(0, count(d, "<img"))
    assert.are.equal(1, count(d, "<script"))
    -- as text: the DOM serialiser escapes <, > and & in text, not quotes
    assert.matches([[&lt;/script&gt;&lt;script&gt;document.title="pwned"&lt;/script&gt;]], d, 1, true)
    assert.matches([[&lt;img src=x onerror="document.body.setAttribute('data-pwned', '1')"&gt;]], d, 1, true)
  end)

  it("filters steps by the #q= search and marks the matches", function()
    if not need_chromium() then
      return
    end
    local d = dom("#q=Needle")
    assert.matches('data-shown="1"', d, 1, true)
    assert.are.equal(2, count(d, '<details class="step nomatch"'))
    assert.matches('<details class="step" data-step="2"', d, 1, true)
    assert.is_true(count(d, '<mark class="hit">needle</mark>') >= 2)
    assert.matches('<span id="count">1 of 3 steps match</span>', d, 1, true)
  end)

  it("takes a screenshot", function()
    if not need_chromium() then
      return
    end
    os.remove(shot_path)
    browse(("--hide-scrollbars --window-size=1200,1500 --screenshot=%s %s"):format(shell_quote(shot_path),
      shell_quote(url)))
    local f = assert(io.open(shot_path, "rb"), "no screenshot at " .. shot_path)
    local png = f:read("*a")
    f:close()
    assert.are.equal("\137PNG\r\n\26\n", png:sub(1, 8))
    assert.is_true(#png > 20000, #png)
  end)
end)

describe("rlm.tools.highlight.python", function()
  local highlight = require("rlm.tools.highlight")

  local function joined(code)
    local out = {}
    for i, piece in ipairs(highlight.python(code)) do
      out[i] = piece[2]
    end
    return table.concat(out)
  end

  it("cuts any text into pieces that join up to it, bytes that are not UTF-8 included", function()
    local alphabet = { "a", "_", "1", ".", "#", "'", '"', "'''", '"""', "\\", "\n", " ", "@", "r", "b", "f",
      "def", "\255", "\195\169", "\226\128\174", "(", "e", "-", "\t" }
    math.randomseed(31)
    for _ = 1, 500 do
      local parts = {}
      for i = 1, math.random(0, 60) do
        parts[i] = alphabet[math.random(#alphabet)]
      end
      local code = table.concat(parts)
      assert.are.equal(code, joined(code))
    end
  end)

  -- one row a case: code, the pieces with a class ({ class, text })
  local cases = {
    { "def f(): pass", { { "k", "def" }, { "k", "pass" } } },
    { "x = 'a # b' # c", { { "s", "'a # b'" }, { "c", "# c" } } },
    { "s = rb'\\'' + f\"{x}\"", { { "s", "rb'\\''" }, { "s", "f\"{x}\"" } } },
    { "t = '''a\nb''' + 1e-3", { { "s", "'''a\nb'''" }, { "n", "1e" }, { "n", "3" } } },
    { "@cache\ndef g(a @ b): return FINAL_VAR('x')",
      { { "d", "@cache" }, { "k", "def" }, { "k", "return" }, { "b", "FINAL_VAR" }, { "s", "'x'" } } },
    { "u = 'open\nv = 2", { { "s", "'open" }, { "n", "2" } } },
  }
  for _, case in ipairs(cases) do
    it(("classes %q"):format(case[1]), function()
      local got = {}
      for _, piece in ipairs(highlight.python(case[1])) do
        if piece[1] then
          got[#got + 1] = piece
        end
      end
      assert.are.same(case[2], got)
    end)
  end
end)
