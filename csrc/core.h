/* core.h: what the binding files of rlm.core share (core.c, the module
 * table and its stateless functions; core_driver.c, the Driver userdata;
 * core_spawn.c, what makes a sandbox's Driver, and core_stream.c, the
 * Drivers with no sandbox and a stream's methods; core_inspect.c and
 * core_context.c, the Driver's methods by job; core_hook.c, the SIGINT
 * token; core_canaries.c; core_waitset.c; core_journal.c, the journal's
 * file store): the Driver's metatable name and state, each userdata's
 * metatable maker, and the few helpers more than one of them calls. */
#ifndef RLM_CORE_H
#define RLM_CORE_H

#include "compat.h"
#include "driver.h"
#include "unit.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#define DRIVER_MT "rlm.core.Driver"
#define SEALED_MT "rlm.core.Sealed"
#define ZIP_CACHE "rlm.core.zip"     /* { zip string, Sealed } */
#define ENTRY_CACHE "rlm.core.entry" /* { bytecode string, Sealed } */

/* A large late context's writer, a thread of its own (core_context.c). */
typedef struct late_writer {
  pthread_t thread;
  int fd;
  const char *data;
  size_t len;
  atomic_int done;   /* the thread is over */
  atomic_int cancel; /* close(): stop after the slice being written */
  int err;           /* errno of what failed; 0 */
} late_writer;

typedef struct driver_ud {
  rlm_driver *d;
  int ctx_ref; /* the context string, in the registry while the driver's
                  keeper may read it; LUA_NOREF */
  int late_fd; /* late_context: the writable end of the child's empty
                  context memfd, until write_context seals it; -1 */
  struct late_writer *writer; /* a large late context being written off
                                 the Lua thread; NULL */
  int stream;                 /* core.stream's: lines come and go on channels */
  int raw_ref;       /* a stream's raw bytes (d:send_raw), in the registry until
                        written; LUA_NOREF */
  uint64_t lines_in; /* a stream's lines taken by poll, on any channel */
} driver_ud;

/* A hook_state is core.hook_state()'s token (core_hook.c). */
typedef struct hook_state hook_state;

/* nil, msg: a runtime failure's two results. */
RLM_FN int fail(lua_State *L, const char *msg);
/* Closes *fd if it is open, and makes it -1. */
RLM_FN void close_fd(int *fd);
/* Non-zero when a SIGINT asked the state to stop since the token `before`
 * was taken (core_hook.c says how it is told); the token at index i, or
 * NULL (the wait is not interruptible). */
RLM_FN int interrupt_asked(lua_State *L, const hook_state *before);
RLM_FN const hook_state *opt_hook_token(lua_State *L, int i);

/* The Sealed userdata's __gc (core_spawn.c): a shared sealed memfd of
 * plan.h's, the driver's zip or its entry's bytecode. */
RLM_FN int blob_gc(lua_State *L);

/* The Driver at index 1, raising when it is closed (core_driver.c). */
RLM_FN driver_ud *check_driver(lua_State *L);
/* core_context.c's: lets go of the context string once the keeper is done
 * with it; joins a late context's writer (after at most one slice when
 * cancelled) and returns its errno. */
RLM_FN void release_context(lua_State *L, driver_ud *u);
RLM_FN int late_writer_join(lua_State *L, driver_ud *u);
/* core_stream.c's: lets go of a stream's raw bytes once they are written
 * (force: now, the loop and its write queue being gone). */
RLM_FN void release_raw(lua_State *L, driver_ud *u, int force);
/* The Driver's methods kept by other files than core_driver.c, set into
 * the table at the top (its __index) by open_driver. */
RLM_FN void add_inspect_methods(lua_State *L);
RLM_FN void add_stream_methods(lua_State *L);
RLM_FN void add_context_methods(lua_State *L);

/* Each userdata's metatable, made once at luaopen_rlm_core. */
RLM_FN void open_driver(lua_State *L);
RLM_FN void open_hook(lua_State *L);
RLM_FN void open_canaries(lua_State *L);
RLM_FN void open_waitset(lua_State *L);

#endif
