/* core.h: what the binding files of rlm.core share (core.c, the module
 * table and its stateless functions; core_driver.c and core_spawn.c, the
 * Driver userdata and what makes one; core_hook.c, the SIGINT token;
 * core_canaries.c; core_waitset.c): the userdata's metatable names, the
 * Driver's state, and the few helpers more than one of them calls. */
#ifndef RLM_CORE_H
#define RLM_CORE_H

#include "compat.h"
#include "driver.h"
#include "unit.h"

#define DRIVER_MT "rlm.core.Driver"
#define CANARIES_MT "rlm.core.Canaries"
#define WAITSET_MT "rlm.core.Waitset"
typedef struct driver_ud {
  rlm_driver *d;
  int ctx_ref; /* the context string, in the registry while the driver's
                  keeper may read it; LUA_NOREF */
  int late_fd; /* late_context: the writable end of the child's empty
                  context memfd, until write_context seals it; -1 */
  struct late_writer *writer; /* a large late context being written off
                                 the Lua thread; NULL */
} driver_ud;

/* A hook_state is core.hook_state()'s token (core_hook.c). */
typedef struct hook_state hook_state;

/* nil, msg: a runtime failure's two results. */
RLM_FN int fail(lua_State *L, const char *msg);
/* Closes *fd if it is open, and makes it -1. */
RLM_FN void close_fd(int *fd);
/* See core_hook.c. */
RLM_FN int interrupt_asked(lua_State *L, const hook_state *before);
RLM_FN const hook_state *opt_hook_token(lua_State *L, int i);

#endif
