/* core_spawn.c: what makes a sandbox's Driver: core.spawn (a sandbox,
 * from its options) and core.sandbox_argv (the command line spawn would
 * use); the Drivers with no sandbox of their own are core_stream.c's. */
#define _GNU_SOURCE
#include "core.h"
#include "driver.h"
#include "plan.h"
#include "sandbox.h"
#include "workdir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MAX_RO_PATHS 4096

static const char *opt_string(lua_State *L, int t, const char *key) {
  lua_getfield(L, t, key);
  const char *s = lua_tostring(L, -1);
  if (s == NULL)
    luaL_error(L, "rlm.core.spawn: option '%s' must be a string", key);
  lua_pop(L, 1); /* the table still holds it */
  return s;
}

static lua_Integer opt_integer(lua_State *L, int t, const char *key,
                               lua_Integer def) {
  lua_getfield(L, t, key);
  lua_Integer v = def;
  if (!lua_isnil(L, -1)) {
    if (!lua_isnumber(L, -1) || lua_tonumber(L, -1) < 0)
      luaL_error(L, "rlm.core: option '%s' must be a number >= 0", key);
    v = (lua_Integer)lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

/* The sandbox spec's common options, from the table at index 1: bwrap,
 * python, driver and the list `ro` (kept alive by the table). */
static void read_spec(lua_State *L, rlm_sandbox_spec *spec) {
  memset(spec, 0, sizeof(*spec));
  spec->bwrap = opt_string(L, 1, "bwrap");
  spec->python = opt_string(L, 1, "python");
  spec->driver = opt_string(L, 1, "driver");
  spec->seccomp_fd = 3; /* where the child finds the filter */
  spec->driver_fd = -1;
  spec->zip_fd = -1;
  lua_getfield(L, 1, "driver_zip");
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TSTRING)
      luaL_error(L, "rlm.core: driver_zip must be a string");
    spec->zip_fd = CHILD_ZIP_FD;
  }
  lua_pop(L, 1);
  lua_getfield(L, 1, "ro");
  luaL_checktype(L, -1, LUA_TTABLE);
  size_t n_ro = lua_rawlen(L, -1);
  if (n_ro > MAX_RO_PATHS)
    luaL_error(L, "rlm.core: too many read-only paths");
  const char **ro = lua_newuserdata(L, (n_ro + 1) * sizeof(*ro));
  for (size_t i = 0; i < n_ro; i++) {
    lua_rawgeti(L, -2, (int)i + 1);
    ro[i] = lua_tostring(L, -1);
    if (ro[i] == NULL)
      luaL_error(L, "rlm.core: ro[%d] must be a string", (int)i + 1);
    lua_pop(L, 1); /* the ro table keeps it alive */
  }
  spec->ro = ro;
  spec->n_ro = n_ro;
  lua_getfield(L, 1, "driver_modules");
  if (!lua_isnil(L, -1)) {
    luaL_checktype(L, -1, LUA_TTABLE);
    size_t n = lua_rawlen(L, -1);
    if (n > RLM_MAX_DRIVER_MODULES)
      luaL_error(L, "rlm.core: more than %d driver_modules",
                 RLM_MAX_DRIVER_MODULES);
    const char **mods = lua_newuserdata(L, (n + 1) * sizeof(*mods));
    for (size_t i = 0; i < n; i++) {
      lua_rawgeti(L, -2, (int)i + 1);
      mods[i] = lua_tostring(L, -1);
      if (mods[i] == NULL || !rlm_sandbox_module_ok(mods[i]))
        luaL_error(L,
                   "rlm.core: driver_modules[%d] must be a relative .py path",
                   (int)i + 1);
      lua_pop(L, 1); /* the driver_modules table keeps it alive */
    }
    spec->modules = mods;
    spec->n_modules = n;
  }
}

/* The Sealed userdata's __gc (core.c makes its metatable). */
int blob_gc(lua_State *L) {
  sealed_blob **b = luaL_checkudata(L, 1, SEALED_MT);
  blob_unref(*b);
  *b = NULL;
  return 0;
}

/* The sealed memfd of the string at index i, with a reference for the
 * caller: the Lua state's last one under the registry key `cache` when it
 * is the same string (a probe's zip and entry are one string each for its
 * whole life), else a new one that replaces it. NULL with a message that
 * names `what`. */
