-- rlm, the command line (docs/cli.md): one session from the flags, run to
-- its end, its answer on stdout; or `rlm view LOG.jsonl`. bin/rlm runs
-- M.run and exits with the status it returns; a usage error or a failure
-- exits where it happens (rlm.cli.console).
local answer = require("rlm.cli.answer")
local args = require("rlm.cli.args")
local new_console = require("rlm.cli.console").new
local for_stdout = require("rlm.cli.console").for_stdout
local events = require("rlm.cli.events")
local journal = require("rlm.cli.journal")
local options = require("rlm.cli.options")
local usage = require("rlm.cli.usage")

local EXIT = usage.EXIT

local M = {}

local function view(positional, verbatim, console)
  if #positional ~= 1 then
    console:usage_error("rlm view wants one log file: rlm view LOG.jsonl > run.html")
  end
  local ok, viewer = pcall(require, "rlm.view")
  if not ok then
    console:failure("rlm view needs the rlm.view module: " .. tostring(viewer):match("^[^\n]*"))
  end
  local html = viewer.html(options.read_file(positional[1], {}, console))
  io.stdout:write(for_stdout(html, verbatim))
  io.stdout:flush()
  return EXIT.ok
end

-- The checks of the flags that need no model, no file and no session.
local function check(flags, positional, console)
  if #positional ~= 1 then
    console:usage_error(#positional == 0 and "no QUESTION given" or "one QUESTION only (quote it)")
  end
  if #flags.context == 0 then
    console:usage_error("no --context FILE given")
  end
  if flags.resume and not flags.journal then
    console:usage_error("--resume needs --journal DIR, the directory the run was journaled in")
  end
  if flags.resume and (#flags.resume > 64 or not flags.resume:find("^[%w_-]+$")) then
    console:usage_error(("--resume wants a session id as rlm printed it (1 to 64 of A-Z a-z 0-9 _ -), got %q")
      :format(flags.resume))
  end
end

local function main(argv, console)
  if argv[1] == "view" then
    local rest = {}
    for i = 2, #argv do
      rest[#rest + 1] = argv[i]
    end
    local flags, positional = args.parse(rest, console)
    if flags.help then
      io.stdout:write(usage.HELP)
      return EXIT.ok
    end
    return view(positional, flags.verbatim, console)
  end

  local flags, positional, given = args.parse(argv, console)
  if flags.help then
    io.stdout:write(usage.HELP)
    return EXIT.ok
  end
  if flags.version then
    print(usage.VERSION)
    return EXIT.ok
  end
  check(flags, positional, console)
  local cfg, client = options.client(flags, given, console)
  local opts = options.session(flags, positional, client, console)
  local log_writer = events.watch(flags, opts, client, console)
  local journaled = journal.open(flags, opts, console)

  local rlm = require("rlm")
  local ok, session, refused
  if flags.resume then
    ok, session, refused = pcall(rlm.Session.resume, flags.resume, opts)
  else
    ok, session = pcall(rlm.Session.new, opts)
  end
  if not ok then
    console:usage_error(args.option_error(tostring(session), given))
  end
  if not session then
    -- The journal has no such run (a wrong id, or one past its lifetime),
    -- another process holds it, or it was a run on other context.
    console:end_live()
    console:say(answer.error_line(refused, cfg.base_url))
    return answer.status(refused.kind)
  end
  if journaled then
    journaled:announce(session)
  end
  if console.live then
    console.live.draw()
  end
  local ran, result, err = pcall(session.run, session) -- blocking: no yield to cross
  session:close()
  console:end_live()
  if log_writer and log_writer.close then
    log_writer:close()
  end
  if not ran then
    -- Ctrl-C: the interpreter's "interrupted!", raised out of run() once the
    -- session is closed (docs/api.md, "SIGINT").
    if tostring(result):find("interrupted!$") then
      console:say(answer.error_line({ kind = "cancelled", message = "interrupted (SIGINT)" }, cfg.base_url))
      if journaled then
        journaled:kept(session)
      end
      return EXIT.cancelled
    end
    console:failure(tostring(result))
  end
  if not result then
    console:say(answer.error_line(err, cfg.base_url))
    if journaled then
      journaled:kept(session)
    end
    return answer.status(err.kind)
  end
  return answer.write(result, flags, console)
end

-- Runs the command line on argv (the script's arguments, a list); the
-- exit status. An error out of it (a bug) is a failure, with its traceback.
function M.run(argv)
  local console = new_console()
  local status
  local ok, err = xpcall(function()
    status = main(argv, console)
  end, debug.traceback)
  if not ok then
    console:failure(tostring(err))
  end
  return status
end

return M
