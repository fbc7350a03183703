-- rlm.nvim.buffers: what rlm.nvim lets the model read from the editor: the
-- files of the argument list as one context, and the host tools
-- list_buffers() and read_buffer(name) (docs/adapters.md). Each takes the
-- most it may read, max_context_bytes.
-- luacheck: read globals vim
local M = {}

-- The context of a list of files: each under a "=== path ===" line.
function M.files_context(paths, max)
  local parts, size = {}, 0
  for _, path in ipairs(paths) do
    local f, err = io.open(path, "rb")
    if not f then
      error("rlm: cannot read " .. tostring(err), 0)
    end
    local text = f:read("*a")
    f:close()
    size = size + #text
    if size > max then
      error(("rlm: the files add up to more than max_context_bytes (%d)"):format(max), 0)
    end
    parts[#parts + 1] = ("=== %s ===\n%s"):format(path, text)
  end
  return table.concat(parts, "\n")
end

-- The loaded buffers that have a name: { { buf =, name = }, ... }.
local function named_buffers()
  local out = {}
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    local name = vim.api.nvim_buf_is_loaded(b) and vim.api.nvim_buf_get_name(b) or ""
    if name ~= "" and not name:match("^rlm://") then
      out[#out + 1] = { buf = b, name = name }
    end
  end
  return out
end

-- The host tools (they run through vim.schedule, where the editor's API
-- may be called); max() is the most read_buffer returns, read at each call.
function M.tools(max)
  return {
    list_buffers = {
      doc = "list_buffers(): the names of the editor's open buffers, a list of str",
      call = function()
        local names = {}
        for i, b in ipairs(named_buffers()) do
          names[i] = b.name
        end
        return names
      end,
    },
    read_buffer = {
      doc = "read_buffer(name): the text of an open buffer, by its name or the end of its path "
        .. "(e.g. 'main.c'), as a str",
      call = function(want, kw)
        want = want or kw and kw.name
        if type(want) ~= "string" or want == "" then
          error("read_buffer(name) takes a buffer's name as a str", 0)
        end
        local found
        for _, b in ipairs(named_buffers()) do
          local n = b.name
          if n == want or (#n > #want and n:sub(-#want - 1) == "/" .. want) then
            if found then
              error(("%q names more than one buffer (%s, %s): give more of the path")
                :format(want, found.name, n), 0)
            end
            found = b
          end
        end
        if not found then
          error(("no open buffer is named %q (list_buffers() lists them)"):format(want), 0)
        end
        local text = table.concat(vim.api.nvim_buf_get_lines(found.buf, 0, -1, false), "\n")
        if #text > max() then
          error(("buffer %q is larger than max_context_bytes (%d)"):format(want, max()), 0)
        end
        return text
      end,
    },
  }
end

return M
