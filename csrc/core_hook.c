/* core_hook.c: core.hook_state()'s token, what run() and step() hold so
 * that a SIGINT ends their waits (d:wait, d:poll, w:wait). */
#define _GNU_SOURCE
#include "core.h"
#include "interrupt.h"

#include <signal.h>

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

static hook_state *check_hook(lua_State *L) {
  return luaL_checkudata(L, 1, HOOK_MT);
}

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
  hook_state *h = check_hook(L);
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
  const hook_state *before = check_hook(L);
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

void open_hook(lua_State *L) {
  luaL_newmetatable(L, HOOK_MT);
  lua_pushcfunction(L, core_hook_release);
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
}
