-- Where the plugin's runs keep their journal (docs/durability.md), and
-- which run was the last, for :RlmResume after a restart: the directory
-- stdpath("state")/rlm-journal (rlm.journal.file makes it 0700 and refuses
-- one that is not this user's alone), the last run in its entry
-- "nvim-last": its id, question, what it was about, and its context, so
-- that a run about a buffer goes on when the buffer is gone.
-- luacheck: read globals vim
local errors = require("rlm.base.errors")

local M = {}

M.LAST_KEY = "nvim-last"

-- stdpath("state") (Neovim 0.8 and later); before, what it would be:
-- $XDG_STATE_HOME/nvim, else ~/.local/state/nvim.
function M.state_dir()
  local ok, dir = pcall(vim.fn.stdpath, "state")
  if ok and type(dir) == "string" and dir ~= "" then
    return dir
  end
  local xdg = os.getenv("XDG_STATE_HOME")
  if not xdg or xdg == "" then
    xdg = (os.getenv("HOME") or "") .. "/.local/state"
  end
  return xdg .. "/nvim"
end

-- The store for the plugin's journal option (true: the state directory's
-- rlm-journal; a string: that directory), and its directory; nil for
-- false. Raises one line when the directory cannot be used.
function M.store(option)
  if option == false then
    return nil
  end
  local dir = option == true and (M.state_dir() .. "/rlm-journal") or option
  vim.fn.mkdir(vim.fn.fnamemodify(dir, ":h"), "p")
  local store, why = require("rlm.journal").file(dir)
  if not store then
    error(("rlm: the journal in %s: %s"):format(dir, tostring(why)), 0)
  end
  return store, dir
end

-- A store call that raises or returns nil, message: its value, or nil.
local function call(store, method, ...)
  local ok, value = pcall(store[method], store, ...)
  if ok then
    return value
  end
end

-- Remembers run ({ id, question, what, context }) as the last one. A
-- context past the store's largest value is left out: the resume then
-- goes on without it.
function M.remember(store, run)
  if not call(store, "set", M.LAST_KEY, vim.fn.json_encode(run)) then
    run.context = nil
    call(store, "set", M.LAST_KEY, vim.fn.json_encode(run))
  end
end

-- The last run remembered, or nil.
function M.last(store)
  local text = call(store, "get", M.LAST_KEY)
  local ok, run = pcall(vim.fn.json_decode, text or "")
  if ok and type(run) == "table" and type(run.id) == "string" then
    return run
  end
end

-- Forgets the last run when it is run id (it finished, or was cancelled).
function M.forget(store, id)
  local run = M.last(store)
  if run and run.id == id then
    call(store, "delete", M.LAST_KEY)
  end
end

-- The owner of a run's lease: this editor, named so that a second one's
-- refusal says who holds the run, and that a resume after it was killed
-- can tell it is gone (rlm.journal.owner); without /proc, by host and pid.
function M.owner()
  return require("rlm.journal.owner").name("nvim")
    or ("nvim-%s-%d"):format((vim.uv or vim.loop).os_gethostname(), vim.fn.getpid())
end

-- Before a resume: the lease of an editor of this machine that is gone
-- (killed, or crashed: nothing renews it, yet it would live its 30 s out)
-- is let go at once. A live editor's, or another machine's, is left to
-- the resume to report, as is an id that is none.
function M.release_if_gone(store, id)
  pcall(require("rlm.journal.owner").release_if_gone, store, id)
end

-- A resume's refusal as one line: another editor holds the run (the
-- engine's message names the run and an epoch; this fits a line).
function M.held_line(err)
  if type(err) == "table" and err.kind == "lease_held" then
    local left = err.expires and (" for %d s more"):format(math.max(0, err.expires - os.time())) or ""
    return errors.new("lease_held", ("%s holds it%s; :RlmResume later"):format(tostring(err.owner), left),
      { owner = err.owner })
  end
  return err
end

return M
