/* core_stream.c: the Drivers with no sandbox of their own (core.helper, a
 * trusted helper's lines and exit; core.stream, a local process whose
 * stream carries channels; core.stream_connect, the same over TCP to a
 * keeper that listens: docs/protocol.md, "The stream" and "The claim"), and
 * the methods only a stream's Driver takes: a line on the keeper's
 * channel, the raw bytes written from a string the Driver holds until they
 * are written (release_raw lets go of it), the heartbeat, and the count
 * of lines received (a lingering keeper's replay starts there). Any other
 * Driver raises "not a stream". */
#define _GNU_SOURCE
#include "core.h"
#include "driver.h"

#include <stdio.h>
#include <string.h>

extern char **environ;

/* The host's environment without what would load extra code into the
 * helper (and so into the list of libraries it reports). */
static int helper_env(lua_State *L) {
  size_t n = 0;
  for (char **e = environ; *e != NULL; e++)
    n++;
  char **env = lua_newuserdata(L, (n + 1) * sizeof(*env));
  size_t k = 0;
  for (char **e = environ; *e != NULL; e++)
    if (strncmp(*e, "LD_PRELOAD=", 11) != 0 && strncmp(*e, "LD_AUDIT=", 9) != 0)
      env[k++] = *e;
  env[k] = NULL;
  return lua_gettop(L);
}

/* core.helper(argv, timeout_ms, max_bytes) -> Driver | nil, message
 * Starts a trusted helper (the interpreter probe) outside the sandbox, with
 * the host's environment, as a Driver to poll like any other: its lines,
 * then its exit. */
static int start_local(lua_State *L, char channel) {
  luaL_checktype(L, 1, LUA_TTABLE);
  int timeout = (int)luaL_checkinteger(L, 2);
  size_t max_bytes = (size_t)luaL_checkinteger(L, 3);
  size_t n = lua_rawlen(L, 1);
  if (n == 0 || n > 256)
    return luaL_argerror(L, 1, "1 to 256 arguments");
  char **argv = lua_newuserdata(L, (n + 1) * sizeof(*argv));
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, 1, (int)i + 1);
    argv[i] = (char *)luaL_checkstring(L, -1);
    lua_pop(L, 1);
  }
  argv[n] = NULL;
  int env_index = helper_env(L);
  driver_ud *u = new_driver_ud(L, channel != 0);
  rlm_driver_opts o;
  memset(&o, 0, sizeof(o));
  o.argv = argv;
  o.env = lua_touserdata(L, env_index);
  o.max_line = max_bytes;
  o.channel = channel;
  char err[512];
  u->d = rlm_driver_start(&o, err, sizeof(err));
  if (u->d == NULL)
    return fail(L, err);
  if (timeout > 0)
    rlm_driver_set_deadline(u->d, (uint64_t)timeout);
  return 1;
}

static int core_helper(lua_State *L) { return start_local(L, 0); }

/* core.stream(argv, max_line) -> Driver | nil, message
 * Starts argv (a local process with no sandbox of its own: the exec
 * backend's `sh -c 'cat | rlm-keeper | cat'`, kubectl exec, podman exec)
 * as a stream of channels (docs/protocol.md, "The stream"): what is sent
 * goes on the driver's channel (send_keeper and send_raw for the keeper's
 * messages and the context), and poll() gives the driver's lines as
 * "line" and the keeper's as "keeper". Its close ends its input, and kills
 * its process group STREAM_END_MS later. */
static int core_stream(lua_State *L) {
  lua_settop(L, 2);
  lua_pushinteger(L, 0); /* no deadline of its own: the host sets them */
  lua_insert(L, 2);
  return start_local(L, 'D');
}

/* core.stream_connect(host, port, token, max_line, timeout_ms)
 *   -> Driver | nil, message
 * The same stream over a TCP connection to `rlm-keeper --listen` (no
 * process: docs/protocol.md, "The claim"): host is an IPv4 or IPv6
 * literal, token 32 of [0-9a-f], sent first as the claim; nothing back
 * within timeout_ms is a "failed" event, and the stream's end an "exit"
 * (status 0) whose text says why. nil, message: no such address, or a
 * connect that failed at once. */
static int core_stream_connect(lua_State *L) {
  const char *host = luaL_checkstring(L, 1);
  lua_Integer port = luaL_checkinteger(L, 2);
  size_t token_len;
  const char *token = luaL_checklstring(L, 3, &token_len);
  lua_Integer max_line = luaL_checkinteger(L, 4);
  lua_Integer timeout = luaL_checkinteger(L, 5);
  luaL_argcheck(L, port >= 1 && port <= 65535, 2, "1 to 65535");
  luaL_argcheck(L, token_len == 32 && strspn(token, "0123456789abcdef") == 32,
                3, "32 of [0-9a-f]");
  luaL_argcheck(L, max_line >= 1, 4, "at least 1");
  luaL_argcheck(L, timeout >= 1 && timeout <= 2147483647, 5,
                "1 to 2^31 - 1 ms");
  char claim[64];
  int n = snprintf(claim, sizeof(claim),
                   "{\"type\":\"claim\",\"token\":\"%s\"}", token);
  driver_ud *u = new_driver_ud(L, 1);
  rlm_connect_opts o = {.host = host,
                        .port = (unsigned)port,
                        .claim = claim,
                        .claim_len = (size_t)n,
                        .max_line = (size_t)max_line,
                        .claim_ms = (unsigned)timeout};
  char err[512];
  u->d = rlm_driver_connect(&o, err, sizeof(err));
  explicit_bzero(claim, sizeof(claim));
  if (u->d == NULL)
    return fail(L, err);
  return 1;
}

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
