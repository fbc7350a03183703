/* core.c: the rlm.core Lua module: the Driver userdata over driver.c, the
 * sandbox command line, and two small text helpers. Misuse raises; runtime
 * failures return nil and a message. */
#define _GNU_SOURCE
#include "canary.h"
#include "compat.h"
#include "driver.h"
#include "interrupt.h"
#include "jsonscan.h"
#include "plan.h"
#include "sandbox.h"
#include "seccomp.h"
#include "uid.h"
#include "utf8.h"
#include "waitset.h"
#include "workdir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define DRIVER_MT "rlm.core.Driver"
#define CANARIES_MT "rlm.core.Canaries"
#define WAITSET_MT "rlm.core.Waitset"
#define MAX_RO_PATHS 4096

/* The driver sees a fixed environment: nothing of the host's. */
static char *const sandbox_env[] = {
    "PATH=/usr/bin:/bin",        "LANG=C.UTF-8", "PYTHONUTF8=1",
    "HOME=" RLM_SANDBOX_WORKDIR, NULL,
};

typedef struct driver_ud {
  rlm_driver *d;
  int ctx_ref; /* the context string, in the registry while the driver's
                  keeper may read it; LUA_NOREF */
  int late_fd; /* late_context: the writable end of the child's empty
                  context memfd, until write_context seals it; -1 */
  struct late_writer *writer; /* a large late context being written off
                                 the Lua thread; NULL */
} driver_ud;

/* A large late context is written and sealed on a thread of its own, in
 * slices, so that the host's loop goes on; the string stays in the registry
 * (ctx_ref) until the thread is joined. */
#define LATE_INLINE_MAX (1u << 20)
#define LATE_SLICE (1u << 20)
typedef struct late_writer {
  pthread_t thread;
  int fd;
  const char *data;
  size_t len;
  atomic_int done;   /* the thread is over */
  atomic_int cancel; /* close(): stop after the slice being written */
  int err;           /* errno of what failed; 0 */
} late_writer;

static void *late_writer_main(void *arg) {
  late_writer *w = arg;
  size_t off = 0;
  while (w->err == 0 && off < w->len) {
    if (atomic_load(&w->cancel)) {
      w->err = ECANCELED;
      break;
    }
    size_t n = w->len - off > LATE_SLICE ? LATE_SLICE : w->len - off;
    if (rlm_context_append(w->fd, w->data + off, n) != 0)
      w->err = errno;
    off += n;
  }
  if (w->err == 0 && rlm_context_seal(w->fd) != 0)
    w->err = errno;
  atomic_store(&w->done, 1);
  return NULL;
}

/* Joins the writer (after at most one slice when cancelled), lets go of the
 * string and the descriptor; returns the writer's errno. */
static int late_writer_join(lua_State *L, driver_ud *u) {
  late_writer *w = u->writer;
  (void)pthread_join(w->thread, NULL);
  int e = w->err;
  free(w);
  u->writer = NULL;
  if (u->late_fd >= 0) {
    close(u->late_fd);
    u->late_fd = -1;
  }
  if (u->ctx_ref != LUA_NOREF) {
    luaL_unref(L, LUA_REGISTRYINDEX, u->ctx_ref);
    u->ctx_ref = LUA_NOREF;
  }
  return e;
}

/* Lets go of the context string once the keeper is done with it. */
static void release_context(lua_State *L, driver_ud *u) {
  if (u->ctx_ref != LUA_NOREF && u->writer == NULL &&
      (u->d == NULL || rlm_driver_context_done(u->d))) {
    luaL_unref(L, LUA_REGISTRYINDEX, u->ctx_ref);
    u->ctx_ref = LUA_NOREF;
  }
}

static driver_ud *check_driver(lua_State *L) {
  driver_ud *u = luaL_checkudata(L, 1, DRIVER_MT);
  if (u->d == NULL)
    luaL_argerror(L, 1, "driver is closed");
  return u;
}

