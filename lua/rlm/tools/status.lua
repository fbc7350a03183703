-- The command line's live status: one line on a terminal, redrawn in place,
-- that says where a run is (the step, what it waits for, the sub-calls, the
-- tokens, the cost, the time). It is fed the session's events and told of
-- each model call; it shows no text of the model's or the sandbox's, only
-- figures and its own words, so it needs no escaping.
--
--   local st = status.new({ write = fn, clock = fn, usage = fn, cost = fn, steps = n, width = n })
--   st.event(ev)           -- on_event
--   st.phase("root")       -- a model call starts ("root" or "sub")
--   st.clear()             -- before anything else is written to the terminal
--   st.draw()              -- after it
--   st.pause(), st.resume() -- around text written a piece at a time (a
--                             streamed reply): cleared, and not drawn between
local M = {}

-- "\r" back to the line's start, "ESC [ K" clears to its end: the line is
-- redrawn over itself, and cleared before other text.
local CLEAR = "\r\27[K"

local function thousands(n)
  local s = ("%d"):format(n)
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""))
end

-- o.write(s) writes to the terminal; o.clock() is seconds (a float);
-- o.usage() -> { input_tokens =, output_tokens = } or nil; o.cost() -> USD
-- (nil o.cost: the prices are unknown, and the line says so rather than
-- show $0); o.steps is max_iterations; o.width the terminal's columns (the
-- line stays within one row: a wrapped line would not be redrawn in place).
function M.new(o)
  local started = o.clock()
  local state = { step = 0, sub_calls = 0, tools = 0, doing = "starting the sandbox" }
  local shown = nil -- the line on the terminal now
  local paused = false
  local width = math.max(20, (o.width or 80) - 1)
  local st = {}

  function st.line()
    local parts = { state.doing }
    if state.step > 0 then
      parts[1] = ("step %d/%d: %s"):format(state.step, o.steps or 0, state.doing)
    end
    parts[#parts + 1] = ("%d sub-call%s"):format(state.sub_calls, state.sub_calls == 1 and "" or "s")
    if state.tools > 0 then
      parts[#parts + 1] = ("%d tool call%s"):format(state.tools, state.tools == 1 and "" or "s")
    end
    local u = o.usage and o.usage()
    if u then
      parts[#parts + 1] = thousands((u.input_tokens or 0) + (u.output_tokens or 0)) .. " tokens"
    end
    local usd = o.cost and o.cost()
    parts[#parts + 1] = usd and ("$%.4f"):format(usd) or "cost unknown"
    parts[#parts + 1] = ("%.1f s"):format(o.clock() - started)
    local line = "rlm: " .. table.concat(parts, ", ")
    if #line > width then
      line = line:sub(1, width - 3) .. "..."
    end
    return line
  end

  function st.draw()
    if paused then
      return
    end
    local line = st.line()
    if line ~= shown then
      o.write(CLEAR .. line)
      shown = line
    end
  end

  function st.clear()
    if shown then
      o.write(CLEAR)
      shown = nil
    end
  end

  function st.pause()
    st.clear()
    paused = true
  end

  function st.resume()
    paused = false
    st.draw()
  end

  -- A model call starts: "root" or "sub"; drawn at once.
  function st.phase(call)
    state.doing = call == "root" and "root model" or ("sub-call %d"):format(state.sub_calls + 1)
    st.draw()
  end

  function st.event(ev)
    local t = ev.type
    local top = (ev.depth or 0) == 0
    if t == "step_start" and top then
      state.step = ev.step or state.step
      state.doing = "root model"
    elseif t == "step_start" or (t == "root_response" and not top) then
      state.doing = ("nested session (depth %d)"):format(ev.depth)
    elseif t == "root_response" then
      state.doing = "running code"
    elseif t == "sub_query" then
      state.sub_calls = state.sub_calls + 1
      state.doing = top and "running code" or ("nested session (depth %d)"):format(ev.depth)
    elseif t == "tool_call" then
      state.tools = state.tools + 1
    elseif t == "interrupt" then
      state.doing = "interrupting the code"
    elseif t == "final" and top then
      state.doing = "answered"
    elseif t == "run_end" and top then
      st.clear()
      return
    else
      return
    end
    st.draw()
  end

  return st
end

return M
