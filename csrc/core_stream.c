/* core_stream.c: the methods only a stream's Driver takes (core.stream,
 * core_spawn.c; docs/protocol.md, "The stream"): a line on the keeper's
 * channel, the raw bytes written from a string the Driver holds until they
 * are written (release_raw lets go of it), the heartbeat, and the count
 * of lines received (a lingering keeper's replay starts there). Any other
 * Driver raises "not a stream". */
#define _GNU_SOURCE
#include "core.h"
#include "driver.h"

#include <string.h>

/* Lets go of a stream's raw bytes once they are written. */
static void release_raw(lua_State *L, driver_ud *u, int force) {
  if (u->raw_ref != LUA_NOREF &&
      (force || u->d == NULL || rlm_driver_raw_done(u->d))) {
    luaL_unref(L, LUA_REGISTRYINDEX, u->raw_ref);
    u->raw_ref = LUA_NOREF;
  }
}

/* d:send_keeper(line [, driver_line]) -> true | nil, message: a stream's
 * line on the keeper's channel; with driver_line, that line on the
 * driver's channel right after it, in the same write. */
static int driver_send_keeper(lua_State *L) {
  driver_ud *u = check_driver(L);
  size_t len, dlen = 0;
  const char *s = luaL_checklstring(L, 2, &len);
  const char *line = luaL_optlstring(L, 3, NULL, &dlen);
  if (!u->stream)
    return luaL_argerror(L, 1, "not a stream");
  if ((line == NULL ? rlm_driver_send_on(u->d, 'K', s, len)
                    : rlm_driver_send_pair(u->d, s, len, line, dlen)) != 0)
    return fail(L, "the stream cannot take input");
  lua_pushboolean(L, 1);
  return 1;
}

/* d:heartbeat(ping, every_ms, lost_ms) -> true: a stream's heartbeat
 * (rlm_driver_heartbeat): `ping` on the keeper's channel after every_ms of
 * quiet, and poll's "silent" when nothing comes lost_ms after it; every_ms
 * 0 stops it. */
static int driver_heartbeat(lua_State *L) {
  driver_ud *u = check_driver(L);
  size_t len;
  const char *ping = luaL_checklstring(L, 2, &len);
  lua_Integer every = luaL_checkinteger(L, 3);
  lua_Integer lost = luaL_checkinteger(L, 4);
  if (!u->stream)
    return luaL_argerror(L, 1, "not a stream");
  luaL_argcheck(L, len > 0 && len <= 64 && memchr(ping, '\n', len) == NULL, 2,
                "1 to 64 bytes, no newline");
  luaL_argcheck(L, every >= 0 && every <= 3600000, 3, "0 to 3600000 ms");
  luaL_argcheck(L, lost >= 1 && lost <= 3600000, 4, "1 to 3600000 ms");
  lua_pushboolean(L, rlm_driver_heartbeat(u->d, ping, len, (unsigned)every,
                                          (unsigned)lost) == 0);
  return 1;
}

/* d:send_raw(bytes) -> true | nil, message: a stream's raw bytes (the
 * context, after its message), written from the string itself, which the
 * driver holds until they are written (at most one such string at once). */
static int driver_send_raw(lua_State *L) {
  driver_ud *u = check_driver(L);
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  if (!u->stream)
    return luaL_argerror(L, 1, "not a stream");
  release_raw(L, u, 0);
  if (u->raw_ref != LUA_NOREF)
    return fail(L, "the stream is still writing raw bytes");
  if (rlm_driver_send_raw(u->d, s, len) != 0)
    return fail(L, "the stream cannot take input");
  lua_pushvalue(L, 2);
  u->raw_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushboolean(L, 1);
  return 1;
}

/* d:linger() -> true: the stream's far side outlives its input (a keeper
 * that lingers): its close waits for it to exit rather than killing it
 * (rlm_driver_linger). */
static int driver_linger(lua_State *L) {
  driver_ud *u = check_driver(L);
  if (!u->stream)
    return luaL_argerror(L, 1, "not a stream");
  lua_pushboolean(L, rlm_driver_linger(u->d) == 0);
  return 1;
}

/* d:received() -> n: the lines of the far side's taken by poll so far, on
 * any channel (the keeper's numbering: an attach's "seen"). */
static int driver_received(lua_State *L) {
  driver_ud *u = check_driver(L);
  if (!u->stream)
    return luaL_argerror(L, 1, "not a stream");
  lua_pushinteger(L, (lua_Integer)u->lines_in);
  return 1;
}

static const luaL_Reg stream_methods[] = {
    {"received", driver_received}, {"send_keeper", driver_send_keeper},
    {"send_raw", driver_send_raw}, {"heartbeat", driver_heartbeat},
    {"linger", driver_linger},     {NULL, NULL},
};

/* Sets the stream's methods into the Driver's (the table at the top). */
void add_stream_methods(lua_State *L) { luaL_setfuncs(L, stream_methods, 0); }
