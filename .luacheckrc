-- luacheck: the code must run on Lua 5.1 and LuaJIT too.
std = "lua51"
max_line_length = 120
-- Specs hold Python code and attack cases as data rows, one a line.
files["spec"] = { std = "+busted", max_line_length = false }
