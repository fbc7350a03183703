/* rlm.c: rlm.core as one unit of static functions, as luv builds: the
 * Makefile and the rockspec compile this file alone, and the shared object
 * exports luaopen_rlm_core and nothing else (spec/rockspec_spec.lua checks
 * both builds' dynamic symbols). Each file below keeps its own concern. */
#define _GNU_SOURCE

#include "base64.c"
#include "canary.c"
#include "cgroup.c"
#include "driver.c" /* with keeper.c, spawn.c, inspect.c: driver_impl.h */
#include "driver_connect.c"
#include "driver_end.c"
#include "driver_read.c"
#include "driver_write.c"
#include "expose.c"
#include "framing.c"
#include "inspect.c"
#include "interrupt.c"
#include "jsonscan.c"
#include "keeper.c"
#include "keeper_watchdog.c"
#include "plan.c"
#include "sandbox.c"
#include "seccomp.c"
#include "sha256.c"
#include "smallfile.c"
#include "spawn.c"
#include "uid.c"
#include "utf8.c"
#include "waitset.c"
#include "watchdog.c"
#include "workdir.c"

/* The Lua bindings (core.h), the module itself last: luaopen_rlm_core. */
#include "core_canaries.c"
#include "core_context.c"
#include "core_driver.c"
#include "core_hook.c"
#include "core_inspect.c"
#include "core_journal.c"
#include "core_spawn.c"
#include "core_stream.c"
#include "core_waitset.c"

#include "core.c"
