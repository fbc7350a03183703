/* core.c: the rlm.core Lua module: its function table, luaopen_rlm_core,
 * and the small stateless functions. Each userdata has a file of its own
 * (core.h names them). Misuse raises; runtime failures return nil and a
 * message. */
#define _GNU_SOURCE
#include "core.h"
#include "base64.h"
#include "driver.h"
#include "plan.h"
#include "sandbox.h"
#include "sha256.h"
#include "utf8.h"

#include <limits.h>
#include <stdlib.h>
#include <time.h>
#include <uv.h>

static int fail(lua_State *L, const char *msg) {
  lua_pushnil(L);
  lua_pushstring(L, msg);
  return 2;
}

/* core.fd_headroom(need) -> free: how many descriptors this process can
 * still open, counted up to need (at most 64). */
static int core_fd_headroom(lua_State *L) {
  lua_Integer need = luaL_checkinteger(L, 1);
  lua_pushinteger(L, rlm_fd_headroom(need < 0    ? 0
                                     : need > 64 ? 64
                                                 : (int)need));
  return 1;
}

/* core.fd_free() -> free, limit | nil, message: how many descriptors this
 * process can still open in all, and its RLIMIT_NOFILE soft limit. */
static int core_fd_free(lua_State *L) {
  char err[160];
  long limit = 0;
  long n = rlm_fd_free(&limit, err, sizeof(err));
  if (n < 0)
    return fail(L, err);
  lua_pushinteger(L, (lua_Integer)n);
  lua_pushinteger(L, (lua_Integer)limit);
  return 2;
}

static int core_find_program(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  char out[PATH_MAX];
  if (rlm_find_program(name, out, sizeof(out)) != 0)
    return 0;
  lua_pushstring(L, out);
  return 1;
}

/* core.base64_decode(s) -> bytes | nil: standard base64 with padding (the
 * probe's driver_zip); nil for anything else. */
static int core_base64_decode(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  char *out = malloc(len / 4 * 3 + 1);
  if (out == NULL)
    return luaL_error(L, "rlm.core.base64_decode: out of memory");
  long n = rlm_base64_decode(s, len, out);
  if (n >= 0)
    lua_pushlstring(L, out, (size_t)n);
  free(out);
  return n >= 0 ? 1 : 0;
}

/* core.sha256_hex(s) -> the SHA-256 of s, 64 lowercase hex digits (the
 * sub-call cache's keys). */
static int core_sha256_hex(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  uint8_t digest[32];
  char hex[64];
  rlm_sha256(s, len, digest);
  for (int i = 0; i < 32; i++) {
    hex[2 * i] = "0123456789abcdef"[digest[i] >> 4];
    hex[2 * i + 1] = "0123456789abcdef"[digest[i] & 15];
  }
  lua_pushlstring(L, hex, sizeof(hex));
  return 1;
}

static int core_now_ms(lua_State *L) {
  lua_pushnumber(L, (lua_Number)(uv_hrtime() / 1000) / 1000.0);
  return 1;
}

/* core.thread_cpu_ms() -> the CPU time the calling thread has used, in ms
 * (CLOCK_THREAD_CPUTIME_ID): bench/ weighs the host thread's share of a
 * start with it. nil where the clock is missing. */
static int core_thread_cpu_ms(lua_State *L) {
  struct timespec t;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0)
    return 0;
  lua_pushnumber(L,
                 (lua_Number)t.tv_sec * 1000.0 + (lua_Number)t.tv_nsec / 1e6);
  return 1;
}

/* core.teardowns() -> how many closed drivers of this process their keeper
 * threads have not yet torn down (killed, reaped, freed): a spec that
 * counts the process's descriptors waits for 0 first. */
/* core.trim_token() -> a userdata whose collection gives the allocator's
 * free pages back (rlm_driver_trim_heap): rlm's Session.__gc makes one
 * that nothing holds, so that it goes in the next cycle, the one that frees
 * what the finalized sessions held. */
#define TRIM_TOKEN_MT "rlm.trim_token"

static int trim_token_gc(lua_State *L) {
  (void)L;
  rlm_driver_trim_heap();
  return 0;
}

static int core_trim_token(lua_State *L) {
  lua_newuserdata(L, 1);
  luaL_getmetatable(L, TRIM_TOKEN_MT);
  lua_setmetatable(L, -2);
  return 1;
}

static int core_teardowns(lua_State *L) {
  lua_pushinteger(L, rlm_driver_teardowns());
  return 1;
}

