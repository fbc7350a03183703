-- rlm.view: one self-contained HTML page from a trajectory log (the JSON
-- lines rlm.log writes); see docs/log.md.
--
-- The page is rendered here, in Lua, not by script in the browser: every
-- piece of logged text passes through one escape function into element
-- content or a quoted attribute, and none of it ever sits in a script
-- context, so hostile text in a log (code, output, prompts) stays text. The
-- page reads without JavaScript (steps are <details>); the small script only
-- searches, and it reads the DOM's text, never markup. A Content-Security-
-- Policy with a per-page nonce also keeps any script or handler but ours from
-- running, as a second wall.
local cjson = require("cjson").new()
local log = require("rlm.log")
local highlight = require("rlm.tools.highlight")

cjson.decode_max_depth(64)
cjson.encode_invalid_numbers(true) -- a log may hold NaN; showing it is fine

local M = {}

-- More than this of one field is cut in the page (the writer cuts at 20000
-- by default; this bounds a log that was not written by it).
local MAX_FIELD_CHARS = 100000
-- Fields shown of an event of an unknown type.
local MAX_EVENT_FIELDS = 100
local MAX_TOOL_CALLS_SHOWN = 50 -- per block: a loop of 1,000 calls shows the first ones and a count
-- Deeper child runs are shown at this depth.
local MAX_DEPTH = 32
-- With more step elements than this, steps start collapsed.
local OPEN_STEPS_UP_TO = 12

local ESCAPES = { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["'"] = "&#39;" }

-- Any value as HTML text: valid UTF-8, bounded, every markup character
-- escaped. Fit for element content and quoted attribute values.
local function as_text(v)
  if type(v) == "number" and v % 1 == 0 and math.abs(v) < 2 ^ 53 then
    return ("%.0f"):format(v) -- 3, not the 3.0 of a float from JSON on Lua 5.3+
  end
  return tostring(v)
end

-- The bidirectional controls (U+202A-U+202E, U+2066-U+2069, U+200E,
-- U+200F, U+061C), as UTF-8: text that holds them reads in another order
-- than it runs (Trojan Source: code that shows one thing and does another).
-- On the page each is a visible escape, \u202e, never the control itself;
-- in element content it is marked as well.
local BIDI = { "\226\128[\142\143\170-\174]", "\226\129[\166-\169]", "\216\156" }

local function code_point(c)
  local b1, b2, b3 = c:byte(1, 3)
  if b3 then
    return (b1 - 0xE0) * 4096 + (b2 - 0x80) * 64 + (b3 - 0x80)
  end
  return (b1 - 0xC0) * 64 + (b2 - 0x80)
end

local function bidi_text(c)
  return ("\\u%04x"):format(code_point(c))
end

local function bidi_marked(c)
  return '<span class="ctl" title="a bidirectional control">' .. bidi_text(c) .. "</span>"
end

local function escaped(v, bidi)
  local s = log.truncate(as_text(v), MAX_FIELD_CHARS):gsub("[&<>\"']", ESCAPES)
  for _, pattern in ipairs(BIDI) do
    s = s:gsub(pattern, bidi)
  end
  return s
end

-- For element content.
local function esc(v)
  return escaped(v, bidi_marked)
end

-- For a quoted attribute's value.
local function attr(v)
  return escaped(v, bidi_text)
end

local function num(v)
  return type(v) == "number" and v == v and v > -math.huge and v < math.huge and v or nil
end

local function fmt_int(n)
  local s = ("%.0f"):format(n)
  local sign, digits = s:match("^(-?)(%d+)$")
  digits = digits:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^,", "")
  return sign .. digits
end

local function fmt_ms(ms)
  ms = num(ms)
  if not ms then
    return nil
  end
  if ms < 1000 then
    return ("%.0f ms"):format(ms)
  elseif ms < 60000 then
    return ("%.2f s"):format(ms / 1000)
  end
  return ("%.0f min %.0f s"):format(math.floor(ms / 60000), (ms % 60000) / 1000)
end

local function fmt_usd(v)
  v = num(v)
  return v and ("$%.4f"):format(v) or nil
end

-- usage = { input_tokens =, output_tokens = } (events) or
-- { input =, output =, total = } (run_end)
local function usage_of(u)
  if type(u) ~= "table" then
    return nil
  end
  local input = num(u.input_tokens) or num(u.input)
  local output = num(u.output_tokens) or num(u.output)
  if not input and not output then
    return nil
  end
  input, output = input or 0, output or 0
  return { input = input, output = output, total = num(u.total) or (input + output) }
end

local function fmt_tokens(u)
  if not u then
    return nil
  end
  return ("%s tok (%s in, %s out)"):format(fmt_int(u.total), fmt_int(u.input), fmt_int(u.output))
end

