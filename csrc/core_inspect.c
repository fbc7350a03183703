/* core_inspect.c: what a Driver tells of its sandbox, for the host's
 * checks and bench/: its pid and whether it runs, its processes and the
 * descriptors they hold (inspect.c), its memory cgroup and peak, the uid it
 * runs as and when its start's steps came. */
#define _GNU_SOURCE
#include "core.h"
#include "driver.h"

#include <limits.h>

static int driver_adopt(lua_State *L) {
  lua_pushboolean(L, rlm_driver_adopt(check_driver(L)->d) == 0);
  return 1;
}

static int driver_memory_mechanism(lua_State *L) {
  lua_pushstring(L, rlm_driver_memory_mechanism(check_driver(L)->d));
  return 1;
}

/* d:oom_kills() -> n, peak_bytes: the kernel's OOM kills in the cgroup. */
static int driver_oom_kills(lua_State *L) {
  uint64_t peak;
  lua_pushnumber(L,
                 (lua_Number)rlm_driver_oom_kills(check_driver(L)->d, &peak));
  lua_pushnumber(L, (lua_Number)peak);
  return 2;
}

static int driver_pid(lua_State *L) {
  lua_pushinteger(L, rlm_driver_pid(check_driver(L)->d));
  return 1;
}

static int driver_alive(lua_State *L) {
  lua_pushboolean(L, rlm_driver_alive(check_driver(L)->d));
  return 1;
}

/* d:tree() -> { pid, ... }: the sandbox's processes, launcher first. */
static int driver_tree(lua_State *L) {
  driver_ud *u = check_driver(L);
  int pids[256];
  size_t n = rlm_driver_tree(u->d, pids, 256);
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushinteger(L, pids[i]);
    lua_rawseti(L, -2, (int)i + 1);
  }
  return 1;
}

/* d:interpreter_runs() -> boolean: whether the driver's interpreter runs. */
static int driver_interpreter_runs(lua_State *L) {
  lua_pushboolean(L, rlm_driver_interpreter_pid(check_driver(L)->d) > 0);
  return 1;
}

static void push_foreign_fd(void *ud, int pid, int fd, const char *target) {
  lua_State *L = ud;
  lua_pushfstring(L, "pid %d fd %d: %s", pid, fd, target);
  lua_rawseti(L, -2, (int)lua_rawlen(L, -2) + 1);
}

/* d:foreign_fds([pid]) -> { "pid P fd N: target", ... }: descriptors in
 * the sandbox that are not the session's pipes; with pid (one d:tree()
 * gave), that process's only. */
static int driver_foreign_fds(lua_State *L) {
  driver_ud *u = check_driver(L);
  lua_Integer pid = luaL_optinteger(L, 2, 0);
  lua_newtable(L);
  if (lua_isnoneornil(L, 2))
    rlm_driver_foreign_fds(u->d, push_foreign_fd, L);
  else if (pid > 0 && pid <= INT_MAX)
    rlm_driver_foreign_fds_of(u->d, (int)pid, push_foreign_fd, L);
  return 1;
}

static int driver_peak_rss(lua_State *L) {
  lua_pushnumber(L, (lua_Number)rlm_driver_peak_rss(check_driver(L)->d));
  return 1;
}

/* d:uid() -> the host uid the sandbox runs as (0 until it has started). */
static int driver_uid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)rlm_driver_uid(check_driver(L)->d));
  return 1;
}

/* d:exec_ms() -> when bubblewrap was exec'd, on now_ms()'s clock (nil
 * until it has started). */
static int driver_exec_ms(lua_State *L) {
  uint64_t ns = rlm_driver_exec_ns(check_driver(L)->d);
  if (ns == 0)
    return 0;
  lua_pushnumber(L, (lua_Number)(ns / 1000) / 1000.0);
  return 1;
}

/* d:start_stamps() -> { keeper=, context=, uid=, clone=, exec=, cgroup= }:
 * when the keeper reached each step of the start, on now_ms()'s clock (nil
 * until it has started). For bench/. */
static int driver_start_stamps(lua_State *L) {
  rlm_driver *d = check_driver(L)->d;
  const uint64_t *t = rlm_driver_stamps(d);
  if (t == NULL)
    return 0;
  static const char *const names[] = {"keeper", "context", "uid",
                                      "clone",  "cgroup",  "prepared"};
  lua_createtable(L, 0, 7);
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (t[i] != 0) {
      lua_pushnumber(L, (lua_Number)(t[i] / 1000) / 1000.0);
      lua_setfield(L, -2, names[i]);
    }
  lua_pushnumber(L, (lua_Number)(rlm_driver_exec_ns(d) / 1000) / 1000.0);
  lua_setfield(L, -2, "exec");
  return 1;
}

static const luaL_Reg inspect_methods[] = {
    {"pid", driver_pid},
    {"adopt", driver_adopt},
    {"memory_mechanism", driver_memory_mechanism},
    {"oom_kills", driver_oom_kills},
    {"alive", driver_alive},
    {"peak_rss", driver_peak_rss},
    {"tree", driver_tree},
    {"interpreter_runs", driver_interpreter_runs},
    {"foreign_fds", driver_foreign_fds},
    {"uid", driver_uid},
    {"exec_ms", driver_exec_ms},
    {"start_stamps", driver_start_stamps},
    {NULL, NULL},
};

/* Sets these into the Driver's methods (the table at the top). */
void add_inspect_methods(lua_State *L) { luaL_setfuncs(L, inspect_methods, 0); }
