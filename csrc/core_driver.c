/* core_driver.c: the Driver userdata over driver.c: its lines in and out
 * (send, poll, wait, and fd and timeout for a host's own loop), its
 * control (kill, interrupt, the step deadline) and its close, and the
 * metatable, with the methods of core_inspect.c (what it tells of
 * its sandbox), core_stream.c (a stream's own) and core_context.c (its
 * context). core_spawn.c makes one. */
#define _GNU_SOURCE
#include "core.h"
#include "driver.h"
#include "jsonscan.h"

#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>
#include <uv.h>

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

/* d:poll(timeout_ms[, max_values[, held[, token]]]) -> kind, ... | nil
 *   "line", text | "exit", status, signal, stderr_tail | "timeout" |
 *   "memory", peak_bytes | "files", files | "overflow" | "dense", values |
 *   "failed", message (the start failed: nothing ran) | "silent" (a
 *   stream's far side left its heartbeat's ping unanswered: killed)
 * A line that could decode to more than max_values JSON values is not made
 * a Lua string: "dense" says how many it holds (at least). With `held`, only
 * what the driver holds already is taken: the pipes are not looked at.
 * With a token of core.hook_state(), "interrupted" when
 * a SIGINT asked the state to stop since it was taken (interrupt_asked). */
static int driver_poll(lua_State *L) {
  driver_ud *u = check_driver(L);
  int timeout = (int)luaL_optinteger(L, 2, -1);
  lua_Integer max_values = luaL_optinteger(L, 3, 0);
  rlm_event *ev = NULL;
  if (lua_toboolean(L, 4))
    ev = rlm_driver_take(u->d);
  else if (driver_wait_for(L, u->d, timeout, opt_hook_token(L, 5))) {
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
  if (ev->kind == RLM_EV_LINE && u->stream)
    u->lines_in++; /* the keeper numbers them alike (its replay) */
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

/* d:interrupt() -> true | false: SIGINT to the driver's interpreter, which
 * turns it into an exception in the REPL's code. Only that one process:
 * bubblewrap's own would die of it. false when no such process runs or the
 * signal could not be sent. */
static int driver_interrupt(lua_State *L) {
  int pid = rlm_driver_interpreter_pid(check_driver(L)->d);
  lua_pushboolean(L, pid > 0 && kill(pid, SIGINT) == 0);
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
    {"set_deadline", driver_set_deadline},
    {"deadline_passed", driver_deadline_passed},
    {"fd", driver_fd},
    {"timeout", driver_timeout},
    {"close", driver_close},
    {NULL, NULL},
};

void open_driver(lua_State *L) {
  luaL_newmetatable(L, DRIVER_MT);
  luaL_newlib(L, driver_methods);
  add_inspect_methods(L);
  add_stream_methods(L);
  add_context_methods(L);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, driver_close);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, driver_close);
  lua_setfield(L, -2, "__close");
  lua_pushcfunction(L, driver_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
}
