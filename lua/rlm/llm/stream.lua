-- rlm.llm.stream: a streamed reply as it comes, for rlm.llm.client: the
-- body's server-sent events (rlm.llm.sse) read by the provider, each piece
-- of text passed on to the session as it comes, the whole kept bounded.
local sse = require("rlm.llm.sse")

local M = {}

-- The most bytes a streamed reply may bring.
M.MAX_STREAM_BYTES = 32 * 2 ^ 20

-- reader(provider, delta) -> r: the provider's stream_event reads each
-- event; each piece of text goes to delta(text) (a false return or a raise
-- stops the stream). r.feed(piece) is the request's on_chunk; r.finish()
-- says how it ended; r.sent counts the bytes of text passed on, r.abort
-- says why the stream was stopped for good (never retried), and
-- r.stream_error what an error event of the API said.
function M.reader(provider, delta)
  local r = { sent = 0, bytes = 0, parts = {}, state = {}, raw = {} }
  local parser
  parser = sse.new(function(name, data)
    r.raw = nil -- an event stream: no need to keep the bytes whole
    local text, err = provider.stream_event(r.state, name, data)
    if err then
      r.stream_error = err
      return nil, err
    end
    if text and text ~= "" then
      r.parts[#r.parts + 1] = text
      r.sent = r.sent + #text
      if delta then
        local ok, wanted = pcall(delta, text)
        if not ok or wanted == false then
          r.abort = ok and "the session no longer wants this reply" or ("the delta callback raised: "
            .. tostring(wanted))
          return nil, r.abort
        end
      end
    end
    return true
  end)
  function r.feed(piece)
    r.bytes = r.bytes + #piece
    if r.bytes > M.MAX_STREAM_BYTES then
      r.abort = ("the streamed reply is longer than %d bytes"):format(M.MAX_STREAM_BYTES)
      return nil, r.abort
    end
    if r.raw then
      r.raw[#r.raw + 1] = piece
    end
    local ok, err = parser:feed(piece)
    if not ok then
      r.abort = r.abort or (not r.stream_error and err) or nil
      return nil, err
    end
    return true
  end
  -- text, usage when the stream ended as its API ends one; nil, why when
  -- it was cut; nil, nil, body when the reply was no event stream at all
  -- (a server that ignored "stream"), to be read as a whole reply.
  function r.finish(rest)
    if type(rest) == "string" and rest ~= "" then
      local ok, err = r.feed(rest) -- a transport that does not stream gave the body whole
      if not ok then
        return nil, err
      end
    end
    if r.state.done then
      return table.concat(r.parts), r.state.usage
    elseif r.raw and r.raw[1] then
      return nil, nil, table.concat(r.raw)
    end
    return nil, ("the stream was cut before its end (after %d bytes, %d of text)"):format(r.bytes, r.sent)
  end
  return r
end

return M