static int fail(lua_State *L, const char *msg) {
  lua_pushnil(L);
  lua_pushstring(L, msg);
  return 2;
}

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

static void close_fd(int *fd) {
  if (*fd >= 0) {
    close(*fd);
    *fd = -1;
  }
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
 *            workdir_files=, uid_first=, uid_count=}
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

  driver_ud *u = lua_newuserdata(L, sizeof(*u));
  u->d = NULL;
  u->ctx_ref = LUA_NOREF;
  u->late_fd = -1;
  u->writer = NULL;
  luaL_getmetatable(L, DRIVER_MT);
  lua_setmetatable(L, -2);

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
  o.env = sandbox_env;
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
static int core_helper(lua_State *L) {
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
  driver_ud *u = lua_newuserdata(L, sizeof(*u));
  u->d = NULL;
  u->ctx_ref = LUA_NOREF;
  u->late_fd = -1;
  u->writer = NULL;
  luaL_getmetatable(L, DRIVER_MT);
  lua_setmetatable(L, -2);
  rlm_driver_opts o;
  memset(&o, 0, sizeof(o));
  o.argv = argv;
  o.env = lua_touserdata(L, env_index);
  o.max_line = max_bytes;
  char err[512];
  u->d = rlm_driver_start(&o, err, sizeof(err));
  if (u->d == NULL)
    return fail(L, err);
  rlm_driver_set_deadline(u->d, (uint64_t)timeout);
  return 1;
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
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &len);
  if (len % 4 != 0)
    return 0;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (size_t i = 0; i < len; i += 4) {
    unsigned v = 0;
    int pad = 0;
    for (int k = 0; k < 4; k++) {
      unsigned char c = s[i + k];
      int x = c >= 'A' && c <= 'Z'   ? c - 'A'
              : c >= 'a' && c <= 'z' ? c - 'a' + 26
              : c >= '0' && c <= '9' ? c - '0' + 52
              : c == '+'             ? 62
              : c == '/'             ? 63
                                     : -1;
      if (c == '=' && i + 4 == len && k >= 2 && (k == 3 || s[i + 3] == '=')) {
        pad++;
        x = 0;
      } else if (x < 0 || pad > 0) {
        return 0;
      }
      v = v << 6 | (unsigned)x;
    }
    char out[3] = {(char)(v >> 16), (char)(v >> 8 & 0xff), (char)(v & 0xff)};
    luaL_addlstring(&b, out, 3 - (size_t)pad);
  }
  luaL_pushresult(&b);
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

static int driver_send(lua_State *L) {
  driver_ud *u = check_driver(L);
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  if (rlm_driver_send(u->d, s, len) != 0)
    return fail(L, "the driver cannot take input");
  lua_pushboolean(L, 1);
  return 1;
}

/* d:send_result(id, text) -> true | nil, message: the llm_result line
 * {"type":"llm_result","id":id,"text":text}, written from its parts (the
 * text as it is when it needs no escape) without making it a Lua string. */
static int driver_send_result(lua_State *L) {
  driver_ud *u = check_driver(L);
  lua_Integer id = luaL_checkinteger(L, 2);
  size_t len;
  const char *text = luaL_checklstring(L, 3, &len);
  char head[64];
  int n = snprintf(head, sizeof(head),
                   "{\"type\":\"llm_result\",\"id\":%lld,"
                   "\"text\":\"",
                   (long long)id);
  size_t escaped = rlm_json_escaped_len(text, len);
  if (escaped > MAX_WRITE_QUEUE)
    return fail(L, "the driver cannot take input");
  char *copy = NULL;
  if (escaped != len) {
    if ((copy = malloc(escaped)) == NULL)
      return fail(L, "out of memory");
    rlm_json_escape(text, len, copy);
  }
  uv_buf_t parts[3] = {
      uv_buf_init(head, (unsigned)n),
      uv_buf_init(copy ? copy : (char *)text, (unsigned)escaped),
      uv_buf_init("\"}", 2)};
  int rc = rlm_driver_sendv(u->d, parts, 3);
  free(copy);
  if (rc != 0)
    return fail(L, "the driver cannot take input");
  lua_pushboolean(L, 1);
  return 1;
}

