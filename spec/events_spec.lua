-- The events on_event receives: one registry of their types and fields
-- (rlm.base.events), which every emitter's code names only what it holds,
-- and which docs/api.md's and docs/log.md's event tables document, no more
-- and no less.
local events = require("rlm.base.events")
local util = require("rlm.base.util")

local function read(path)
  return assert(util.read_file(path))
end

local function sorted_keys(t)
  local out = {}
  for k in pairs(t) do
    out[#out + 1] = k
  end
  table.sort(out)
  return out
end

-- The events a source makes: for each `_emit({ ... })` or
-- `events.check({ ... })`, its type and the keys of its table (those of
-- tables inside it left out), with the line it starts on.
local function emitted(src)
  local out = {}
  for at, body in src:gmatch("()[%w_.:]*[:.][_%w]+%(%s*(%b{})") do
    local call = src:sub(at, at + 80):match("^[%w_.:]*[:.]([_%w]+)%(")
    if call == "_emit" or call == "check" then
      local inner = body:sub(2, -2):gsub("%b{}", "{}"):gsub("%b()", "()"):gsub('"[^"]*"', '""')
      local keys = {}
      for key in ("," .. inner):gmatch(",%s*([%a_][%w_]*)%s*=[^=]") do
        keys[#keys + 1] = key
      end
      local _, line = src:sub(1, at):gsub("\n", "")
      out[#out + 1] = { type = body:match('^{%s*type%s*=%s*"([%w_]+)"'), keys = keys, line = line + 1 }
    end
  end
  return out
end

-- A document's event table: type -> the text of its row.
local function doc_table(path, heading)
  local doc = read(path)
  local from = assert(doc:find(heading, 1, true), path .. ": no " .. heading)
  local rows = {}
  local seen_table = false
  for line in doc:sub(from):gmatch("([^\n]*)\n") do
    local t, rest = line:match("^| `([%w_]+)` |(.*)$")
    if t and t ~= "type" then
      rows[t] = rest
      seen_table = true
    elseif seen_table and not line:find("^|") then
      break
    end
  end
  return rows
end

describe("the event registry (rlm.base.events)", function()
  it("names each type once, with fields of its own", function()
    local seen = {}
    for _, row in ipairs(events.TYPES) do
      assert.is_nil(seen[row[1]], row[1])
      seen[row[1]] = true
      assert.is_true(#row >= 2, row[1])
    end
  end)

  it("lets an event of a listed type and fields through, and raises for any other", function()
    local ev = { type = "step_start", step = 1, depth = 0, session = "1" }
    assert.are.equal(ev, events.check(ev))
    assert.has_error(function()
      events.check({ type = "step_begin", step = 1 })
    end, "rlm.base.events: unknown event type step_begin")
    assert.has_error(function()
      events.check({ type = "step_start", step = 1, steps = 2 })
    end, "rlm.base.events: a step_start event has no field steps")
  end)

  it("holds every event an emitter in lua/rlm makes: its type and each field it sets", function()
    local p = assert(io.popen("cd lua && find rlm -name '*.lua' | sort"))
    local wrong, found = {}, {}
    for path in p:lines() do
      for _, ev in ipairs(emitted(read("lua/" .. path))) do
        local where = ("%s:%d"):format(path, ev.line)
        local fields = ev.type and events.FIELDS[ev.type]
        if not fields then
          wrong[#wrong + 1] = where .. ": type " .. tostring(ev.type)
        else
          found[ev.type] = true
          for _, k in ipairs(ev.keys) do
            if k ~= "type" and not fields[k] then
              wrong[#wrong + 1] = ("%s: %s.%s"):format(where, ev.type, k)
            end
          end
        end
      end
    end
    p:close()
    assert.are.same({}, wrong)
    -- And every listed type is made somewhere: none is left over.
    assert.are.same(sorted_keys(events.FIELDS), sorted_keys(found))
  end)

  it("reads an emitter's type and fields as the code sets them", function()
    local got = emitted(table.concat({
      "x = 1",
      'local ok = s:_emit({ type = "run_end", ok = r ~= nil, tokens = { input = 1, output = 2 },',
      '  answer = f(a, { b = 1 }), error_message = ("%s = %d"):format("a", 1), cache_hits = n == 1 })',
      'cb(events.check({ type = "sandbox_release_failed", message = "a = b", depth = 1 }))',
      'other({ type = "x", y = 1 })',
    }, "\n"))
    assert.are.same({
      { type = "run_end", keys = { "type", "ok", "tokens", "answer", "error_message", "cache_hits" }, line = 2 },
      { type = "sandbox_release_failed", keys = { "type", "message", "depth" }, line = 4 },
    }, got)
  end)

  for _, doc in ipairs({ { "docs/api.md", "## Events" }, { "docs/log.md", "### Events" } }) do
    it("is what " .. doc[1] .. "'s event table documents: every type, and each of its fields", function()
      local rows = doc_table(doc[1], doc[2])
      assert.are.same(sorted_keys(events.FIELDS), sorted_keys(rows))
      local missing = {}
      for _, row in ipairs(events.TYPES) do
        for i = 2, #row do
          -- `name`, or `name = value`
          if rows[row[1]] and not rows[row[1]]:find("`" .. row[i] .. "[`%s=]") then
            missing[#missing + 1] = row[1] .. "." .. row[i]
          end
        end
      end
      assert.are.same({}, missing)
    end)
  end
end)
