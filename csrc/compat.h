/* compat.h: the few Lua C API differences between 5.1/LuaJIT and 5.4 that
 * rlm.core uses. */
#ifndef RLM_COMPAT_H
#define RLM_COMPAT_H

#include <lauxlib.h>
#include <lua.h>

#if LUA_VERSION_NUM < 502
#ifndef luaL_newlib
#define luaL_newlibtable(L, l)                                                 \
  lua_createtable(L, 0, sizeof(l) / sizeof((l)[0]) - 1)
#define luaL_newlib(L, l) (luaL_newlibtable(L, l), luaL_setfuncs(L, l, 0))
#endif
#define lua_rawlen(L, i) lua_objlen(L, i)

/* LuaJIT 2.1 has luaL_setfuncs; PUC 5.1 does not. A static copy is harmless
 * for both. */
static inline void rlm_setfuncs(lua_State *L, const luaL_Reg *l, int nup) {
  for (; l->name != NULL; l++) {
    int i;
    for (i = 0; i < nup; i++)
      lua_pushvalue(L, -nup);
    lua_pushcclosure(L, l->func, nup);
    lua_setfield(L, -(nup + 2), l->name);
  }
  lua_pop(L, nup);
}
#undef luaL_setfuncs
#define luaL_setfuncs rlm_setfuncs

static inline void *rlm_testudata(lua_State *L, int i, const char *tname) {
  void *p = lua_touserdata(L, i);
  if (p == NULL || !lua_getmetatable(L, i))
    return NULL;
  luaL_getmetatable(L, tname);
  if (!lua_rawequal(L, -1, -2))
    p = NULL;
  lua_pop(L, 2);
  return p;
}
#define luaL_testudata rlm_testudata
#endif

#endif