static const char *event_name(rlm_event_kind k) {
  switch (k) {
  case RLM_EV_LINE:
    return "line";
  case RLM_EV_EXIT:
    return "exit";
  case RLM_EV_TIMEOUT:
    return "timeout";
  case RLM_EV_MEMORY:
    return "memory";
  case RLM_EV_OVERFLOW:
    return "overflow";
  case RLM_EV_FILES:
    return "files";
  case RLM_EV_FAILED:
    return "failed";
  }
  return "unknown";
}

/* SIGINT under run() and step(). The standalone interpreters' handler asks
 * the Lua state to stop by setting a hook on its main thread (lua.c's and
 * luajit.c's raise "interrupted!" from it at the next instruction). run()
 * and step() take the hook as they start (core.hook_state(), a token), and
 * an interruptible wait (d:wait, d:poll and w:wait given that token) compares
 * the hook before and after it with the token's: a hook that appeared since
 * is that request, whether it came during the wait or before it (during a
 * model callback, in a coroutine the main thread's hook does not reach).
 * The token also arms the handler that wakes the waits (csrc/interrupt.h)
 * for the run, and core.hook_release(token) disarms it as the run ends. It
 * is then taken off and kept in the registry, the wait returns
 * "interrupted", and rlm.blocking closes the session before
 * core.reraise_interrupt() puts the hook back, so that the interpreter's
 * own error is raised out of run() with the sandbox gone, not at whatever
 * instruction (inside the engine's coroutine, or before the close) came
 * first. A handler that sets no hook (the host's own) leaves the wait to go
 * on. */
typedef struct hook_state {
  lua_State *thread;
  lua_Hook hook;
  int mask, count;
  /* The token's only: */
  int sigint_handled; /* SIGINT ran a handler */
  int armed;          /* this token armed csrc/interrupt.h's handler */
  unsigned seen;      /* rlm_interrupt_count() then */
} hook_state;

#define HOOK_MT "rlm.core.HookState"

static const char MAIN_THREAD_KEY = 0;  /* PUC 5.1: the main thread */
static const char STASHED_HOOK_KEY = 0; /* the hook taken off, a hook_state */

/* The thread whose hook a SIGINT handler sets: the main thread (LuaJIT's
 * hook is the state's, whichever thread asks). */
static lua_State *hook_thread(lua_State *L) {
#if LUA_VERSION_NUM >= 502
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
#else
  lua_pushlightuserdata(L, (void *)&MAIN_THREAD_KEY);
  lua_rawget(L, LUA_REGISTRYINDEX);
#endif
  lua_State *main = lua_tothread(L, -1);
  lua_pop(L, 1);
  return main != NULL ? main : L;
}

static void hook_get(lua_State *L, hook_state *h) {
  h->thread = hook_thread(L);
  h->hook = lua_gethook(h->thread);
  h->mask = lua_gethookmask(h->thread);
  h->count = lua_gethookcount(h->thread);
  h->sigint_handled = 0;
}

/* Whether SIGINT is at SIG_DFL now (sigaction failing: it is not known to
 * be, 0). */
static int sigint_default(void) {
  struct sigaction cur;
  return sigaction(SIGINT, NULL, &cur) == 0 && cur.sa_handler == SIG_DFL;
}

/* Around an interruptible wait: 1 when a hook appeared on the main thread
 * since `before` (the handler's request), which is then stashed and taken
 * off (the thread gets `before`'s hook back); 2 when there is no such hook
 * but SIGINT went from a handler to SIG_DFL since, as the interpreters'
 * handler leaves it: its hook has been and gone already (LuaJIT's hook is
 * the state's, and a model callback that was running raised it). */
