/* core_waitset.c: the Waitset userdata over waitset.c, one descriptor a
 * host's loop watches for a session. */
#define _GNU_SOURCE
#include "core.h"
#include "waitset.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#define WAITSET_MT "rlm.core.Waitset"

/* core.waitset() -> Waitset | nil, message: see waitset.h. */
static int core_waitset(lua_State *L) {
  int *fd = lua_newuserdata(L, sizeof(*fd));
  *fd = rlm_waitset_open();
  if (*fd < 0)
    return fail(L, strerror(errno));
  luaL_getmetatable(L, WAITSET_MT);
  lua_setmetatable(L, -2);
  return 1;
}

static int *check_waitset(lua_State *L) {
  int *fd = luaL_checkudata(L, 1, WAITSET_MT);
  if (*fd < 0)
    luaL_argerror(L, 1, "waitset is closed");
  return fd;
}

static int waitset_fd(lua_State *L) {
  lua_pushinteger(L, *check_waitset(L));
  return 1;
}

/* w:add(fd) / w:remove(fd) -> true | nil, message */
static int waitset_change(lua_State *L, int add) {
  int set = *check_waitset(L);
  int fd = (int)luaL_checkinteger(L, 2);
  if ((add ? rlm_waitset_add(set, fd) : rlm_waitset_remove(set, fd)) != 0)
    return fail(L, strerror(errno));
  lua_pushboolean(L, 1);
  return 1;
}

static int waitset_add(lua_State *L) { return waitset_change(L, 1); }
static int waitset_remove(lua_State *L) { return waitset_change(L, 0); }

/* w:wait(timeout_ms[, token]) -> true (readable) | false (timeout, a
 * signal) | "interrupted" (with a token of core.hook_state(): a SIGINT asked
 * the state to stop, as d:poll's) | nil, message. A signal's handler ends the
 * epoll_wait itself (EINTR): nothing is armed. */
static int waitset_wait(lua_State *L) {
  int set = *check_waitset(L);
  lua_Integer ms = luaL_checkinteger(L, 2);
  const hook_state *before = opt_hook_token(L, 3);
  if (before != NULL && interrupt_asked(L, before)) {
    lua_pushliteral(L, "interrupted");
    return 1;
  }
  int n =
      rlm_waitset_wait(set, ms < 0 ? -1 : (int)(ms > INT_MAX ? INT_MAX : ms));
  if (before != NULL && n >= 0 && interrupt_asked(L, before)) {
    lua_pushliteral(L, "interrupted");
    return 1;
  }
  if (n < 0)
    return fail(L, strerror(errno));
  lua_pushboolean(L, n > 0);
  return 1;
}

static int waitset_close(lua_State *L) {
  int *fd = luaL_checkudata(L, 1, WAITSET_MT);
  if (*fd >= 0) {
    (void)close(*fd);
    *fd = -1;
  }
  return 0;
}

static const luaL_Reg waitset_methods[] = {
    {"fd", waitset_fd},         {"add", waitset_add},
    {"remove", waitset_remove}, {"wait", waitset_wait},
    {"close", waitset_close},   {NULL, NULL},
};

void open_waitset(lua_State *L) {
  luaL_newmetatable(L, WAITSET_MT);
  luaL_newlib(L, waitset_methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, waitset_close);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
}
