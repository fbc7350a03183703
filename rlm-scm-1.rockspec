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
-- The core needs no socket library: the model client (rlm.llm.openai)
-- takes a transport (OpenResty's cosockets, Neovim's, yours). Its LuaSocket
-- transport is here, as every file under lua/ (luarocks' builtin copies
-- lua/ whole), but loads LuaSocket only when it is required. The CLI, and
-- LuaSocket as a dependency, are the rock rlm-tools (rlm-tools-scm-1.rockspec).
dependencies = {
  "lua >= 5.1",
  "lua-cjson",
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
    ["rlm.base.checks"] = "lua/rlm/base/checks.lua",
    ["rlm.base.errors"] = "lua/rlm/base/errors.lua",
    ["rlm.base.events"] = "lua/rlm/base/events.lua",
    ["rlm.base.json"] = "lua/rlm/base/json.lua",
    ["rlm.base.protocol"] = "lua/rlm/base/protocol.lua",
    ["rlm.base.text"] = "lua/rlm/base/text.lua",
    ["rlm.base.util"] = "lua/rlm/base/util.lua",
    ["rlm.base.version"] = "lua/rlm/base/version.lua",
    ["rlm.diagnose"] = "lua/rlm/diagnose.lua",
    ["rlm.drive.blocking"] = "lua/rlm/drive/blocking.lua",
    ["rlm.drive.dispatch"] = "lua/rlm/drive/dispatch.lua",
    ["rlm.engine.answer"] = "lua/rlm/engine/answer.lua",
    ["rlm.engine.boot"] = "lua/rlm/engine/boot.lua",
    ["rlm.engine.budgets"] = "lua/rlm/engine/budgets.lua",
    ["rlm.engine.cache"] = "lua/rlm/engine/cache.lua",
    ["rlm.engine.calls"] = "lua/rlm/engine/calls.lua",
    ["rlm.engine.claim"] = "lua/rlm/engine/claim.lua",
    ["rlm.engine.clock"] = "lua/rlm/engine/clock.lua",
    ["rlm.engine.compact"] = "lua/rlm/engine/compact.lua",
    ["rlm.engine.fallback"] = "lua/rlm/engine/fallback.lua",
    ["rlm.engine.finals"] = "lua/rlm/engine/finals.lua",
    ["rlm.engine.handle"] = "lua/rlm/engine/handle.lua",
    ["rlm.engine.loop"] = "lua/rlm/engine/loop.lua",
    ["rlm.engine.nested"] = "lua/rlm/engine/nested.lua",
    ["rlm.engine.opening"] = "lua/rlm/engine/opening.lua",
    ["rlm.engine.options"] = "lua/rlm/engine/options.lua",
    ["rlm.engine.prompt"] = "lua/rlm/engine/prompt.lua",
    ["rlm.engine.reasoning"] = "lua/rlm/engine/reasoning.lua",
    ["rlm.engine.reply"] = "lua/rlm/engine/reply.lua",
    ["rlm.engine.session"] = "lua/rlm/engine/session.lua",
    ["rlm.engine.subcalls"] = "lua/rlm/engine/subcalls.lua",
    ["rlm.engine.tools"] = "lua/rlm/engine/tools.lua",
    ["rlm.engine.turn"] = "lua/rlm/engine/turn.lua",
    ["rlm.health"] = "lua/rlm/health.lua",
    ["rlm.journal"] = "lua/rlm/journal/init.lua",
    ["rlm.journal.file"] = "lua/rlm/journal/file.lua",
    ["rlm.journal.lease"] = "lua/rlm/journal/lease.lua",
    ["rlm.journal.record"] = "lua/rlm/journal/record.lua",
    ["rlm.journal.redis"] = "lua/rlm/journal/redis.lua",
    ["rlm.journal.store"] = "lua/rlm/journal/store.lua",
    ["rlm.llm.anthropic"] = "lua/rlm/llm/anthropic.lua",
    ["rlm.llm.client"] = "lua/rlm/llm/client.lua",
    ["rlm.llm.config"] = "lua/rlm/llm/config.lua",
    ["rlm.llm.gemini"] = "lua/rlm/llm/gemini.lua",
    ["rlm.llm.openai"] = "lua/rlm/llm/openai.lua",
    ["rlm.llm.retry"] = "lua/rlm/llm/retry.lua",
    ["rlm.llm.settings"] = "lua/rlm/llm/settings.lua",
    ["rlm.llm.sse"] = "lua/rlm/llm/sse.lua",
    ["rlm.llm.stream"] = "lua/rlm/llm/stream.lua",
    ["rlm.llm.usage"] = "lua/rlm/llm/usage.lua",
    ["rlm.llm.transport.http1"] = "lua/rlm/llm/transport/http1.lua",
    ["rlm.llm.transport.luasocket"] = "lua/rlm/llm/transport/luasocket.lua",
    ["rlm.llm.transport.luasocket_loop"] = "lua/rlm/llm/transport/luasocket_loop.lua",
    ["rlm.llm.transport.nvim"] = "lua/rlm/llm/transport/nvim.lua",
    ["rlm.llm.transport.resty"] = "lua/rlm/llm/transport/resty.lua",
    ["rlm.log"] = "lua/rlm/log.lua",
    ["rlm.nvim"] = "lua/rlm/nvim.lua",
    ["rlm.nvim.buffers"] = "lua/rlm/nvim/buffers.lua",
    ["rlm.nvim.ui"] = "lua/rlm/nvim/ui.lua",
    ["rlm.sandbox.backend"] = "lua/rlm/sandbox/backend.lua",
    ["rlm.sandbox.bwrap"] = "lua/rlm/sandbox/bwrap.lua",
    ["rlm.sandbox.claim"] = "lua/rlm/sandbox/claim.lua",
    ["rlm.sandbox.container"] = "lua/rlm/sandbox/container.lua",
    ["rlm.sandbox.container_names"] = "lua/rlm/sandbox/container_names.lua",
    ["rlm.sandbox.exec"] = "lua/rlm/sandbox/exec.lua",
    ["rlm.sandbox.linger"] = "lua/rlm/sandbox/linger.lua",
    ["rlm.sandbox.pool"] = "lua/rlm/sandbox/pool.lua",
    ["rlm.sandbox.probe"] = "lua/rlm/sandbox/probe.lua",
    ["rlm.sandbox.selftest"] = "lua/rlm/sandbox/selftest.lua",
    ["rlm.sandbox.shape"] = "lua/rlm/sandbox/shape.lua",
    ["rlm.sandbox.start"] = "lua/rlm/sandbox/start.lua",
    ["rlm.sandbox.stream"] = "lua/rlm/sandbox/stream.lua",
    ["rlm.tools.highlight"] = "lua/rlm/tools/highlight.lua",
    ["rlm.tools.logline"] = "lua/rlm/tools/logline.lua",
    ["rlm.tools.status"] = "lua/rlm/tools/status.lua",
    ["rlm.view"] = "lua/rlm/view.lua",
    ["rlm.core"] = {
      -- One unit that includes every other C file: its functions are all
      -- static, and the module exports luaopen_rlm_core alone.
      sources = { "csrc/rlm.c" },
      libraries = { "uv", "pthread" },
      incdirs = { "$(LIBUV_INCDIR)" },
      libdirs = { "$(LIBUV_LIBDIR)" },
    },
  },
  install = {
    lua = {
      ["rlm.repl_driver"] = "python/repl_driver.py",
      ["rlm._rlm_driver.__init__"] = "python/_rlm_driver/__init__.py",
      ["rlm._rlm_driver.api"] = "python/_rlm_driver/api.py",
      ["rlm._rlm_driver.codec"] = "python/_rlm_driver/codec.py",
      ["rlm._rlm_driver.guard"] = "python/_rlm_driver/guard.py",
      ["rlm._rlm_driver.loader"] = "python/_rlm_driver/loader.py",
      ["rlm._rlm_driver.main"] = "python/_rlm_driver/main.py",
      ["rlm._rlm_driver.prose"] = "python/_rlm_driver/prose.py",
      ["rlm._rlm_driver.protocol"] = "python/_rlm_driver/protocol.py",
      ["rlm._rlm_driver.screen"] = "python/_rlm_driver/screen.py",
      ["rlm._rlm_driver.selftest"] = "python/_rlm_driver/selftest.py",
      ["rlm._rlm_driver.shield"] = "python/_rlm_driver/shield.py",
      ["rlm._rlm_driver.state"] = "python/_rlm_driver/state.py",
      ["rlm._rlm_driver.step"] = "python/_rlm_driver/step.py",
      ["rlm._rlm_driver.tools"] = "python/_rlm_driver/tools.py",
      ["rlm._rlm_driver.tree"] = "python/_rlm_driver/tree.py",
      ["rlm.probe"] = "python/probe.py",
      ["rlm.macos"] = "sandbox/macos.sb",
      -- the container backends' seccomp profile (rlm.sandbox.container)
      ["rlm.rlm-seccomp"] = "sandbox/rlm-seccomp.json",
    },
  },
}