static int interrupt_asked(lua_State *L, const hook_state *before) {
  hook_state now;
  hook_get(L, &now);
  if (now.hook == NULL ||
      (now.hook == before->hook && now.mask == before->mask &&
       now.count == before->count))
    return before->sigint_handled && rlm_interrupt_count() != before->seen &&
                   sigint_default()
               ? 2
               : 0;
  hook_state *kept = lua_newuserdata(L, sizeof(*kept));
  *kept = now;
  lua_pushlightuserdata(L, (void *)&STASHED_HOOK_KEY);
  lua_insert(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);
  lua_sethook(now.thread, before->hook, before->mask, before->count);
  return 1;
}

/* core.hook_state() -> token: the main thread's hook now, for the waits,
 * with csrc/interrupt.h's handler armed (if SIGINT runs a handler) until
 * core.hook_release(token) or the token's collection. */
static int core_hook_state(lua_State *L) {
  hook_state *h = lua_newuserdata(L, sizeof(*h));
  hook_get(L, h);
  struct sigaction cur;
  h->sigint_handled = sigaction(SIGINT, NULL, &cur) == 0 &&
                      cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN;
  h->armed = 0;
  h->seen = rlm_interrupt_count();
  luaL_getmetatable(L, HOOK_MT);
  lua_setmetatable(L, -2);
  h->armed = h->sigint_handled && rlm_interrupt_arm();
  return 1;
}

/* core.hook_release(token): disarms what the token armed; also its __gc. */
static int core_hook_release(lua_State *L) {
  hook_state *h = luaL_checkudata(L, 1, HOOK_MT);
  if (h->armed) {
    h->armed = 0;
    rlm_interrupt_disarm();
  }
  return 0;
}

/* core.interrupted(token) -> true | false: whether a SIGINT asked the state
 * to stop since the token was taken (the hook, if there, is stashed as a
 * wait's is). */
static int core_interrupted(lua_State *L) {
  const hook_state *before = luaL_checkudata(L, 1, HOOK_MT);
  lua_pushboolean(L, interrupt_asked(L, before) != 0);
  return 1;
}

/* The token of core.hook_state() at index i, or NULL: not interruptible. */
static const hook_state *opt_hook_token(lua_State *L, int i) {
  return luaL_testudata(L, i, HOOK_MT);
}

/* core.reraise_interrupt() -> true | false: puts back the hook an
 * interruptible wait took off (its error comes at the next instruction of
 * the thread it is on); false when none was taken. */
static int core_reraise_interrupt(lua_State *L) {
  lua_pushlightuserdata(L, (void *)&STASHED_HOOK_KEY);
  lua_rawget(L, LUA_REGISTRYINDEX);
  hook_state *kept = lua_touserdata(L, -1);
  if (kept == NULL) {
    lua_pushboolean(L, 0);
    return 1;
  }
  hook_state h = *kept;
  lua_pushlightuserdata(L, (void *)&STASHED_HOOK_KEY);
  lua_pushnil(L);
  lua_rawset(L, LUA_REGISTRYINDEX);
  lua_sethook(h.thread, h.hook, h.mask, h.count);
  lua_pushboolean(L, 1);
  return 1;
}

/* rlm_driver_wait, and with a token (`before`: a SIGINT wakes it) until
 * the wait ends for another reason than a SIGINT that asked nothing of Lua.
 * Returns 1, without waiting or after, when a SIGINT asked the state to
 * stop since the token was taken (interrupt_asked). */
static int driver_wait_for(lua_State *L, rlm_driver *d, int timeout,
                           const hook_state *before) {
  if (before == NULL) {
    rlm_driver_wait(d, timeout, 0, 0);
    return 0;
  }
  unsigned seen = rlm_interrupt_count();
  if (interrupt_asked(L, before))
    return 1;
  uint64_t start = uv_hrtime();
  while (rlm_driver_wait(d, timeout, 1, seen)) {
    seen = rlm_interrupt_count();
    if (interrupt_asked(L, before))
      return 1;
    if (timeout > 0) {
      uint64_t spent = (uv_hrtime() - start) / 1000000;
      if (spent >= (uint64_t)timeout)
        return 0;
      timeout -= (int)spent;
      start = uv_hrtime();
    }
  }
  /* A SIGINT that came with the event: its hook is there all the same. */
  return interrupt_asked(L, before);
}

