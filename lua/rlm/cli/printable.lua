-- Text for a person's terminal (docs/security.md, "Terminals and pages"):
-- what the model or the sandbox wrote, with nothing in it that a terminal
-- would act on or that reads in another order than it runs.
local M = {}

-- The bidirectional controls (embeddings, overrides, isolates, marks):
-- text that holds them reads in another order than its bytes run (Trojan
-- Source: code that shows one thing and does another).
local BIDI = {}
for _, cp in ipairs({ 0x061C, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E,
  0x2066, 0x2067, 0x2068, 0x2069 }) do
  local utf8 = cp < 0x800 and string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
    or string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  BIDI[utf8] = ("\\u%04x"):format(cp)
end

-- Text from the model or the sandbox made safe for a terminal: control
-- characters (C0 but newline and tab, DEL, C1 as U+0080-U+009F), the
-- bidirectional controls above and bytes that are not UTF-8 become visible
-- escapes (\x1b, \u009b, \u202e), so that no escape sequence (OSC 52
-- clipboard writes, titles, clear screen, cursor moves, a carriage return
-- over a line) reaches the terminal, and no text shows in another order
-- than it runs.
local function printable_run(run)
  local out, i, n = {}, 1, #run
  while i <= n do
    local b = run:byte(i)
    local len = b >= 0xF0 and b <= 0xF4 and 4 or b >= 0xE0 and b < 0xF0 and 3
      or b >= 0xC2 and b < 0xE0 and 2 or 0
    local seq = len > 0 and run:sub(i, i + len - 1) or ""
    local valid = len > 0 and #seq == len and not seq:find("[^\128-\191]", 2)
    if valid and len >= 3 then -- no overlong forms, surrogates or code points past U+10FFFF
      local b2 = seq:byte(2)
      valid = not (b == 0xE0 and b2 < 0xA0 or b == 0xED and b2 >= 0xA0
        or b == 0xF0 and b2 < 0x90 or b == 0xF4 and b2 >= 0x90)
    end
    if not valid then
      out[#out + 1] = ("\\x%02x"):format(b)
      i = i + 1
    elseif b == 0xC2 and seq:byte(2) < 0xA0 then
      out[#out + 1] = ("\\u%04x"):format(seq:byte(2))
      i = i + 2
    elseif BIDI[seq] then
      out[#out + 1] = BIDI[seq]
      i = i + len
    else
      out[#out + 1] = seq
      i = i + len
    end
  end
  return table.concat(out)
end

function M.text(s)
  s = s:gsub("%c", function(c)
    if c == "\n" or c == "\t" then
      return c
    end
    return ("\\x%02x"):format(c:byte())
  end)
  return (s:gsub("[\128-\255]+", printable_run))
end

return M
