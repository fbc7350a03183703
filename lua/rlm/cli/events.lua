-- What a run shows and records as it goes, each an on_event handler: the
-- status line (on a terminal), the trace (--trace) and the log (--log).
local is_terminal = require("rlm.cli.console").is_terminal
local columns = require("rlm.cli.console").columns
local trace = require("rlm.cli.trace")

local M = {}

-- The status line: on a terminal (stderr), unless --quiet. It is drawn
-- as each model call starts and at each event; the console holds it.
local function status_line(opts, client, console)
  local now_ms = require("rlm.core").now_ms
  local status = require("rlm.tools.status").new({
    write = function(text)
      io.stderr:write(text)
      io.stderr:flush()
    end,
    clock = function()
      return now_ms() / 1000
    end,
    usage = client.usage,
    cost = client.has_price(client.model) and client.has_price(client.sub_model) and client.cost_usd or nil,
    steps = opts.max_iterations or 20,
    width = columns(),
  })
  local root_llm, llm_query = opts.root_llm, opts.llm_query
  opts.root_llm = function(...)
    status.phase("root")
    return root_llm(...)
  end
  opts.llm_query = function(...)
    status.phase("sub")
    return llm_query(...)
  end
  console.live = status
  return status.event
end

-- Sets opts.on_event to the handlers the flags ask for; the log's writer,
-- to close after the run, or nil.
function M.watch(flags, opts, client, console)
  local handlers, log_writer = {}, nil
  if not flags.quiet and is_terminal(2) then
    handlers[#handlers + 1] = status_line(opts, client, console)
  end
  if flags.trace then
    handlers[#handlers + 1] = trace.tracer(client, console)
  end
  if flags.log then
    local has_log, log = pcall(require, "rlm.log")
    if not has_log then
      console:failure("--log needs the rlm.log module: " .. tostring(log):match("^[^\n]*"))
    end
    local on_event, writer = log.jsonl(flags.log, { cost_usd = client.cost_usd })
    if not on_event then
      console:failure("cannot write the log: " .. tostring(writer))
    end
    handlers[#handlers + 1] = on_event
    log_writer = writer
  end
  if #handlers > 0 then
    opts.on_event = function(ev)
      for _, h in ipairs(handlers) do
        h(ev)
      end
    end
  end
  return log_writer
end

return M