/* core.utf8_prefix(s, n) -> bytes, chars: the byte length of the first n
 * UTF-8 characters of s, and how many characters that is (all of s's when
 * it holds fewer), as rlm_utf8_prefix counts them. */
static int core_utf8_prefix(lua_State *L) {
  size_t len;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &len);
  lua_Integer n = luaL_checkinteger(L, 2);
  int64_t chars;
  size_t bytes = rlm_utf8_prefix(s, len, (int64_t)n, &chars);
  lua_pushinteger(L, (lua_Integer)bytes);
  lua_pushinteger(L, (lua_Integer)chars);
  return 2;
}

/* core.utf8_valid(s) -> bytes: the length of the longest prefix of s that
 * is valid UTF-8 (#s when all of it is), as rlm_utf8_valid reads it: what
 * Python's strict decoder takes. */
static int core_utf8_valid(lua_State *L) {
  size_t len;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &len);
  lua_pushinteger(L, (lua_Integer)rlm_utf8_valid(s, len));
  return 1;
}

/* core.utf8_clean(s) -> string: s as valid UTF-8, each byte that is not
 * part of a valid sequence replaced by U+FFFD; s itself when it is valid.
 * One pass, so the log's repair is linear in #s (at most 3 * #s out). */
static int core_utf8_clean(lua_State *L) {
  size_t len;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &len);
  size_t i = rlm_utf8_valid(s, len);
  if (i == len) {
    lua_settop(L, 1);
    return 1;
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addlstring(&b, (const char *)s, i);
  while (i < len) {
    luaL_addlstring(&b, "\xEF\xBF\xBD", 3); /* s[i] is not valid here */
    i++;
    size_t n = rlm_utf8_valid(s + i, len - i);
    luaL_addlstring(&b, (const char *)s + i, n);
    i += n;
  }
  luaL_pushresult(&b);
  return 1;
}

/* core.utf8_str_size(s) -> bytes, chars, width: what the driver's str of
 * s (a text context) holds, as rlm_utf8_str_size counts it; the floor of
 * Session.new's check of the context against max_rss_bytes. */
static int core_utf8_str_size(lua_State *L) {
  size_t len;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &len);
  uint64_t chars;
  int width;
  uint64_t bytes = rlm_utf8_str_size(s, len, &chars, &width);
  lua_pushnumber(L, (lua_Number)bytes);
  lua_pushnumber(L, (lua_Number)chars);
  lua_pushinteger(L, width);
  return 3;
}

static const luaL_Reg core_functions[] = {
    {"spawn", core_spawn},
    {"sandbox_argv", core_sandbox_argv},
    {"helper", core_helper},
    {"teardowns", core_teardowns},
    {"trim_token", core_trim_token},
    {"stream", core_stream},
    {"stream_connect", core_stream_connect},
    {"waitset", core_waitset},
    {"find_program", core_find_program},
    {"fd_headroom", core_fd_headroom},
    {"fd_free", core_fd_free},
    {"now_ms", core_now_ms},
    {"hook_state", core_hook_state},
    {"interrupted", core_interrupted},
    {"hook_release", core_hook_release},
    {"reraise_interrupt", core_reraise_interrupt},
    {"thread_cpu_ms", core_thread_cpu_ms},
    {"base64_decode", core_base64_decode},
    {"sha256_hex", core_sha256_hex},
    {"utf8_prefix", core_utf8_prefix},
    {"utf8_str_size", core_utf8_str_size},
    {"utf8_clean", core_utf8_clean},
    {"utf8_valid", core_utf8_valid},
    {"plant_canaries", core_plant_canaries},
    {"journal_dir", core_journal_dir},
    {"journal_read", core_journal_read},
    {"journal_write", core_journal_write},
    {"journal_remove", core_journal_remove},
    {"journal_list", core_journal_list},
    {"journal_lock", core_journal_lock},
    {"journal_sweep_temps", core_journal_sweep_temps},
    {NULL, NULL},
};

__attribute__((visibility("default"))) int luaopen_rlm_core(lua_State *L) {
  open_driver(L);
  open_canaries(L);
  luaL_newmetatable(L, TRIM_TOKEN_MT);
  lua_pushcfunction(L, trim_token_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_newmetatable(L, SEALED_MT);
  lua_pushcfunction(L, blob_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  open_hook(L);
  open_waitset(L);
  open_journal(L);
  luaL_newlib(L, core_functions);
  lua_pushliteral(L, "rlm.core 0.1");
  lua_setfield(L, -2, "_VERSION");
  return 1;
}
