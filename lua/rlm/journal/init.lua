-- rlm.journal: a session's journal, so that a run can be picked up again
-- (docs/durability.md). This is its foundation: the store seam, the two
-- stores rlm ships, the lease with its fencing number, and the records.
--
--   rlm.journal.file(dir[, opts])      -> store | nil, message
--   rlm.journal.redis(client[, opts])  -> store
--   rlm.journal.lease(store, id, owner[, opts]) -> Lease | nil, err
--   rlm.journal.check(store)           raises unless store has the methods
--   rlm.journal.encode(kind, t), rlm.journal.decode(kind, text)
--   rlm.journal.head_key(id), .step_key(id, n), .call_key(id, n, k)
local store = require("rlm.journal.store")
local lease = require("rlm.journal.lease")
local record = require("rlm.journal.record")

local M = {}

M.file = require("rlm.journal.file").new
M.redis = require("rlm.journal.redis").new
M.lease = lease.acquire

function M.check(s)
  store.check(s)
end

M.encode = record.encode
M.decode = record.decode
M.head_key = record.head_key
M.step_key = record.step_key
M.call_key = record.call_key
M.VERSION = record.VERSION

return M
