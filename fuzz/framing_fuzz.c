/* framing_fuzz.c: libFuzzer harness for what the host does with the bytes a
 * hostile driver writes: the C framer (csrc/framing.c), then each complete
 * line through the Lua protocol decoder (lua/rlm/protocol.lua, lua-cjson),
 * in a Lua 5.4 state of its own. A crash, a leak, a line past the cap, a
 * lost or invented byte, or a Lua error escaping the decoder (instead of
 * its nil, reason) is a finding. */
#include "../csrc/framing.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LINE 512

static lua_State *L;
static int decode_ref, allowed_ref;

static void setup(void) {
  L = luaL_newstate();
  luaL_openlibs(L);
  if (luaL_dostring(
          L, "package.path = 'lua/?.lua;' .. package.path\n"
             "local p = require('rlm.protocol')\n"
             "local all = {}\n"
             "for _, t in ipairs({'hello', 'configured', 'self_test_result', "
             "'ready',\n"
             "  'exec_result', 'llm_query', 'fatal'}) do all[t] = true end\n"
             "return p.decode, all") != 0)
    abort();
  allowed_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  decode_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

typedef struct seen {
  size_t bytes; /* line bytes plus newlines handed out so far */
} seen;

static int on_line(void *ud, char *line, size_t len) {
  seen *s = ud;
  if (len > MAX_LINE || memchr(line, '\n', len) != NULL || line[len] != '\0')
    abort();
  s->bytes += len + 1;
  lua_rawgeti(L, LUA_REGISTRYINDEX, decode_ref);
  lua_pushlstring(L, line, len);
  lua_rawgeti(L, LUA_REGISTRYINDEX, allowed_ref);
  if (lua_pcall(L, 2, 2, 0) != 0)
    abort(); /* the decoder raised instead of returning nil, reason */
  if (lua_isnil(L, -2) && !lua_isstring(L, -1))
    abort(); /* a refusal must say why */
  lua_settop(L, 0);
  free(line);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (L == NULL)
    setup();
  if (size == 0)
    return 0;
  /* The first byte picks how the stream is cut into reads. */
  size_t step = (size_t)data[0] % 64 + 1;
  data++;
  size--;
  rlm_framer f = {0};
  f.max = MAX_LINE;
  seen s = {0};
  int rc = RLM_FRAME_OK;
  for (size_t off = 0; off < size && rc == RLM_FRAME_OK; off += step) {
    size_t n = size - off < step ? size - off : step;
    rc = rlm_framer_feed(&f, (const char *)data + off, n, on_line, &s);
  }
  if (rc == RLM_FRAME_OK && s.bytes + f.len != size)
    abort(); /* bytes lost or invented */
  if (f.len > MAX_LINE)
    abort();
  rlm_framer_free(&f);
  return 0;
}