static sealed_blob *cached_blob(lua_State *L, int i, const char *cache,
                                const char *what, char *err, size_t errlen) {
  lua_getfield(L, LUA_REGISTRYINDEX, cache);
  if (lua_istable(L, -1)) {
    lua_rawgeti(L, -1, 1);
    int same = lua_rawequal(L, -1, i);
    lua_pop(L, 1);
    if (same) {
      lua_rawgeti(L, -1, 2);
      sealed_blob **b = luaL_checkudata(L, -1, SEALED_MT);
      sealed_blob *blob = *b;
      lua_pop(L, 2);
      if (blob != NULL) {
        atomic_fetch_add(&blob->refs, 1);
        return blob;
      }
      lua_pushnil(L);
    }
  }
  lua_pop(L, 1);
  size_t len;
  const char *data = lua_tolstring(L, i, &len);
  sealed_blob **b = lua_newuserdata(L, sizeof(*b));
  *b = NULL;
  luaL_getmetatable(L, SEALED_MT);
  lua_setmetatable(L, -2);
  if ((*b = blob_new(data, len, 2)) == NULL) { /* the cache's, the caller's */
    snprintf(err, errlen, "%s: %s", what, strerror(errno));
    lua_pop(L, 1);
    return NULL;
  }
  sealed_blob *blob = *b;
  lua_createtable(L, 2, 0);
  lua_pushvalue(L, i);
  lua_rawseti(L, -2, 1);
  lua_pushvalue(L, -2);
  lua_rawseti(L, -2, 2);
  lua_setfield(L, LUA_REGISTRYINDEX, cache);
  lua_pop(L, 1);
  return blob;
}

/* Pushes argv as a list and frees it. */
static int push_argv(lua_State *L, rlm_argv *argv) {
  lua_createtable(L, (int)argv->n, 0);
  for (size_t i = 0; i < argv->n; i++) {
    lua_pushstring(L, argv->v[i]);
    lua_rawseti(L, -2, (int)i + 1);
  }
  rlm_argv_free(argv);
  return 1;
}

/* A new Driver userdata, with nothing yet (its d set by the caller), at
 * the top of the stack. */
static driver_ud *new_driver_ud(lua_State *L, int stream) {
  driver_ud *u = lua_newuserdata(L, sizeof(*u));
  u->d = NULL;
  u->ctx_ref = LUA_NOREF;
  u->late_fd = -1;
  u->writer = NULL;
  u->stream = stream;
  u->raw_ref = LUA_NOREF;
  u->lines_in = 0;
  luaL_getmetatable(L, DRIVER_MT);
  lua_setmetatable(L, -2);
  return u;
}

/* late_context: an empty memfd for the context, written and sealed after
 * the spawn (d:write_context). The child gets its own read-only open of it
 * (a reopen through /proc, not a dup: a dup would share the write mode);
 * the host keeps the writable one. */
static int open_late_context(driver_ud *u, int *ro, char *err, size_t errlen) {
  char path[64];
  if ((u->late_fd = rlm_context_open()) >= 0) {
    snprintf(path, sizeof(path), "/proc/self/fd/%d", u->late_fd);
    do
      *ro = open(path, O_RDONLY | O_CLOEXEC);
    while (*ro < 0 && errno == EINTR);
    if (*ro >= 0)
      return 0;
  }
  snprintf(err, errlen, "the late context's memfd: %s", strerror(errno));
  return -1;
}

/* core.spawn{bwrap=, python=, driver=, driver_modules={...}, ro={...},
 *            driver_zip=, context= | late_context=true, max_line=,
 *            max_rss=, rss_interval_ms=, cgroup=, workdir_bytes=,
 *            workdir_files=, uid_first=, uid_count=, hash_seed=}
 *   -> Driver | nil, message
 * The options are checked here (misuse raises); the command line, the
 * descriptors, the context's memfd, the uid and the process are made on
 * the driver's keeper thread, whose failure is the "failed" event. */
