-- The figures the docs quote from bench/RESULTS.md are the ones it holds:
-- each row names a doc, the sentence around the figure (%s where it goes),
-- and the RESULTS row it comes from (figure number, a plain piece of the
-- row's label, the column), with how the doc writes it. When `make bench`
-- writes new figures, this says which docs to bring along.
local util = require("rlm.base.util")

-- RESULTS.md's figure rows: { no =, label =, median =, floor =, ratio = }.
local function results()
  local rows = {}
  for line in assert(util.read_file("bench/RESULTS.md")):gmatch("[^\n]+") do
    local cells = {}
    for cell in (line .. "|"):gmatch("%s*([^|]-)%s*|") do
      cells[#cells + 1] = cell
    end
    -- "| 14 | label | median | n | floor | floor median | ratio | ..."
    if tonumber(cells[2]) then
      rows[#rows + 1] = { no = tonumber(cells[2]), label = cells[3], median = cells[4], floor = cells[7],
        ratio = cells[8] }
    end
  end
  return rows
end

-- A RESULTS value ("2.04e+03 ms", "124.0 us, p99 281.0", "14") in the unit
-- the doc uses.
local function number(cell)
  return assert(tonumber(cell:match("^[%d.e+]+")), cell)
end
local UNIT = { ms = 1, us = 1e-3, s = 1e3 }
local function ms(cell)
  return number(cell) * UNIT[cell:match("^[%d.e+]+ (%a+)") or "ms"]
end
local FORMATS = {
  seconds1 = function(cell) -- "2.0 s"
    return ("%.1f s"):format(ms(cell) / 1000)
  end,
  as_is = function(cell) -- the cell's first figure as RESULTS writes it: "118 ms", "6.43x"
    return cell:match("^[^,]+")
  end,
  us3 = function(cell) -- "124 us" from "124.0 us, p99 ..."
    return ("%.3g us"):format(number(cell))
  end,
  count = function(cell)
    return ("%d"):format(number(cell))
  end,
  ms1 = function(cell) -- "0.2 ms"
    return ("%.1f ms"):format(ms(cell))
  end,
}

-- { doc, the text with %s for the figure, figure no, a piece of the label,
-- column, format }
local QUOTED = {
  { "docs/llm.md", "refuses the rest took %s with jitter", 14, ", full jitter (default)", "median", "seconds1" },
  { "docs/llm.md", "with jitter and\n%s without", 14, ", no jitter (jitter = false)", "median", "seconds1" },
  { "docs/llm.md", "against %s for a client that paces", 14, ", full jitter (default)", "floor", "seconds1" },
  { "docs/llm.md", "at most %s requests reached the server", 14, "full jitter (default): most retries", "median",
    "count" },
  { "docs/llm.md", "with jitter, %s without.", 14, "no jitter (jitter = false): most retries", "median", "count" },
  { "docs/backends.md", "(the echo driver's hello) | %s |", 13, "python3's first line", "median", "as_is" },
  { "docs/backends.md", "(the echo driver's hello) | 104 ms | %s |", 13, "python3's first line", "floor", "as_is" },
  { "docs/backends.md", "with bubblewrap's flags | %s |", 13, "rlm-keeper's hello", "median", "as_is" },
  { "docs/backends.md", "with bubblewrap's flags | 95.7 ms | %s |", 13, "rlm-keeper's hello", "floor", "as_is" },
  { "docs/backends.md", "removal too) | %s |", 13, "podman run true", "median", "as_is" },
  { "docs/backends.md", "removal too) | 142 ms | %s |", 13, "podman run true", "floor", "as_is" },
  { "docs/backends.md", "a new container) | %s |", 17, "cold start, the podman backend", "median", "as_is" },
  { "docs/backends.md", "a new container) | 118 ms | %s |", 17, "cold start, the podman backend", "floor", "as_is" },
  { "docs/backends.md", "| 18.3 ms | %s |", 17, "cold start, the podman backend", "ratio", "as_is" },
  { "docs/backends.md", "the keeper's hello read by the host | %s |", 17, "rlm-keeper's hello read by the host (podman",
    "median", "as_is" },
  { "docs/backends.md", "(pinned to one CPU) | %s |", 17, "step round trip, the podman backend", "median", "us3" },
  { "docs/backends.md", "(pinned to one CPU) | 124 us | %s |", 17, "step round trip, the podman backend", "floor",
    "us3" },
  { "docs/backends.md", "| 121 us | %s (target 2x) |", 17, "step round trip, the podman backend", "ratio", "as_is" },
  { "docs/backends.md", "+ first step) | %s |", 17, "warm pool take, the podman backend", "median", "as_is" },
  { "docs/backends.md", "+ first step) | 1.47 ms | %s |", 17, "warm pool take, the podman backend", "floor", "as_is" },
  { "docs/backends.md", "| 0.906 ms | %s |", 17, "warm pool take, the podman backend", "ratio", "as_is" },
  { "docs/backends.md", "about %s a cold start (`bench/RESULTS.md`, figure 1)", 1, "cold start: Session.new", "median",
    "as_is_rounded" },
  { "docs/api.md", "thread about %s (bench/RESULTS.md, figure 1's first phase)", 1, "phase: host: Session.new",
    "median", "ms1" },
  { "README.md", "in flight, took %s (median of 20)", 7, "all in flight", "median", "as_is" },
  { "README.md", "against a floor of %s (64 timers", 7, "all in flight", "floor", "as_is" },
  { "README.md", "they take 8 waves, %s. A nested", 7, "the same at the default", "median", "as_is" },
  { "README.md", "once costs %s, about a cold start", 7, "rlm_query: a nested session", "median", "as_is" },
}
FORMATS.as_is_rounded = function(cell) -- "17 ms" from "17.1 ms"
  return ("%.0f ms"):format(ms(cell))
end

describe("the figures the docs quote from bench/RESULTS.md", function()
  local rows = results()

  it("reads RESULTS.md's figure rows", function()
    assert.is_true(#rows > 50, #rows)
  end)

  for _, q in ipairs(QUOTED) do
    local doc, text, no, label, column, format = q[1], q[2], q[3], q[4], q[5], q[6]
    it(("%s quotes figure %d (%s, %s) as RESULTS.md has it"):format(doc, no, label, column), function()
      local found
      for _, r in ipairs(rows) do
        if r.no == no and r.label:find(label, 1, true) then
          assert.is_nil(found, "two rows of figure " .. no .. " match " .. label)
          found = r
        end
      end
      assert.is_truthy(found, ("no row of figure %d has %q"):format(no, label))
      local want = text:format(FORMATS[format](found[column]))
      local body = assert(util.read_file(doc)):gsub("[ \n]+", " ")
      assert.is_truthy(body:find(want:gsub("[ \n]+", " "), 1, true),
        ("%s does not say %q (RESULTS.md: %s)"):format(doc, want, found[column]))
    end)
  end
end)

-- Every paragraph of README.md and docs/ that names a bench figure ("figure
-- 15", "figures 7 and 10"; with the table after it when it ends in a colon)
-- quotes only that figure's numbers: each quantity in it (ms, us, s, x,
-- bytes, words, MB) is one of the values RESULTS.md's rows of the figures
-- named hold, as the doc rounds it. A paragraph whose figures come from
-- another run says so on its first line: `<!-- figures: not
-- bench/RESULTS.md's: why -->`. QUOTED above pins the exact place of the
-- figures a reader meets first; this finds the ones nobody listed.
describe("every paragraph of the docs that names a bench figure", function()
  local SCALE = { ms = 1, us = 1e-3, ["µs"] = 1e-3, s = 1e3 }
  local COUNTED = { x = true, bytes = true, words = true, MB = true }

  -- The quantities in a text: { v =, unit =, text = the digits as written }.
  local function quantities(text, out)
    for digits, unit in text:gmatch("(%d[%d,]*%.?%d*e?[+-]?%d*)%s?([%aµ]*)") do
      local v = tonumber((digits:gsub(",", "")))
      if v then
        out[#out + 1] = { v = v, unit = unit, text = digits }
      end
    end
    return out
  end

  local by_figure = {}
  for line in assert(util.read_file("bench/RESULTS.md")):gmatch("[^\n]+") do
    local no, rest = line:match("^| (%d+) |(.*)$")
    if no then
      by_figure[tonumber(no)] = quantities(rest, by_figure[tonumber(no)] or {})
    end
  end

  -- Whether RESULTS.md holds q among values: the same number in the same
  -- kind of unit, within half the last digit the doc wrote ("1.6 ms" is
  -- 1.62; "about 100 ms" is 95 to 150).
  local function held(q, values)
    local decimals = q.text:match("%.(%d+)$")
    local tolerance = 0.5 * 10 ^ -(decimals and #decimals or 0)
    local plain = q.text:gsub(",", "")
    local zeros = #plain:match("0*$")
    if not decimals and zeros > 0 and zeros < #plain then
      tolerance = 0.5 * 10 ^ zeros
    end
    for _, c in ipairs(values) do
      local cv
      if SCALE[q.unit] and SCALE[c.unit] then
        cv = c.v * SCALE[c.unit] / SCALE[q.unit]
      elseif not SCALE[q.unit] and not SCALE[c.unit] then
        cv = c.v
      end
      if cv and math.abs(cv - q.v) <= tolerance + 1e-9 then
        return true
      end
    end
    return false
  end

  -- { path =, line =, text =, mark = } for each paragraph naming a figure.
  local function paragraphs()
    local out = {}
    local p = assert(io.popen("ls README.md docs/*.md"))
    for path in p:lines() do
      local lines = {}
      for line in (assert(util.read_file(path)) .. "\n"):gmatch("([^\n]*)\n") do
        lines[#lines + 1] = line
      end
      local i, fence = 1, false
      while i <= #lines do
        if lines[i]:match("^%s*```") then
          fence = not fence
          i = i + 1
        elseif fence or lines[i]:match("^%s*$") then
          i = i + 1
        else
          local j = i
          while lines[j + 1] and not lines[j + 1]:match("^%s*$") and not lines[j + 1]:match("^%s*```") do
            j = j + 1
          end
          local text = table.concat(lines, "\n", i, j)
          local last = j
          if text:match(":%s*$") and lines[j + 2] and lines[j + 2]:match("^|") then
            last = j + 2
            while lines[last + 1] and lines[last + 1]:match("^|") do
              last = last + 1
            end
            text = text .. "\n" .. table.concat(lines, "\n", j + 2, last)
          end
          local nos = {}
          for no in text:gmatch("[Ff]igures? (%d+)") do
            nos[#nos + 1] = tonumber(no)
          end
          for no in text:gmatch("[Ff]igures %d+ and (%d+)") do
            nos[#nos + 1] = tonumber(no)
          end
          if #nos > 0 then
            out[#out + 1] = { path = path, line = i, text = text, figures = nos,
              mark = lines[i]:match("^<!%-%- figures: not bench/RESULTS%.md's: (.+) %-%->$") }
          end
          i = last + 1
        end
      end
    end
    p:close()
    return out
  end

  local found = paragraphs()

  it("are found", function()
    assert.is_true(#found >= 10, #found)
  end)

  it("quote only their figures' values in RESULTS.md, or say on their first line why not", function()
    local wrong = {}
    for _, para in ipairs(found) do
      if not para.mark then
        local values, missing = {}, {}
        for _, no in ipairs(para.figures) do
          if not by_figure[no] then
            missing[#missing + 1] = "figure " .. no .. " (not in RESULTS.md)"
          end
          for _, v in ipairs(by_figure[no] or {}) do
            values[#values + 1] = v
          end
        end
        for _, q in ipairs(quantities(para.text, {})) do
          if (SCALE[q.unit] or COUNTED[q.unit]) and not held(q, values) then
            missing[#missing + 1] = q.text .. " " .. q.unit
          end
        end
        if #missing > 0 then
          wrong[#wrong + 1] = ("%s:%d (figure %s): %s"):format(para.path, para.line,
            table.concat(para.figures, ", "), table.concat(missing, "; "))
        end
      end
    end
    assert.are.same({}, wrong)
  end)
end)
