rockspec_format = "3.0"
package = "rlm-keeper"
version = "scm-1"
source = {
  url = "git+https://example.invalid/rlm.git",
}
description = {
  summary = "rlm-keeper: an rlm session's sandbox at the far end of a byte stream",
  detailed = [[
The command the exec backend of rlm (sandbox = { backend = "exec", ... })
starts at the far end of kubectl exec, podman exec or any other byte
stream: it runs the session's Python REPL under bubblewrap there (or, where
bubblewrap cannot run, its seccomp fallback) and speaks the stream protocol
on its stdin and stdout (docs/protocol.md, docs/backends.md). A program, not
a Lua module: luarocks' builtin backend builds no executables, so this rock
builds it with the project's Makefile. It needs libuv and python3 on the far
side, bubblewrap for its full sandbox; no Lua at run time.]],
  license = "MIT",
}
dependencies = {
  "lua >= 5.1", -- luarocks' own need: rlm-keeper runs no Lua
}
external_dependencies = {
  LIBUV = { header = "uv.h", library = "uv" },
}
-- make keeper-rock compiles csrc/rlm_keeper.c with the driver's directory
-- in this rock's own tree (luarocks deploys the binary to its bin/, apart
-- from it); make install-keeper puts the binary and the driver's files
-- there.
build = {
  type = "make",
  build_target = "keeper-rock",
  build_variables = {
    CFLAGS = "$(CFLAGS) -I$(LIBUV_INCDIR)",
    LDFLAGS = "-L$(LIBUV_LIBDIR)",
    KEEPER_SHARE = "$(PREFIX)/share/rlm-keeper",
  },
  install_target = "install-keeper",
  install_variables = {
    BINDIR = "$(BINDIR)",
    KEEPER_SHARE = "$(PREFIX)/share/rlm-keeper",
    KEEPER_BIN = "build/rock/rlm-keeper",
  },
}
