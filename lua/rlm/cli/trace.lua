-- --trace (docs/cli.md): the steps, their code, output and sub-calls, on
-- stderr as they happen, and the root model's text as it comes.
local printable = require("rlm.cli.printable")

local M = {}

-- Shortens s to about n characters for the trace.
local function clip(s, n)
  s = tostring(s or "")
  if #s > n then
    return s:sub(1, n) .. ("... [%d more bytes]"):format(#s - n)
  end
  return s
end

local function indent(s)
  return "  " .. s:gsub("\n$", ""):gsub("\n", "\n  ")
end

-- --trace: one readable paragraph per event on stderr; the root model's
-- text as it comes (root_delta), up to TRACE_CHARS a call.
function M.tracer(client, console)
  local TRACE_CHARS = 2000
  local streamed = {} -- session -> bytes of its root call's text shown so far
  -- An event that comes before the call's end (sandbox_ready, a nested
  -- session's) starts a line of its own (say ends the streamed one), and
  -- the text goes on indented under it.
  local function say(...)
    console:say(...)
  end
  return function(ev)
    local t = ev.type
    if t == "root_delta" then
      local shown = streamed[ev.session]
      if not shown then
        -- The status line stays off while the text comes a piece at a
        -- time: it would be drawn over the line's unfinished end.
        if console.live then
          console.live.pause()
        end
        say("-- root model:")
        shown = 0
      end
      local piece = ev.text:sub(1, math.max(0, TRACE_CHARS - shown))
      if piece ~= "" then
        io.stderr:write(console.stream_open and "" or "  ", (printable.text(piece):gsub("\n", "\n  ")))
        io.stderr:flush()
        console.stream_open = true
      end
      streamed[ev.session] = shown + #piece
    elseif t == "step_start" then
      say(("== step %d"):format(ev.step))
    elseif t == "root_response" and streamed[ev.session] then
      local shown = streamed[ev.session]
      streamed[ev.session] = nil
      if console.stream_open or #ev.response > shown then
        console.stream_open = false -- what follows ends the line
        say(#ev.response > shown and ("... [%d more bytes]"):format(#ev.response - shown) or "")
      end
      if console.live then
        console.live.resume()
      end
    elseif t == "root_response" then
      say("-- root model:\n", indent(clip(ev.response, TRACE_CHARS)))
    elseif t == "exec_result" then
      say(("-- code (block %d):\n"):format(ev.block or 1), indent(clip(ev.code, TRACE_CHARS)))
      if ev.stdout and ev.stdout ~= "" then
        say("-- output:\n", indent(clip(ev.stdout, TRACE_CHARS)))
      end
      if ev.error then
        say("-- error:\n", indent(clip(ev.error, TRACE_CHARS)))
      end
    elseif t == "sub_query" then
      say(("-- llm_query %d (%.0f ms):\n"):format(ev.index or 0, ev.latency_ms or 0),
        indent(clip(ev.prompt, 300)), "\n  =>\n", indent(clip(ev.response, 300)))
    elseif t == "final" then
      say("-- final answer (", tostring(ev.kind), ")")
    elseif t == "run_end" then
      local u = client.usage()
      local ok, usd = pcall(client.cost_usd)
      say(("== end: steps %d, sub-calls %d, tokens %d in and %d out%s"):format(
        ev.iterations or 0, ev.sub_calls or 0, u.input_tokens, u.output_tokens,
        ok and (", %.6f USD"):format(usd) or ""))
    elseif t ~= "session_start" then
      say("-- ", tostring(t))
    end
  end
end

return M