/* d:poll(timeout_ms[, max_values[, held]]) -> kind, ... | nil
 *   "line", text | "exit", status, signal, stderr_tail | "timeout" |
 *   "memory", peak_bytes | "files", files | "overflow" | "dense", values |
 *   "failed", message (the start failed: nothing ran)
 * A line that could decode to more than max_values JSON values is not made
 * a Lua string: "dense" says how many it holds (at least). With `held`, only
 * what the driver holds already is taken: the pipes are not looked at. With
 * `quick`, a lone llm_query line as the driver writes it comes decoded:
 * "query", prompt, id, busy (rlm_quick_query; any other line is a "line"),
 * busy saying what d:timeout() == 0 would: more is held, or a timer due.
 * With a token of core.hook_state() as `interruptible`, "interrupted" when
 * a SIGINT asked the state to stop since it was taken (interrupt_asked). */
static int driver_poll(lua_State *L) {
  driver_ud *u = check_driver(L);
  int timeout = (int)luaL_optinteger(L, 2, -1);
  lua_Integer max_values = luaL_optinteger(L, 3, 0);
  rlm_event *ev = NULL;
  if (lua_toboolean(L, 4))
    ev = rlm_driver_take(u->d);
  else if (driver_wait_for(L, u->d, timeout, opt_hook_token(L, 6))) {
    release_context(L, u);
    lua_pushliteral(L, "interrupted");
    return 1;
  } else
    ev = rlm_driver_take(u->d);
  release_context(L, u);
  if (ev == NULL)
    return 0;
  int n = 1;
  if (ev->kind == RLM_EV_LINE && max_values > 0) {
    size_t values = rlm_json_values(ev->data, ev->len, (size_t)max_values);
    if (values > (size_t)max_values) {
      rlm_driver_line_taken(u->d);
      lua_pushliteral(L, "dense");
      lua_pushinteger(L, (lua_Integer)values);
      return 2;
    }
  }
  char *prompt;
  size_t len;
  unsigned long id;
  if (ev->kind == RLM_EV_LINE && lua_toboolean(L, 5) &&
      rlm_quick_query(ev->data, ev->len, &prompt, &len, &id)) {
    lua_pushliteral(L, "query");
    lua_pushlstring(L, prompt, len);
    lua_pushinteger(L, (lua_Integer)id);
    rlm_driver_line_taken(u->d);
    lua_pushboolean(L, rlm_driver_backend_timeout(u->d) == 0);
    return 4;
  }
  lua_pushstring(L, event_name(ev->kind));
  switch (ev->kind) {
  case RLM_EV_LINE:
    lua_pushlstring(L, ev->data, ev->len);
    rlm_driver_line_taken(u->d);
    n = 2;
    break;
  case RLM_EV_EXIT:
    lua_pushinteger(L, (lua_Integer)ev->exit_status);
    lua_pushinteger(L, ev->term_signal);
    lua_pushlstring(L, ev->data ? ev->data : "", ev->len);
    n = 4;
    break;
  case RLM_EV_MEMORY:
  case RLM_EV_FILES:
    lua_pushnumber(L, (lua_Number)ev->peak_bytes);
    n = 2;
    break;
  case RLM_EV_FAILED:
    lua_pushlstring(L, ev->data ? ev->data : "", ev->len);
    n = 2;
    break;
  default:
    break;
  }
  rlm_event_free(ev);
  return n;
}

/* d:wait(timeout_ms[, token]) waits, as poll does, until an event
 * is there or timeout_ms pass (-1: no limit), and leaves it for poll: how
 * run() and step() wait while the driver is all the session watches
 * (rlm.engine). "interrupted" as d:poll's. */