-- The log, read: lines that are not a JSON object with a string `type` are
-- counted and skipped.
local function parse(text)
  local events, malformed = {}, 0
  text = text:gsub("^\239\187\191", "") -- a byte-order mark an editor may have added
  for line in text:gmatch("[^\n]+") do
    if line:find("%S") then
      local ok, ev = pcall(cjson.decode, line)
      if ok and type(ev) == "table" and type(ev.type) == "string" then
        events[#events + 1] = ev
      else
        malformed = malformed + 1
      end
    end
  end
  return events, malformed
end

-- The model the page shows: runs (a session each), their steps, and in each
-- step, in order, the root response, the code blocks with the sub-calls and
-- child runs made while each ran, the final answer, and events of types this
-- viewer does not know. Child runs (depth > 0) hang where they started.
local function build(events)
  local model = { runs = {}, steps = 0, sub_calls = 0, child_steps = 0, cache_hits = 0, compactions = 0 }
  local stack = {} -- the open run at each depth
  local by_session = {} -- session id ("1.2") -> its run, where events name it

  -- parent: the run this one hangs in, false for none, nil for the open run
  -- one depth up.
  local function new_run(depth, start_ev, parent)
    local run = { depth = depth, steps = {}, by_no = {}, items = {}, start = start_ev, events = {} }
    if parent == nil then
      parent = depth > 0 and stack[depth - 1] or nil
    end
    if parent then
      run.parent = parent
      local step = parent.current
      if step then
        step.pending[#step.pending + 1] = { kind = "child", run = run }
      else
        parent.items[#parent.items + 1] = { kind = "child", run = run }
      end
    else
      model.runs[#model.runs + 1] = run
    end
    for d in pairs(stack) do
      if d > depth then
        stack[d] = nil
      end
    end
    stack[depth] = run
    return run
  end

  local function step_of(run, no, ev)
    no = num(no)
    if not no then
      return nil
    end
    local step = run.by_no[no]
    if not step then
      step = { no = no, depth = run.depth, items = {}, pending = {}, first = ev }
      run.by_no[no] = step
      run.steps[#run.steps + 1] = step
      if run.depth > 0 or run.parent then
        model.child_steps = model.child_steps + 1
      end
      model.steps = model.steps + 1
    end
    run.current = step
    return step
  end

  -- Sub-calls and child runs made while a block ran come before its
  -- exec_result; they go into the block when it arrives.
  local function take_pending(step)
    local p = step.pending
    step.pending = {}
    return p
  end

  for _, ev in ipairs(events) do
    local depth = math.min(MAX_DEPTH, math.max(0, math.floor(num(ev.depth) or 0)))
    local t = ev.type
    -- Events that name their session ("1", "1.2") go to its run, so the
    -- nested sessions of a batch, which interleave, stay apart; older logs
    -- go by depth alone.
    local sid = type(ev.session) == "string" and ev.session:match("^%d[%d.]*$") and ev.session or nil
    local run = (sid and by_session or stack)[sid or depth]
    -- A session_start opens a run; so does an event with no open run (an
    -- older log, or one that began mid-run) or a step number seen before (a
    -- new run, appended to the same file).
    if t == "session_start" or not run or run.ended
      or (t == "step_start" and num(ev.step) and run.by_no[num(ev.step)]) then
      local parent = nil -- by depth
      if sid then
        parent = by_session[sid:match("^(.*)%.%d+$") or ""] or false
      end
      run = new_run(depth, t == "session_start" and ev or nil, parent)
    end
    if sid then
      by_session[sid] = run
    end
    run.events[#run.events + 1] = ev
    local step = ev.step ~= nil and step_of(run, ev.step, ev) or nil
    if step then
      step.last = ev
    end
    if t == "run_end" then
      run.finish = ev
      run.ended = true
    elseif t == "session_start" or t == "step_start" then -- luacheck: ignore 542
      -- the run or step is made above
    elseif t == "root_delta" then
      -- a streamed root call: only when its first piece came is kept
      if step and not step.delta_at then
        step.delta_at = num(ev.t_ms)
      end
    elseif step and t == "root_response" then
      step.items[#step.items + 1] = { kind = "response", ev = ev, first_delta = step.delta_at }
      step.delta_at = nil
    elseif step and t == "exec_result" then
      step.items[#step.items + 1] = { kind = "block", ev = ev, calls = take_pending(step) }
    elseif t == "sub_query" then
      -- A call the sub-call cache answered is no sub-call.
      if ev.cached then
        model.cache_hits = model.cache_hits + 1
      else
        model.sub_calls = model.sub_calls + 1
      end
      local where = step and step.pending or run.items
      where[#where + 1] = { kind = "sub", ev = ev }
    elseif t == "tool_call" then
      local where = step and step.pending or run.items
      where[#where + 1] = { kind = "tool", ev = ev }
    elseif step and t == "final" then
      step.final = ev
      step.items[#step.items + 1] = { kind = "final", ev = ev }
      run.final = ev
    elseif step and t == "compaction" then
      model.compactions = model.compactions + 1
      step.compaction = ev
      step.items[#step.items + 1] = { kind = "compaction", ev = ev }
    elseif step then
      step.items[#step.items + 1] = { kind = "other", ev = ev }
    else
      run.items[#run.items + 1] = { kind = "other", ev = ev }
    end
  end
  return model
end

-- Figures over a run and every run below it.
local function run_figures(run)
  local f = { steps = 0, sub_calls = 0, tool_calls = 0, cache_hits = 0, compactions = 0 }
  -- Child runs' events come in the middle of their parent's: the span is
  -- from the least to the most, not from the first to the last visited.
  local span = { t = {}, ts = {}, cost = {} }
  local function widen(r, v)
    if v then
      r.min = r.min and math.min(r.min, v) or v
      r.max = r.max and math.max(r.max, v) or v
    end
  end
  local usage = { input = 0, output = 0, total = 0, seen = false }
  -- A reply that reported tokens on a line without cost_usd: the model has
  -- no price (the writer leaves the field out when cost_usd() raises), and
  -- the run's cost is unknown, not the $0 of the lines before it.
  local unpriced = false
  local function visit(r)
    f.steps = f.steps + #r.steps
    for _, ev in ipairs(r.events) do
      widen(span.t, num(ev.t_ms))
      widen(span.ts, num(ev.ts))
      widen(span.cost, num(ev.cost_usd))
      if ev.type == "sub_query" and ev.cached then
        f.cache_hits = f.cache_hits + 1
      elseif ev.type == "sub_query" then
        f.sub_calls = f.sub_calls + 1
      elseif ev.type == "compaction" then
        f.compactions = f.compactions + 1
      elseif ev.type == "tool_call" then
        f.tool_calls = f.tool_calls + 1
      end
      if ev.type == "root_response" or (ev.type == "sub_query" and not ev.recursive) then
        local u = usage_of(ev.usage)
        if u then
          usage.input, usage.output, usage.total = usage.input + u.input, usage.output + u.output,
            usage.total + u.total
          usage.seen = true
          unpriced = unpriced or (u.total > 0 and not num(ev.cost_usd))
        end
      end
    end
    local function children(items)
      for _, item in ipairs(items) do
        if item.kind == "child" then
          visit(item.run)
        end
      end
    end
    children(r.items)
    for _, step in ipairs(r.steps) do
      for _, item in ipairs(step.items) do
        if item.kind == "block" then
          children(item.calls)
        end
      end
      children(step.pending)
    end
  end
  visit(run)
  if span.t.min then
    f.wall_ms = span.t.max - span.t.min
  elseif span.ts.min then
    f.wall_ms = (span.ts.max - span.ts.min) * 1000
  end
  if unpriced then
    f.cost_unknown = true
  elseif span.cost.min then
    f.cost = span.cost.max - span.cost.min
  end
  local finish = run.finish
  f.tokens = finish and usage_of(finish.tokens) or (usage.seen and usage or nil)
  return f
end

local CSS = [[
:root { color-scheme: light dark; --bg: #fff; --fg: #1d1f21; --muted: #667; --line: #d8dbe0;
  --panel: #f6f7f9; --code: #f0f2f5; --err: #b3261e; --errbg: #fdecea; --ok: #1b6e2e; --okbg: #e6f4ea;
  --mark: #ffe066; --accent: #2457c5; }
@media (prefers-color-scheme: dark) { :root { --bg: #16181c; --fg: #e4e6ea; --muted: #9aa0aa; --line: #30343b;
  --panel: #1e2126; --code: #23272e; --err: #ff8a80; --errbg: #3a1f1f; --ok: #8fd19e; --okbg: #1d3323;
  --mark: #7a6200; --accent: #8ab4f8; } }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
header { position: sticky; top: 0; z-index: 2; background: var(--bg); border-bottom: 1px solid var(--line);
  padding: 10px 20px; }
h1 { font-size: 18px; margin: 0 0 6px; }
h2 { font-size: 16px; margin: 0; }
h4 { font-size: 12px; margin: 10px 0 4px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); }
.totals { display: flex; flex-wrap: wrap; gap: 6px 22px; margin: 0; }
.totals div { display: flex; gap: 6px; }
.totals dt { color: var(--muted); }
.totals dd { margin: 0; font-weight: 600; }
.tools { display: flex; gap: 8px; align-items: center; margin-top: 8px; }
#q { flex: 0 1 380px; padding: 5px 8px; border: 1px solid var(--line); border-radius: 6px; background: var(--panel);
  color: var(--fg); font: inherit; }
button { font: inherit; padding: 4px 10px; border: 1px solid var(--line); border-radius: 6px; background: var(--panel);
  color: var(--fg); cursor: pointer; }
#count { color: var(--muted); }
.warn { color: var(--err); margin: 6px 0 0; }
main { padding: 12px 20px 40px; }
.run { border: 1px solid var(--line); border-radius: 8px; margin: 0 0 16px; background: var(--bg); }
.run.child { margin: 10px 0 10px 8px; border-left: 4px solid var(--accent); }
.run-head { padding: 10px 14px; background: var(--panel); border-radius: 8px 8px 0 0;
  border-bottom: 1px solid var(--line); }
.run-head .meta { color: var(--muted); margin: 4px 0 0; }
.steps { padding: 8px 10px; }
details.step { border: 1px solid var(--line); border-radius: 6px; margin: 6px 0; }
details.step > summary { padding: 6px 10px; cursor: pointer; background: var(--panel); border-radius: 6px; }
details.step[open] > summary { border-bottom: 1px solid var(--line); border-radius: 6px 6px 0 0; }
.step-body { padding: 4px 12px 10px; }
.nomatch { display: none; }
.badge { display: inline-block; padding: 0 6px; border-radius: 9px; font-size: 12px; margin-left: 6px; }
.badge.err { color: var(--err); background: var(--errbg); }
.badge.ok { color: var(--ok); background: var(--okbg); }
.badge.info { color: var(--accent); border: 1px solid var(--line); }
.muted { color: var(--muted); }
.ctl { color: var(--err); background: var(--errbg); border-radius: 3px; padding: 0 2px; }
pre { margin: 0; padding: 8px 10px; background: var(--code); border-radius: 5px; white-space: pre-wrap;
  word-break: break-word; max-height: 420px; overflow: auto;
  font: 12.5px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
pre.error { background: var(--errbg); color: var(--err); }
pre.answer { background: var(--okbg); }
.block { border-left: 2px solid var(--line); padding-left: 10px; margin: 8px 0; }
details.sub { margin: 6px 0; border: 1px dashed var(--line); border-radius: 5px; }
details.sub > summary { padding: 4px 8px; cursor: pointer; }
details.sub > div { padding: 0 8px 8px; }
dl.fields { display: grid; grid-template-columns: max-content 1fr; gap: 4px 10px; margin: 0; }
dl.fields dt { color: var(--muted); }
dl.fields dd { margin: 0; }
mark { background: var(--mark); color: inherit; }
pre.code .k { color: #8a3ab9; font-weight: 600; } pre.code .b { color: #2457c5; } pre.code .s { color: #1b6e2e; }
pre.code .c { color: var(--muted); font-style: italic; } pre.code .n { color: #a35200; } pre.code .d { color: #a35200; }
@media (prefers-color-scheme: dark) { pre.code .k { color: #d7a6ff; } pre.code .b { color: #8ab4f8; }
  pre.code .s { color: #8fd19e; } pre.code .n, pre.code .d { color: #f2b872; } }
]]

-- The search: filters steps by their text and marks the matches; #q=term in
-- the address fills it in. It only reads text and builds text nodes.
local JS = [[
(function () {
  "use strict";
  var input = document.getElementById("q");
  var count = document.getElementById("count");
  var steps = Array.prototype.slice.call(document.querySelectorAll("details.step"));
  function unmark() {
    var marks = document.querySelectorAll("mark.hit");
    for (var i = 0; i < marks.length; i++) {
      var m = marks[i], parent = m.parentNode;
      parent.replaceChild(document.createTextNode(m.textContent), m);
      parent.normalize();
    }
  }
  function mark(root, term) {
    var walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, null);
    var nodes = [], n;
    while ((n = walker.nextNode())) nodes.push(n);
    nodes.forEach(function (node) {
      var text = node.nodeValue, lower = text.toLowerCase();
      if (lower.length !== text.length || lower.indexOf(term) < 0) return;
      var frag = document.createDocumentFragment(), at = 0, i;
      while ((i = lower.indexOf(term, at)) >= 0) {
        frag.appendChild(document.createTextNode(text.slice(at, i)));
        var m = document.createElement("mark");
        m.className = "hit";
        m.textContent = text.slice(i, i + term.length);
        frag.appendChild(m);
        at = i + term.length;
      }
      frag.appendChild(document.createTextNode(text.slice(at)));
      node.parentNode.replaceChild(frag, node);
    });
  }
  function apply(value) {
    var term = value.trim().toLowerCase();
    unmark();
    var shown = 0;
    steps.forEach(function (s) {
      var hit = term === "" || s.textContent.toLowerCase().indexOf(term) >= 0;
      s.classList.toggle("nomatch", !hit);
      if (hit) shown++;
    });
    if (term !== "") {
      steps.forEach(function (s) {
        if (!s.classList.contains("nomatch") && !s.parentNode.closest("details.step")) mark(s, term);
      });
      var hits = document.querySelectorAll("mark.hit");
      for (var i = 0; i < hits.length; i++) {
        for (var d = hits[i].closest("details"); d; d = d.parentNode.closest("details")) d.open = true;
      }
      count.textContent = shown + " of " + steps.length + " steps match";
    } else {
      count.textContent = steps.length + " steps";
    }
    document.documentElement.setAttribute("data-shown", String(shown));
  }
  function fromHash() {
    var h = location.hash;
    if (h.indexOf("#q=") !== 0) return;
    var v = h.slice(3);
    try { v = decodeURIComponent(v); } catch (e) { /* keep it raw */ }
    input.value = v;
    apply(v);
  }
  input.addEventListener("input", function () {
    apply(input.value);
    try { history.replaceState(null, "", input.value ? "#q=" + encodeURIComponent(input.value) : "#"); }
    catch (e) { /* file: pages may refuse */ }
  });
  window.addEventListener("hashchange", fromHash);
  function setAll(open) {
    document.querySelectorAll("details").forEach(function (d) { d.open = open; });
  }
  document.getElementById("expand").addEventListener("click", function () { setAll(true); });
  document.getElementById("collapse").addEventListener("click", function () { setAll(false); });
  apply("");
  fromHash();
  document.documentElement.setAttribute("data-ready", "1");
})();
]]

-- A nonce for the page's own <style> and <script>: the log's text is
-- escaped, so this is a second wall, and it only has to be unknown to text
-- written before the page was made.
local function nonce(text)
  local seed = tostring({}):match("0x(%x+)") or tostring({}):match("(%x+)$") or ""
  return ("%x%x%x%s"):format(os.time(), math.floor(os.clock() * 1e6), #text, seed)
end

local Page = {}
Page.__index = Page

function Page:add(...)
  local out = self.out
  for i = 1, select("#", ...) do
    out[#out + 1] = (select(i, ...))
  end
end

function Page:pre(label, text, class)
  if text == nil then
    return
  end
  if label then
    self:add("<h4>", esc(label), "</h4>")
  end
  self:add('<pre class="', class or "text", '">', esc(text), "</pre>")
end

-- Code, its Python highlighted (rlm.tools.highlight): each piece escaped
-- as any text is, inside a span of its class.
function Page:code(label, text)
  if text == nil then
    return
  end
  self:add("<h4>", esc(label), '</h4><pre class="code">')
  for _, piece in ipairs(highlight.python(log.truncate(as_text(text), MAX_FIELD_CHARS))) do
    if piece[1] then
      self:add('<span class="', piece[1], '">', esc(piece[2]), "</span>")
    else
      self:add(esc(piece[2]))
    end
  end
  self:add("</pre>")
end

function Page:badge(class, text)
  self:add('<span class="badge ', class, '">', esc(text), "</span>")
end

-- The parts that are not nil, between dots.
local function joined(...)
  local kept = {}
  for i = 1, select("#", ...) do
    local p = select(i, ...)
    if p then
      kept[#kept + 1] = p
    end
  end
  return table.concat(kept, " · ")
end

-- The events of the runtime's own that a reader rarely needs: shown folded
-- (<details>, closed), with one line that says what they say.
local FOLDED = {
  sandbox_ready = function(ev)
    return "sandbox ready", joined(type(ev.backend) == "string" and ev.backend or nil,
      type(ev.mode) == "string" and ev.mode ~= ev.backend and ev.mode or nil,
      type(ev.start) == "string" and ev.start or nil)
  end,
}

-- An event of a type this viewer does not know (or one of FOLDED): its
-- fields, strings as they are, the rest as JSON.
function Page:other(ev)
  local keys = {}
  for k in pairs(ev) do
    if k ~= "type" and k ~= "ts" and k ~= "t_ms" then
      keys[#keys + 1] = tostring(k)
    end
  end
  table.sort(keys)
  local fold = FOLDED[ev.type]
  if fold then
    local title, detail = fold(ev)
    self:add('<details class="event" data-type="', attr(ev.type), '"><summary>', esc(title),
      detail ~= "" and (' <span class="muted">' .. esc(detail) .. "</span>") or "", '</summary><dl class="fields">')
  else
    self:add('<div class="event" data-type="', attr(ev.type), '"><h4>', esc("event " .. as_text(ev.type)),
      '</h4><dl class="fields">')
  end
  for i = 1, math.min(#keys, MAX_EVENT_FIELDS) do
    local v = ev[keys[i]]
    local text = v
    if type(v) ~= "string" then
      local ok, json = pcall(cjson.encode, v)
      text = ok and json or tostring(v)
    end
    self:add("<dt>", esc(keys[i]), '</dt><dd><pre class="field">', esc(text), "</pre></dd>")
  end
  self:add(fold and "</dl></details>" or "</dl></div>")
end

function Page:sub(ev)
  local tokens = usage_of(ev.usage)
  local batch = num(ev.batch_size) and ("batch %s/%s"):format(as_text(num(ev.batch_index) or "?"),
    as_text(num(ev.batch_size))) or nil
  self:add('<details class="sub"><summary>')
  self:add("llm_query", num(ev.index) and (" #" .. esc(num(ev.index))) or "")
  self:add(' <span class="muted">', esc(joined(batch, fmt_ms(ev.latency_ms), fmt_tokens(tokens))), "</span>")
  if ev.recursive then
    self:badge("info", "recursive")
  end
  if ev.cached then
    self:badge("ok", "cached" .. (num(ev.cache_hit) and (" · hit " .. as_text(num(ev.cache_hit))) or ""))
  end
  if ev.error ~= nil then
    self:badge("err", "error")
  end
  self:add("</summary><div>")
  self:pre("Prompt", ev.prompt)
  self:pre("Response", ev.response)
  self:pre("Error", ev.error, "error")
  self:add("</div></details>")
end

-- A host tool's call: its name, arguments and result or error.
function Page:tool(ev)
  local function json(v)
    if v == nil or type(v) == "string" then
      return v
    end
    local ok, text = pcall(cjson.encode, v)
    return ok and text or tostring(v)
  end
  self:add('<details class="sub tool"><summary>', "tool ", esc(as_text(ev.name)),
    num(ev.index) and (" #" .. esc(num(ev.index))) or "")
  self:add(' <span class="muted">', esc(joined(fmt_ms(ev.latency_ms))), "</span>")
  if ev.error ~= nil then
    self:badge("err", "error")
  end
  self:add("</summary><div>")
  self:pre("Arguments", json(ev.args))
  self:pre("Result", json(ev.result))
  self:pre("Error", ev.error, "error")
  self:add("</div></details>")
end

function Page:calls(items)
  local tools, hidden = 0, 0
  for _, item in ipairs(items) do
    if item.kind == "tool" then
      tools = tools + 1
      if tools <= MAX_TOOL_CALLS_SHOWN then
        self:tool(item.ev)
      else
        hidden = hidden + 1
      end
    elseif item.kind == "sub" then
      self:sub(item.ev)
    elseif item.kind == "child" then
      self:run(item.run)
    else
      self:other(item.ev)
    end
  end
  if hidden > 0 then
    self:add('<p class="muted">', esc(("%d more tool calls"):format(hidden)), "</p>")
  end
end

-- The lines of s without their common leading blanks.
local function dedent(s)
  local common
  for line in s:gmatch("[^\n]+") do
    if line:find("%S") then
      local lead = line:match("^[ \t]*")
      common = (not common or #lead < #common) and lead or common
    end
  end
  if not common or common == "" then
    return s
  end
  return (("\n" .. s):gsub("\n" .. common:gsub("%p", "%%%0"), "\n"):sub(2))
end

local function trimmed(s)
  return (s:gsub("^%s+", ""):gsub("%s+$", ""))
end

-- The root response with each fenced block that ran as one of the step's
-- blocks replaced by a line naming it: the code is shown once, highlighted,
-- under "Code". A fence whose text is not a block's (not run, or run
-- changed) stays.
local function without_code(response, items)
  if type(response) ~= "string" then
    return response
  end
  local codes = {}
  for _, item in ipairs(items) do
    if item.kind == "block" and type(item.ev.code) == "string" then
      codes[trimmed(item.ev.code)] = codes[trimmed(item.ev.code)] or item.ev.block or "?"
    end
  end
  return (response:gsub("([ \t]*)```[%w_]*[ \t]*\n(.-)\n[ \t]*```", function(indent, body)
    local block = codes[trimmed(dedent(indent .. body))] or codes[trimmed(body)]
    if block then
      return ("%s[code of block %s: below]"):format(indent, as_text(block))
    end
  end))
end

-- A compaction (option compact): which turns went, what they became, and
-- the conversation's size before and after.
function Page:compaction(ev)
  local how = ev.summary == "model" and "the root model's summary" or "a digest"
  local turns = num(ev.first_turn) and num(ev.last_turn) and ("turns %s to %s"):format(as_text(num(ev.first_turn)),
    as_text(num(ev.last_turn))) or "earlier turns"
  self:add('<div class="compaction"><h4>', esc("Compaction " .. as_text(num(ev.index) or "")), "</h4>",
    '<p class="muted">', esc(joined(turns .. " replaced by " .. how,
      num(ev.bytes_before) and num(ev.bytes_after) and ("%s → %s bytes"):format(fmt_int(num(ev.bytes_before)),
        fmt_int(num(ev.bytes_after))) or nil,
      num(ev.tokens_before) and ("%s tokens measured, over %s"):format(fmt_int(num(ev.tokens_before)),
        fmt_int(num(ev.at_tokens) or 0)) or nil,
      num(ev.kept_turns) and ("last %s turns kept whole"):format(as_text(num(ev.kept_turns))) or nil,
      fmt_tokens(usage_of(ev.usage)), fmt_ms(ev.latency_ms))), "</p>")
  self:pre("Why the digest stands in for the summary", ev.summary_error, "error")
  self:add("</div>")
end

function Page:step(step)
  local ev = step.first
  local blocks, subs, hits, errs, root_ms, tokens, first_token = 0, 0, 0, 0, nil, nil, nil
  for _, item in ipairs(step.items) do
    if item.kind == "block" then
      blocks = blocks + 1
      errs = errs + (item.ev.error ~= nil and 1 or 0)
      for _, c in ipairs(item.calls) do
        if c.kind == "sub" and c.ev.cached then
          hits = hits + 1
        elseif c.kind == "sub" then
          subs = subs + 1
        end
      end
    elseif item.kind == "response" then
      root_ms = (root_ms or 0) + (num(item.ev.latency_ms) or 0)
      tokens = usage_of(item.ev.usage) or tokens
      local t, ms = num(item.ev.t_ms), num(item.ev.latency_ms)
      if item.first_delta and t and ms and not first_token then
        first_token = math.max(0, item.first_delta - (t - ms)) -- from the call's start
      end
    end
  end
  local t0, t1 = num(ev.t_ms), step.last and num(step.last.t_ms)
  local took = (t0 and t1 and t1 >= t0) and fmt_ms(t1 - t0) or nil
  self:add('<details class="step" data-step="', attr(step.no), '" data-depth="', attr(step.depth), '"',
    self.open_steps and " open" or "", "><summary>")
  self:add("<strong>Step ", esc(step.no), "</strong>")
  if step.depth > 0 then
    self:badge("info", "depth " .. as_text(step.depth))
  end
  self:add(' <span class="muted">', esc(joined(
    ("%d block%s"):format(blocks, blocks == 1 and "" or "s"),
    subs > 0 and ("%d sub-call%s"):format(subs, subs == 1 and "" or "s") or nil,
    hits > 0 and ("%d cached"):format(hits) or nil,
    took, root_ms and ("root " .. fmt_ms(root_ms)) or nil,
    first_token and ("first token " .. fmt_ms(first_token)) or nil, fmt_tokens(tokens)
  )), "</span>")
  if errs > 0 then
    self:badge("err", errs == 1 and "error" or (errs .. " errors"))
  end
  if step.final then
    self:badge("ok", "final")
  end
  if step.compaction then
    self:badge("info", "compacted")
  end
  self:add('</summary><div class="step-body">')
  for _, item in ipairs(step.items) do
    local e = item.ev
    if item.kind == "response" and e.compaction then
      self:pre("Root response: the compaction's summary", e.response)
    elseif item.kind == "compaction" then
      self:compaction(e)
    elseif item.kind == "response" then
      self:pre("Root response", without_code(e.response, step.items))
    elseif item.kind == "block" then
      self:add('<div class="block" data-block="', attr(e.block or ""), '">')
      self:code("Code, block " .. as_text(e.block or "?"), e.code)
      self:calls(item.calls)
      self:pre("Output", e.stdout ~= "" and e.stdout or nil, "stdout")
      self:pre("Error", e.error, "error")
      self:add("</div>")
    elseif item.kind == "final" then
      self:pre("Final answer (" .. as_text(e.kind or "?") .. ")", e.answer, "answer")
    else
      self:other(e)
    end
  end
  if #step.pending > 0 then
    self:add('<div class="block unfinished"><h4>Calls of a block that did not finish</h4>')
    self:calls(step.pending)
    self:add("</div>")
  end
  self:add("</div></details>")
end

function Page:run(run)
  local f = run_figures(run)
  local child = run.depth > 0 or run.parent ~= nil
  self:add('<section class="run', child and " child" or "", '" data-depth="', attr(run.depth), '">',
    '<div class="run-head">')
  self:add("<h2>", child and ("Child run · depth " .. esc(run.depth)) or ("Run " .. self.top_no), "</h2>")
  local finish = run.finish
  local meta = joined(
    ("%d step%s"):format(f.steps, f.steps == 1 and "" or "s"),
    ("%d sub-call%s"):format(f.sub_calls, f.sub_calls == 1 and "" or "s"),
    f.tool_calls > 0 and ("%d tool call%s"):format(f.tool_calls, f.tool_calls == 1 and "" or "s") or nil,
    f.cache_hits > 0 and ("%d cache hit%s"):format(f.cache_hits, f.cache_hits == 1 and "" or "s") or nil,
    f.compactions > 0 and ("%d compaction%s"):format(f.compactions, f.compactions == 1 and "" or "s") or nil,
    fmt_tokens(f.tokens), f.cost_unknown and "cost unknown" or fmt_usd(f.cost),
    f.wall_ms and ("wall " .. fmt_ms(f.wall_ms)) or nil
  )
  self:add('<p class="meta">', esc(meta))
  if finish and finish.ok == false then
    self:badge("err", as_text(finish.error_kind or "error"))
  elseif finish and finish.ok then
    self:badge("ok", "ok")
    if run.final and run.final.partial then
      self:badge("info", "partial answer")
    end
  elseif not finish then
    self:badge("info", run.final and "no run_end" or "unfinished")
  end
  self:add("</p>")
  if run.start then
    self:pre("Query", run.start.query)
  end
  local answer = finish and finish.answer
  if answer == nil and run.final then
    answer = run.final.answer
  end
  self:pre("Answer", answer, "answer")
  if finish and finish.ok == false then
    self:pre("Error", finish.error_message or finish.error_kind, "error")
  end
  self:add('</div><div class="steps">')
  self:calls(run.items)
  for _, step in ipairs(run.steps) do
    self:step(step)
  end
  self:add("</div></section>")
end

local function total_figures(model)
  local t = { steps = model.steps, child_steps = model.child_steps, sub_calls = model.sub_calls, runs = #model.runs,
    cache_hits = model.cache_hits, compactions = model.compactions }
  for _, run in ipairs(model.runs) do
    local f = run_figures(run)
    if f.tokens then
      t.tokens = t.tokens or { input = 0, output = 0, total = 0 }
      t.tokens.input = t.tokens.input + f.tokens.input
      t.tokens.output = t.tokens.output + f.tokens.output
      t.tokens.total = t.tokens.total + f.tokens.total
    end
    if f.cost then
      t.cost = (t.cost or 0) + f.cost
    end
    t.cost_unknown = t.cost_unknown or f.cost_unknown
    if f.wall_ms then
      t.wall_ms = (t.wall_ms or 0) + f.wall_ms
    end
  end
  return t
end

function Page:header(model, malformed)
  local t = total_figures(model)
  self:add('<header><h1>rlm trajectory</h1><dl class="totals" id="totals">')
  local function item(id, label, value)
    self:add('<div><dt>', label, '</dt><dd id="', id, '">', esc(value), "</dd></div>")
  end
  item("total-runs", "runs", t.runs)
  item("total-steps", "steps", t.child_steps > 0 and ("%d (%d in child runs)"):format(t.steps, t.child_steps)
    or t.steps)
  item("total-sub-calls", "sub-calls", t.sub_calls)
  if t.cache_hits > 0 then
    item("total-cache-hits", "cache hits", t.cache_hits)
  end
  if t.compactions > 0 then
    item("total-compactions", "compactions", t.compactions)
  end
  item("total-tokens", "tokens", t.tokens and ("%s (%s in, %s out)"):format(fmt_int(t.tokens.total),
    fmt_int(t.tokens.input), fmt_int(t.tokens.output)) or "—")
  item("total-cost", "cost", not t.cost_unknown and fmt_usd(t.cost) or "unknown")
  item("total-wall", "wall time", fmt_ms(t.wall_ms) or "—")
  self:add("</dl>")
  if malformed > 0 then
    self:add('<p class="warn" id="malformed">', esc(malformed), " malformed line",
      malformed == 1 and "" or "s", " skipped</p>")
  end
  self:add('<div class="tools"><input id="q" type="search" placeholder="Search steps" autocomplete="off">',
    '<span id="count"></span><button id="expand" type="button">Expand all</button>',
    '<button id="collapse" type="button">Collapse all</button></div></header>')
end

-- html(jsonl_text) -> the page, a string.
function M.html(text)
  if type(text) ~= "string" then
    error("rlm.view.html: the log must be a string, not " .. type(text), 2)
  end
  local events, malformed = parse(text)
  local model = build(events)
  local n = nonce(text)
  local page = setmetatable({ out = {}, top_no = 0 }, Page)
  page.open_steps = model.steps <= OPEN_STEPS_UP_TO
  page:add('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
    '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'nonce-', n,
    '\'; script-src \'nonce-', n, '\'; img-src data:; base-uri \'none\'; form-action \'none\'">',
    '<meta name="viewport" content="width=device-width, initial-scale=1">',
    "<title>rlm trajectory</title>",
    '<style nonce="', n, '">', CSS, "</style></head><body>")
  page:header(model, malformed)
  page:add('<main id="runs">')
  if #model.runs == 0 then
    page:add('<p class="muted" id="empty">The log holds no events.</p>')
  end
  for _, run in ipairs(model.runs) do
    page.top_no = page.top_no + 1
    page:run(run)
  end
  page:add("</main>", '<script nonce="', n, '">', JS, "</script></body></html>\n")
  return table.concat(page.out)
end

return M
