/* core_canaries.c: the Canaries userdata over canary.c, what the
 * start-up self-test tries to reach. */
#define _GNU_SOURCE
#include "canary.h"
#include "core.h"

#include <unistd.h>

#define CANARIES_MT "rlm.core.Canaries"

/* core.plant_canaries(home, dir) -> Canaries: see canary.h. */
static int core_plant_canaries(lua_State *L) {
  const char *home = luaL_optstring(L, 1, NULL);
  const char *dir = luaL_checkstring(L, 2);
  rlm_canaries *c = lua_newuserdata(L, sizeof(*c));
  rlm_canaries_plant(c, home, dir);
  luaL_getmetatable(L, CANARIES_MT);
  lua_setmetatable(L, -2);
  return 1;
}

static rlm_canaries *check_canaries(lua_State *L) {
  return luaL_checkudata(L, 1, CANARIES_MT);
}

static void set_string(lua_State *L, const char *key, const char *value) {
  if (value[0] != '\0') {
    lua_pushstring(L, value);
    lua_setfield(L, -2, key);
  }
}

static void set_int(lua_State *L, const char *key, int value) {
  if (value >= 0) {
    lua_pushinteger(L, value);
    lua_setfield(L, -2, key);
  }
}

/* c:info() -> { secret=, home_file=, tcp_port=, unix_path=, abstract=,
 *               leaked_fd=, host_pid= }: what the self-test tries. */
static int canaries_info(lua_State *L) {
  rlm_canaries *c = check_canaries(L);
  lua_newtable(L);
  set_string(L, "secret", c->secret);
  set_string(L, "home_file", c->home_file);
  set_string(L, "unix_path", c->unix_path);
  set_string(L, "abstract", c->abstract_name);
  set_int(L, "tcp_port", c->tcp_port);
  set_int(L, "leaked_fd", c->leaked_fd);
  set_int(L, "host_pid", (int)getpid());
  return 1;
}

static int canaries_close_leaked(lua_State *L) {
  rlm_canaries_close_leaked(check_canaries(L));
  return 0;
}

static int canaries_remove(lua_State *L) {
  rlm_canaries_remove(check_canaries(L));
  return 0;
}

static const luaL_Reg canaries_methods[] = {
    {"info", canaries_info},
    {"close_leaked", canaries_close_leaked},
    {"remove", canaries_remove},
    {NULL, NULL},
};

void open_canaries(lua_State *L) {
  luaL_newmetatable(L, CANARIES_MT);
  luaL_newlib(L, canaries_methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, canaries_remove);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
}
