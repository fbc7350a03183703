/* core_driver.c: the Driver userdata over driver.c: its methods, and the
 * late context written into a spawned sandbox. core_spawn.c makes one. */
#define _GNU_SOURCE
#include "core.h"
#include "driver.h"
#include "jsonscan.h"
#include "workdir.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

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

/* Lets go of a stream's raw bytes once they are written. */
static void release_raw(lua_State *L, driver_ud *u, int force) {
  if (u->raw_ref != LUA_NOREF &&
      (force || u->d == NULL || rlm_driver_raw_done(u->d))) {
    luaL_unref(L, LUA_REGISTRYINDEX, u->raw_ref);
    u->raw_ref = LUA_NOREF;
  }
}

static driver_ud *check_driver(lua_State *L) {
  driver_ud *u = luaL_checkudata(L, 1, DRIVER_MT);
  if (u->d == NULL)
    luaL_argerror(L, 1, "driver is closed");
  return u;
}

static void close_fd(int *fd) {
  if (*fd >= 0) {
    close(*fd);
    *fd = -1;
  }
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

/* d:send_keeper(line) -> true | nil, message: a stream's line on the
 * keeper's channel. */
static int driver_send_keeper(lua_State *L) {
  driver_ud *u = check_driver(L);
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  if (!u->stream)
    return luaL_argerror(L, 1, "not a stream");
  if (rlm_driver_send_on(u->d, 'K', s, len) != 0)
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
  case RLM_EV_SILENT:
    return "silent";
  }
  return "unknown";
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
 *   "failed", message (the start failed: nothing ran) | "silent" (a
 *   stream's far side left its heartbeat's ping unanswered: killed)
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
  release_raw(L, u, 0);
  if (ev == NULL)
    return 0;
  int n = 1;
  if (ev->kind == RLM_EV_LINE && u->stream) {
    /* A stream's line: the driver's (D) goes on as a line without its
     * channel byte; the keeper's own (K), or one on no channel, is said
     * apart. */
    if (ev->len == 0 || ev->data[0] != 'D') {
      lua_pushstring(L,
                     ev->len > 0 && ev->data[0] == 'K' ? "keeper" : "garbled");
      lua_pushlstring(L, ev->len > 0 ? ev->data + 1 : "",
                      ev->len > 0 ? ev->len - 1 : 0);
      rlm_driver_line_taken(u->d);
      return 2;
    }
    ev->data++;
    ev->len--;
  }
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
  release_raw(L, u, 1); /* close() freed the loop and its write queue */
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
    {"send_keeper", driver_send_keeper},
    {"send_raw", driver_send_raw},
    {"heartbeat", driver_heartbeat},
    {"write_context", driver_write_context},
    {"context_written", driver_context_written},
    {"close", driver_close},
    {NULL, NULL},
};

void open_driver(lua_State *L) {
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
}
