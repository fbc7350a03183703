/* rlm_keeper.c: rlm-keeper, the far side of a byte stream (farside.h), as
 * one unit of static functions like rlm.core (csrc/rlm.c): the same driver,
 * spawn, sandbox, seccomp, watchdog, cgroup and canary code, without Lua.
 * The Makefile builds it as build/rlm-keeper. */
#define _GNU_SOURCE
#define RLM_PROGRAM 1

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
#include "jsonread.c"
#include "keeper.c"
#include "keeper_watchdog.c"
#include "plan.c"
#include "sandbox.c"
#include "seccomp.c"
#include "smallfile.c"
#include "spawn.c"
#include "uid.c"
#include "utf8.c"
#include "watchdog.c"
#include "workdir.c"

#include "farside_token.c"

#include "farside_attach.c"
#include "farside_checks.c"
#include "farside_linger.c"
#include "farside_listen.c"
#include "farside_probe.c"
#include "farside_relay.c"
#include "farside_seccomp.c"
#include "farside_start.c"

#include "farside.c"
