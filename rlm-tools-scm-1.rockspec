rockspec_format = "3.0"
package = "rlm-tools"
version = "scm-1"
source = {
  url = "git+https://example.invalid/rlm.git",
}
description = {
  summary = "The rlm command line, with LuaSocket for rlm's model client",
  detailed = [[
bin/rlm: ask a question about a file or stdin through an OpenAI-compatible
endpoint, view a session's log. It brings LuaSocket, which the runtime (the
rock rlm) does not need: rlm.llm.transport.luasocket, the blocking HTTP
transport of scripts and the CLI, ships with rlm and loads LuaSocket only
when it is used; https also needs LuaSec.]],
  license = "MIT",
}
dependencies = {
  "lua >= 5.1",
  "rlm",
  "luasocket", -- https also needs luasec (optional: http:// works without it)
}
-- Nothing to build: the modules are rlm's. ("builtin" would copy lua/
-- again, and the two rocks would own the same files.)
build = {
  type = "none",
  install = {
    bin = {
      ["rlm"] = "bin/rlm",
    },
  },
}
