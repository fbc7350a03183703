/* core_context.c: a Driver's context. The string the keeper reads at the
 * start stays in the registry until it is done (release_context); a
 * late_context spawn's context is written into its memfd and sealed by
 * d:write_context, a large one on a thread of its own (d:context_written
 * says when it is over; close() cancels and joins it). */
#define _GNU_SOURCE
#include "core.h"
#include "driver.h"
#include "workdir.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A large late context is written and sealed on a thread of its own, in
 * slices, so that the host's loop goes on; the string stays in the registry
 * (ctx_ref) until the thread is joined. */
#define LATE_INLINE_MAX (1u << 20)
#define LATE_SLICE (1u << 20)

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

static const luaL_Reg context_methods[] = {
    {"write_context", driver_write_context},
    {"context_written", driver_context_written},
    {NULL, NULL},
};

/* Sets d:write_context and d:context_written into the Driver's
 * methods (the table at the top). */
void add_context_methods(lua_State *L) { luaL_setfuncs(L, context_methods, 0); }
