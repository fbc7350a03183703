-- --journal DIR and --resume ID (docs/durability.md): the run's journal
-- opened, and the lines that tell a person how to finish a run that is
-- killed or fails.
local EXIT = require("rlm.cli.usage").EXIT

local M = {}

-- --journal DIR: the file store (docs/durability.md) in DIR, made absolute
-- (the store takes no relative path, and the resume line printed at the
-- start must work from anywhere); a DIR it refuses (another user's, one
-- others may write, not a directory) ends the run before it starts.
local function open_store(dir, console)
  if dir:sub(1, 1) ~= "/" then
    local p = io.popen("pwd -P")
    local cwd = p and p:read("*l")
    if p then
      p:close()
    end
    if not cwd or cwd:sub(1, 1) ~= "/" then
      console:failure("--journal " .. dir .. ": cannot tell the current directory")
    end
    dir = (cwd:gsub("/$", "")) .. "/" .. dir:gsub("^%./", "")
  end
  local store, why = require("rlm.journal").file(dir)
  if not store then
    console:say(("rlm: journal_error: --journal %s: %s (exit %d)"):format(dir, tostring(why), EXIT.journal_error))
    os.exit(EXIT.journal_error)
  end
  return store, dir
end

-- --journal's lease owner: this process, named so that a person knows it
-- (docs/durability.md asks a unique name: pid, machine, boot, start) and a
-- later rlm of this machine can tell that it is gone (rlm.journal.owner).
-- nil without /proc (the engine names the owner then).
local function lease_owner()
  return require("rlm.journal.owner").name("rlm")
end

-- A word for a command line that a person copies: as it is when the shell
-- reads it so, else quoted.
local function shell_word(word)
  if word:find("^[%w_./:@%%+,=-]+$") then
    return word
  end
  return require("rlm.base.util").shell_quote(word)
end

---@class CliJournal
---@field store table the file store in dir
---@field dir string --journal DIR, made absolute
---@field resuming boolean --resume ID was given
---@field console Console
local CliJournal = {}
CliJournal.__index = CliJournal

-- The journal of a run with --journal, its store in opts.journal (and for
-- --resume ID, ID's lease let go of if its holder is a process of this
-- machine that is gone); nil without --journal.
function M.open(flags, opts, console)
  if not flags.journal then
    return nil
  end
  local store, dir = open_store(flags.journal, console)
  if flags.resume then
    -- a lease whose holder is a process of this machine that is gone
    -- (killed: nothing renews it, yet it would live its 30 s out) is let
    -- go at once; a live one's, or another machine's, is left to
    -- Session.resume to report (a store's failure too)
    require("rlm.journal.owner").release_if_gone(store, flags.resume)
  end
  opts.journal = { store = store, owner = lease_owner() }
  return setmetatable({ store = store, dir = dir, resuming = flags.resume ~= nil, console = console }, CliJournal)
end

-- One line, as a new run starts: all a person needs to finish it.
function CliJournal:announce(session)
  local id = not self.resuming and session:journal_id()
  if id then
    self.console:say(("rlm: journal: session %s; if this run is killed, finish it with: rlm --resume %s --journal %s "
      .. "and the same --context files, QUESTION and flags"):format(id, id, shell_word(self.dir)))
  end
end

-- A run that failed (Ctrl-C, the endpoint down, a budget) keeps its
-- journal, its lease let go (docs/durability.md): the line to finish it,
-- said after the error's, while the journal still holds the run.
function CliJournal:kept(session)
  local id = session:journal_id()
  local store = self.store
  local read, head = pcall(function()
    return id and store:get(id .. ".head")
  end)
  if read and head ~= nil then
    self.console:say(("rlm: journal: session %s kept; finish it with: rlm --resume %s --journal %s and the same "
      .. "--context files, QUESTION and flags"):format(id, id, shell_word(self.dir)))
  end
end

return M