static int driver_wait(lua_State *L) {
  driver_ud *u = check_driver(L);
  if (driver_wait_for(L, u->d, (int)luaL_optinteger(L, 2, -1),
                      opt_hook_token(L, 3))) {
    lua_pushliteral(L, "interrupted");
    return 1;
  }
  return 0;
}

static int driver_kill(lua_State *L) {
  rlm_driver_kill(check_driver(L)->d);
  return 0;
}

static int driver_set_deadline(lua_State *L) {
  driver_ud *u = check_driver(L);
  lua_Number ms = luaL_checknumber(L, 2);
  rlm_driver_set_deadline(u->d, ms > 0 ? (uint64_t)ms : 0);
  return 0;
}

static int driver_deadline_passed(lua_State *L) {
  lua_pushboolean(L, rlm_driver_deadline_passed(check_driver(L)->d));
  return 1;
}

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

/* d:interrupt() -> true | false: SIGINT to the driver's interpreter, which
 * turns it into an exception in the REPL's code. Only that one process:
 * bubblewrap's own would die of it. false when no such process runs or the
 * signal could not be sent. */
static int driver_interrupt(lua_State *L) {
  int pid = rlm_driver_interpreter_pid(check_driver(L)->d);
  lua_pushboolean(L, pid > 0 && kill(pid, SIGINT) == 0);
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

static int driver_fd(lua_State *L) {
  lua_pushinteger(L, rlm_driver_backend_fd(check_driver(L)->d));
  return 1;
}

static int driver_timeout(lua_State *L) {
  lua_pushinteger(L, rlm_driver_backend_timeout(check_driver(L)->d));
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

/* true, or nil and what errno e says went wrong with the context's write. */
static int context_written(lua_State *L, int e) {
  if (e != 0) {
    char err[128];
    snprintf(err, sizeof(err), "writing the context: %s", strerror(e));
    return fail(L, err);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* d:write_context(bytes) -> true | false (being written) | nil, message: a
 * late_context spawn's context, written into its memfd and sealed (no
 * write, grow, shrink or further seal); the host's writable descriptor is
 * closed after, so it is written once. Up to LATE_INLINE_MAX bytes on this
 * thread; more on a thread of its own: false, and d:context_written() says
 * when it is over. A seal that fails (EBUSY: a writable mapping) fails. */
static int driver_write_context(lua_State *L) {
  driver_ud *u = check_driver(L);
  size_t len;
  const char *data = luaL_checklstring(L, 2, &len);
  if (u->late_fd < 0 || u->writer != NULL)
    return fail(L, "this driver takes no late context (or took it)");
  int e = 0;
  if (len > LATE_INLINE_MAX) {
    late_writer *w = calloc(1, sizeof(*w));
    if (w == NULL)
      return fail(L, "writing the context: out of memory");
    w->fd = u->late_fd;
    w->data = data;
    w->len = len;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    e = pthread_create(&w->thread, NULL, late_writer_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e == 0) {
      lua_pushvalue(L, 2);
      u->ctx_ref = luaL_ref(L, LUA_REGISTRYINDEX);
      u->writer = w;
      lua_pushboolean(L, 0);
      return 1;
    }
    free(w);
  } else if (rlm_context_append(u->late_fd, data, len) != 0 ||
             rlm_context_seal(u->late_fd) != 0) {
    e = errno;
  }
  close_fd(&u->late_fd);
  return context_written(L, e);
}

/* d:context_written() -> true | false (still being written) | nil, message */
static int driver_context_written(lua_State *L) {
  driver_ud *u = check_driver(L);
  if (u->writer == NULL)
    return fail(L, "no context is being written");
  if (!atomic_load(&u->writer->done)) {
    lua_pushboolean(L, 0);
    return 1;
  }
  int e = late_writer_join(L, u);
  return context_written(L, e);
}

static int driver_close(lua_State *L) {
  driver_ud *u = luaL_checkudata(L, 1, DRIVER_MT);
  rlm_driver *d = u->d;
  u->d = NULL;
  if (u->writer != NULL) {
    atomic_store(&u->writer->cancel, 1);
    (void)late_writer_join(L, u);
  }
  close_fd(&u->late_fd);
  rlm_driver_close(d); /* never waits for the sandbox; the context is free */
  release_context(L, u);
  lua_pushboolean(L, 1);
  return 1;
}

static int driver_tostring(lua_State *L) {
  driver_ud *u = luaL_checkudata(L, 1, DRIVER_MT);
  if (u->d == NULL)
    lua_pushliteral(L, "rlm.core.Driver (closed)");
  else
    lua_pushfstring(L, "rlm.core.Driver (pid %d)", rlm_driver_pid(u->d));
  return 1;
}

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
  rlm_canaries *c = luaL_checkudata(L, 1, CANARIES_MT);
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
  rlm_canaries_close_leaked(luaL_checkudata(L, 1, CANARIES_MT));
  return 0;
}

static int canaries_remove(lua_State *L) {
  rlm_canaries_remove(luaL_checkudata(L, 1, CANARIES_MT));
  return 0;
}

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

static const luaL_Reg canaries_methods[] = {
    {"info", canaries_info},
    {"close_leaked", canaries_close_leaked},
    {"remove", canaries_remove},
    {NULL, NULL},
};

static const luaL_Reg driver_methods[] = {
    {"send", driver_send},
    {"poll", driver_poll},
    {"wait", driver_wait},
    {"kill", driver_kill},
    {"interrupt", driver_interrupt},
    {"interpreter_runs", driver_interpreter_runs},
    {"set_deadline", driver_set_deadline},
    {"deadline_passed", driver_deadline_passed},
    {"pid", driver_pid},
    {"adopt", driver_adopt},
    {"memory_mechanism", driver_memory_mechanism},
    {"oom_kills", driver_oom_kills},
    {"alive", driver_alive},
    {"peak_rss", driver_peak_rss},
    {"tree", driver_tree},
    {"foreign_fds", driver_foreign_fds},
    {"fd", driver_fd},
    {"timeout", driver_timeout},
    {"uid", driver_uid},
    {"exec_ms", driver_exec_ms},
    {"start_stamps", driver_start_stamps},
    {"send_result", driver_send_result},
    {"write_context", driver_write_context},
    {"context_written", driver_context_written},
    {"close", driver_close},
    {NULL, NULL},
};

static const luaL_Reg core_functions[] = {
    {"spawn", core_spawn},
    {"sandbox_argv", core_sandbox_argv},
    {"helper", core_helper},
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
    {"utf8_prefix", core_utf8_prefix},
    {"utf8_clean", core_utf8_clean},
    {"plant_canaries", core_plant_canaries},
    {NULL, NULL},
};

__attribute__((visibility("default"))) int luaopen_rlm_core(lua_State *L) {
  luaL_newmetatable(L, DRIVER_MT);
  luaL_newlib(L, driver_methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, driver_close);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, driver_close);
  lua_setfield(L, -2, "__close");
  lua_pushcfunction(L, driver_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  luaL_newmetatable(L, CANARIES_MT);
  luaL_newlib(L, canaries_methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, canaries_remove);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_newmetatable(L, SEALED_MT);
  lua_pushcfunction(L, blob_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_newmetatable(L, HOOK_MT);
  lua_pushcfunction(L, core_hook_release);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_newmetatable(L, WAITSET_MT);
  luaL_newlib(L, waitset_methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, waitset_close);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
#if LUA_VERSION_NUM < 502
  /* The thread a SIGINT handler sets its hook on (hook_thread), when this
   * is it: PUC 5.1 has no other way to it. */
  if (lua_pushthread(L)) {
    lua_pushlightuserdata(L, (void *)&MAIN_THREAD_KEY);
    lua_insert(L, -2);
    lua_rawset(L, LUA_REGISTRYINDEX);
  } else
    lua_pop(L, 1);
#endif
  luaL_newlib(L, core_functions);
  lua_pushliteral(L, "rlm.core 0.1");
  lua_setfield(L, -2, "_VERSION");
  return 1;
}