static int core_spawn(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  rlm_sandbox_spec spec;
  read_spec(L, &spec);
  size_t context_len = 0;
  lua_getfield(L, 1, "late_context");
  int late = lua_toboolean(L, -1);
  lua_getfield(L, 1, "context");
  const char *context = lua_tolstring(L, -1, &context_len);
  if (context == NULL && !late)
    luaL_error(L, "rlm.core.spawn: option 'context' must be a string");
  lua_pop(L, 2); /* the table keeps it alive */
  size_t max_line = (size_t)opt_integer(L, 1, "max_line", 16 << 20);
  uint64_t max_rss = (uint64_t)opt_integer(L, 1, "max_rss", 0);
  unsigned interval = (unsigned)opt_integer(L, 1, "rss_interval_ms", 50);
  spec.workdir_bytes = (uint64_t)opt_integer(L, 1, "workdir_bytes", 1 << 28);
  uint64_t max_files = (uint64_t)opt_integer(L, 1, "workdir_files", 10000);
  uint32_t uid_first = (uint32_t)opt_integer(L, 1, "uid_first", 1879048192);
  uint32_t uid_count = (uint32_t)opt_integer(L, 1, "uid_count", 65536);
  lua_getfield(L, 1, "cgroup");
  int use_cgroup = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_Integer seed = opt_integer(L, 1, "hash_seed", 0);
  if (seed > 4294967295)
    return luaL_error(L, "rlm.core.spawn: option 'hash_seed' must be 0 to "
                         "4294967295");
  spec.hash_seed = (uint32_t)seed;
  char seed_var[RLM_SEED_VAR_BYTES];
  char *env[RLM_SANDBOX_ENV_MAX];
  rlm_sandbox_env(spec.hash_seed, seed_var, env);

  driver_ud *u = new_driver_ud(L, 0);

  char err[512];
  spawn_plan *plan = plan_new(&spec);
  if (plan == NULL)
    return fail(L, "out of memory");
  plan->as_root = geteuid() == 0;
  if (spec.zip_fd >= 0) {
    lua_getfield(L, 1, "driver_zip");
    plan->zip = cached_blob(L, lua_gettop(L), ZIP_CACHE, "the driver's zip",
                            err, sizeof(err));
    lua_pop(L, 1);
    if (plan->zip == NULL) {
      plan_free(plan);
      return fail(L, err);
    }
  }
  lua_getfield(L, 1, "driver_pyc");
  if (lua_type(L, -1) == LUA_TSTRING) {
    plan->entry = cached_blob(L, lua_gettop(L), ENTRY_CACHE,
                              "the driver's bytecode", err, sizeof(err));
    plan->spec.driver_compiled = 1;
  } else if (!lua_isnil(L, -1)) {
    plan_free(plan);
    return luaL_error(L, "rlm.core: driver_pyc must be a string");
  }
  lua_pop(L, 1);
  if (plan->spec.driver_compiled && plan->entry == NULL) {
    plan_free(plan);
    return fail(L, err);
  }
  if (late && open_late_context(u, &plan->late_ro, err, sizeof(err)) != 0) {
    plan_free(plan);
    return fail(L, err);
  }
  rlm_driver_opts o;
  memset(&o, 0, sizeof(o));
  o.prepare = plan_prepare;
  o.prepare_arg = plan; /* the driver's from here, even on failure */
  o.prepare_free = plan_free;
  o.env = env; /* copied by the driver */
  o.context = late ? NULL : context;
  o.context_len = context_len;
  o.context_at = CHILD_CONTEXT_FD - 3;
  o.claim_uid = plan->as_root;
  o.uid_first = uid_first;
  o.uid_count = uid_count;
  o.max_line = max_line;
  o.max_rss = max_rss;
  o.max_files = max_files;
  o.rss_interval_ms = interval;
  o.cgroup = use_cgroup;
  u->d = rlm_driver_start(&o, err, sizeof(err));
  if (u->d == NULL) {
    close_fd(&u->late_fd);
    return fail(L, err);
  }
  if (!late) {
    /* The keeper reads the context off this thread: the string stays. */
    lua_getfield(L, 1, "context");
    u->ctx_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  return 1;
}

/* core.sandbox_argv(spec) -> {argv...}: the command line spawn would use,
 * for tests and for the curious, with the driver bound from its path and
 * nothing staged. */
static int core_sandbox_argv(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  rlm_sandbox_spec spec;
  read_spec(L, &spec);
  spec.workdir_bytes = (uint64_t)opt_integer(L, 1, "workdir_bytes", 1 << 28);
  rlm_argv argv = {0};
  char err[512];
  if (rlm_sandbox_argv(&spec, &argv, err, sizeof(err)) != 0)
    return fail(L, err);
  return push_argv(L, &argv);
}
