rockspec_format = "3.0"
package = "rlm"
version = "scm-1"
source = {
  url = "git+https://example.invalid/rlm.git",
}
description = {
  summary = "Recursive Language Model sessions for Lua, with a sandboxed Python REPL",
  detailed = [[
A root LLM answers questions about inputs far larger than its context window:
the input sits in a Python REPL inside a bubblewrap sandbox, the model writes
code to read it, and code may call sub-LLMs. The C core (libuv) owns the
sandbox, the pipes and the limits; your Lua callbacks own the models.]],
  license = "MIT",
}
dependencies = {
  "lua >= 5.1",
  "lua-cjson",
  "luasocket", -- the HTTP transport of rlm.llm.openai and bin/rlm; https also needs luasec
}
external_dependencies = {
  LIBUV = { header = "uv.h", library = "uv" },
}
build = {
  type = "builtin",
  modules = {
    ["rlm"] = "lua/rlm/init.lua",
    ["rlm.adapters.luv"] = "lua/rlm/adapters/luv.lua",
    ["rlm.adapters.nvim"] = "lua/rlm/adapters/nvim.lua",
    ["rlm.adapters.resty"] = "lua/rlm/adapters/resty.lua",
    ["rlm.async"] = "lua/rlm/async.lua",
    ["rlm.blocking"] = "lua/rlm/blocking.lua",
    ["rlm.boot"] = "lua/rlm/boot.lua",
    ["rlm.diagnose"] = "lua/rlm/diagnose.lua",
    ["rlm.dispatch"] = "lua/rlm/dispatch.lua",
    ["rlm.engine"] = "lua/rlm/engine.lua",
    ["rlm.errors"] = "lua/rlm/errors.lua",
    ["rlm.health"] = "lua/rlm/health.lua",
    ["rlm.limits"] = "lua/rlm/limits.lua",
    ["rlm.llm.openai"] = "lua/rlm/llm/openai.lua",
    ["rlm.llm.transport.luasocket"] = "lua/rlm/llm/transport/luasocket.lua",
    ["rlm.llm.transport.nvim"] = "lua/rlm/llm/transport/nvim.lua",
    ["rlm.llm.transport.resty"] = "lua/rlm/llm/transport/resty.lua",
    ["rlm.log"] = "lua/rlm/log.lua",
    ["rlm.nested"] = "lua/rlm/nested.lua",
    ["rlm.nvim"] = "lua/rlm/nvim.lua",
    ["rlm.options"] = "lua/rlm/options.lua",
    ["rlm.prompt"] = "lua/rlm/prompt.lua",
    ["rlm.protocol"] = "lua/rlm/protocol.lua",
    ["rlm.sandbox"] = "lua/rlm/sandbox.lua",
    ["rlm.selftest"] = "lua/rlm/selftest.lua",
    ["rlm.session"] = "lua/rlm/session.lua",
    ["rlm.subcalls"] = "lua/rlm/subcalls.lua",
    ["rlm.text"] = "lua/rlm/text.lua",
    ["rlm.turn"] = "lua/rlm/turn.lua",
    ["rlm.util"] = "lua/rlm/util.lua",
    ["rlm.view"] = "lua/rlm/view.lua",
    ["rlm.wire"] = "lua/rlm/wire.lua",
    ["rlm.core"] = {
      sources = {
        "csrc/canary.c", "csrc/cgroup.c", "csrc/core.c", "csrc/driver.c", "csrc/framing.c",
        "csrc/sandbox.c", "csrc/seccomp.c", "csrc/smallfile.c", "csrc/uid.c",
        "csrc/waitset.c", "csrc/watchdog.c", "csrc/workdir.c",
      },
      libraries = { "uv", "pthread" },
      incdirs = { "$(LIBUV_INCDIR)" },
      libdirs = { "$(LIBUV_LIBDIR)" },
    },
  },
  install = {
    bin = {
      ["rlm"] = "bin/rlm",
    },
    lua = {
      ["rlm.repl_driver"] = "python/repl_driver.py",
      ["rlm.probe"] = "python/probe.py",
      ["rlm.macos"] = "sandbox/macos.sb",
    },
  },
}
