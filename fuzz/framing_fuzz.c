/* framing_fuzz.c: libFuzzer harness for what the host does with the bytes a
 * hostile driver writes: the C framer (csrc/framing.c) as the driver uses
 * it (reads into its free end, lines taken as views, reading paused while a
 * line waits), the JSON value bound (rlm_json_values, csrc/jsonscan.c),
 * then each complete line through the Lua protocol decoder
 * (lua/rlm/base/protocol.lua, lua-cjson), in a Lua 5.4 state of its own. A
 * crash, a leak, a line past the cap, a lost or invented byte, a buffer
 * past max + 1 bytes, a value count below what cjson built, or a Lua error
 * escaping the decoder (instead of its nil, reason) is a finding. So is a
 * line escaped as rlm-keeper escapes the strings it writes to the host
 * (rlm_json_escape) that lua-cjson does not read back as it was. */
/* framing.c, jsonscan.c, jsonread.c and utf8.c are static units
 * (csrc/unit.h): take them whole. */
#include "../csrc/framing.c"
#include "../csrc/jsonread.c"
#include "../csrc/jsonscan.c"
#include "../csrc/utf8.c"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LINE 512
#define MAX_VALUES 64

static lua_State *L;
static int decode_ref, allowed_ref, count_ref, same_ref;

static void setup(void) {
  L = luaL_newstate();
  luaL_openlibs(L);
  if (luaL_dostring(
          L, "package.path = 'lua/?.lua;' .. package.path\n"
             "local p = require('rlm.base.protocol')\n"
             "local all = {}\n"
             "for _, t in ipairs({'hello', 'configured', 'self_test_result', "
             "'ready',\n"
             "  'exec_result', 'llm_query', 'llm_batch', 'rlm_batch', "
             "'fatal'}) do all[t] = true end\n"
             "local function count(v)\n"
             "  if type(v) ~= 'table' then return 1 end\n"
             "  local n = 1\n"
             "  for _, x in pairs(v) do n = n + count(x) end\n"
             "  return n\n"
             "end\n"
             "local cjson = require('cjson')\n"
             "local function same(line, escaped)\n"
             "  return cjson.decode('\"' .. escaped .. '\"') == line\n"
             "end\n"
             "return p.decode, all, count, same") != 0)
    abort();
  same_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  count_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  allowed_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  decode_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

static void on_line(const char *line, size_t len) {
  if (len > MAX_LINE || memchr(line, '\n', len) != NULL || line[len] != '\0')
    abort();
  size_t values = rlm_json_values(line, len, MAX_VALUES);
  if (values > MAX_VALUES)
    return; /* refused before decoding, as the host does */
  lua_rawgeti(L, LUA_REGISTRYINDEX, decode_ref);
  lua_pushlstring(L, line, len);
  lua_rawgeti(L, LUA_REGISTRYINDEX, allowed_ref);
  if (lua_pcall(L, 2, 2, 0) != 0)
    abort(); /* the decoder raised instead of returning nil, reason */
  /* The line's bytes as a JSON string that rlm-keeper writes. */
  char escaped[6 * MAX_LINE];
  size_t elen = rlm_json_escaped_len(line, len);
  if (elen > sizeof(escaped))
    abort();
  rlm_json_escape(line, len, escaped);
  lua_rawgeti(L, LUA_REGISTRYINDEX, same_ref);
  lua_pushlstring(L, line, len);
  lua_pushlstring(L, escaped, elen);
  if (lua_pcall(L, 2, 1, 0) != 0 || !lua_toboolean(L, -1))
    abort(); /* lua-cjson reads it otherwise */
  lua_pop(L, 1);
  if (lua_isnil(L, -2)) {
    if (!lua_isstring(L, -1))
      abort(); /* a refusal must say why */
  } else {
    /* What decoding built is no larger than the bound said. */
    lua_rawgeti(L, LUA_REGISTRYINDEX, count_ref);
    lua_pushvalue(L, -3);
    if (lua_pcall(L, 1, 1, 0) != 0)
      abort();
    if ((size_t)lua_tointeger(L, -1) > values)
      abort();
  }
  lua_settop(L, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (L == NULL)
    setup();
  if (size == 0)
    return 0;
  /* The first byte picks how large each read is. */
  size_t step = (size_t)data[0] % 64 + 1;
  data++;
  size--;
  rlm_framer f = {0};
  f.max = MAX_LINE;
  size_t off = 0, taken = 0;
  int broken = 0;
  while (!broken) {
    const char *line;
    size_t len;
    while (rlm_framer_next(&f, &line, &len)) { /* paused while lines wait */
      taken += len + 1;
      on_line(line, len);
      rlm_framer_trim(&f);
    }
    if (off == size)
      break;
    size_t room;
    char *p = rlm_framer_space(&f, step, &room);
    if (p == NULL) {
      broken = 1; /* an overflow: the host kills the driver */
      break;
    }
    size_t n = size - off < room ? size - off : room;
    memcpy(p, data + off, n);
    rlm_framer_commit(&f, n);
    off += n;
    if (f.cap > MAX_LINE + 1)
      abort();
    if (!rlm_framer_ready(&f) && rlm_framer_overflowed(&f))
      broken = 1;
  }
  if (!broken && taken + (f.end - f.start) != size)
    abort(); /* bytes lost or invented */
  if (broken && f.end - f.start <= MAX_LINE)
    abort(); /* broken without a line past the cap */
  rlm_framer_free(&f);
  return 0;
}
