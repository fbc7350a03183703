-- rlm.llm.retry: whether a failed model call is tried again, and how long
-- it waits first. The statuses are the ones the official OpenAI and
-- Anthropic SDKs retry; the wait is what the reply asks for, else full
-- jitter (AWS's "Exponential Backoff And Jitter": a uniform draw from zero
-- to the exponential bound), so that the calls of a batch that hit a 429
-- together do not come back together.
local M = {}

-- 408 Request Timeout, 409 Conflict (a lock), 429 Too Many Requests and
-- every 5xx (Anthropic's 529 overloaded among them).
function M.retryable_status(status)
  return status == 408 or status == 409 or status == 429 or status >= 500
end

-- Whether a reply with status and headers (lower-case names) is retried:
-- an `x-should-retry` header of "true" or "false" (both APIs send it; the
-- SDKs obey it) says so, else the status.
function M.should_retry(status, headers)
  local say = headers["x-should-retry"]
  if say == "true" then
    return true
  elseif say == "false" then
    return false
  end
  return M.retryable_status(status)
end

local MONTHS = { jan = 1, feb = 2, mar = 3, apr = 4, may = 5, jun = 6, jul = 7, aug = 8, sep = 9, oct = 10,
  nov = 11, dec = 12 }

-- Days from 1970-01-01 to the proleptic Gregorian date y-m-d (the civil
-- calendar counted in 400-year eras of 146097 days, from 1 March so that
-- the leap day ends a year).
local function days_from_civil(y, m, d)
  if m <= 2 then
    y = y - 1
  end
  local era = math.floor(y / 400)
  local year_of_era = y - era * 400
  local day_of_year = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  local day_of_era = year_of_era * 365 + math.floor(year_of_era / 4) - math.floor(year_of_era / 100) + day_of_year
  return era * 146097 + day_of_era - 719468
end

-- Seconds since the epoch for an HTTP date, or nil: RFC 9110's
-- IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT") and the two obsolete forms
-- a recipient must read (RFC 850's "Sunday, 06-Nov-94 08:49:37 GMT" and
-- asctime's "Sun Nov  6 08:49:37 1994").
function M.http_date(s)
  if type(s) ~= "string" then
    return nil
  end
  local d, mon, y, hh, mm, ss = s:match("^%a+, (%d%d) (%a%a%a) (%d%d%d%d) (%d%d):(%d%d):(%d%d) GMT$")
  if not d then
    d, mon, y, hh, mm, ss = s:match("^%a+, (%d%d)%-(%a%a%a)%-(%d%d) (%d%d):(%d%d):(%d%d) GMT$")
    if y then
      -- RFC 9110: a two-digit year more than 50 years ahead is in the past century.
      y = tonumber(y) + 2000
      if y > tonumber(os.date("!%Y")) + 50 then
        y = y - 100
      end
    end
  end
  if not d then
    mon, d, hh, mm, ss, y = s:match("^%a+ (%a%a%a) +(%d%d?) (%d%d):(%d%d):(%d%d) (%d%d%d%d)$")
  end
  local m = mon and MONTHS[mon:lower()]
  if not m then
    return nil
  end
  d, y, hh, mm, ss = tonumber(d), tonumber(y), tonumber(hh), tonumber(mm), tonumber(ss)
  if d < 1 or d > 31 or hh > 23 or mm > 59 or ss > 60 then
    return nil
  end
  return days_from_civil(y, m, d) * 86400 + hh * 3600 + mm * 60 + ss
end

-- The wait in ms a reply asks for, or nil: OpenAI's `retry-after-ms`,
-- else `Retry-After` in seconds or as an HTTP date (from now, the epoch
-- seconds of the wall clock; a date past is no wait).
function M.asked_ms(headers, now)
  local ms = tonumber(headers["retry-after-ms"] or "")
  if ms and ms >= 0 and ms < math.huge then
    return ms
  end
  local value = headers["retry-after"]
  local s = tonumber(value or "")
  if s and s >= 0 and s < math.huge then
    return s * 1000
  end
  local at = M.http_date(value)
  if at then
    return math.max(0, at - (now or os.time())) * 1000
  end
  return nil
end

-- The wait before retry number `attempt` (0 for the first), in ms: what
-- the reply asked for (asked, or nil), capped at o.retry_max_ms; else a
-- draw from 0 to min(retry_max_ms, retry_base_ms * 2^attempt), or that
-- bound itself with o.jitter false. random() returns a number in [0, 1).
function M.wait_ms(attempt, asked, o, random)
  if asked then
    return math.min(asked, o.retry_max_ms)
  end
  local bound = math.min(o.retry_max_ms, o.retry_base_ms * 2 ^ attempt)
  if not o.jitter then
    return bound
  end
  return bound * random()
end

return M
