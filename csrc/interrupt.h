/* interrupt.h: SIGINT during a blocking wait of run() and step(). The
 * standalone interpreters (lua.c, luajit.c) answer SIGINT with a hook that
 * raises "interrupted!" at the next Lua instruction, but while the host
 * waits in a libuv loop no instruction runs, and libuv goes back to its
 * epoll_wait after EINTR: the wait would last until its timeout. While
 * armed, SIGINT runs the handler that was there as it always did (it is
 * called from ours, with its own flags and mask), and then wakes the loop
 * of the waiting driver through an async handle, which a signal handler may
 * do (uv_async_send). Whether that SIGINT ends the wait is for rlm.core to
 * say (a hook the handler set: see core.c's interrupt_asked).
 *
 * Only a handler is chained: with SIG_DFL the signal ends the process as it
 * always did, and with SIG_IGN nothing happens. One wait at a time in the
 * process: a wait while another one is armed (another thread's) does not
 * arm. */
#ifndef RLM_INTERRUPT_H
#define RLM_INTERRUPT_H

#include <uv.h>

#include "unit.h"

/* Chains our handler in front of SIGINT's when that is a handler, to wake
 * `wake` once it has run. Returns 1 when armed (disarm it), else 0: the
 * disposition is not a handler, another wait is armed, or sigaction failed
 * (the wait then is as it was: only its timeout or an event ends it). */
RLM_FN int rlm_interrupt_arm(uv_async_t *wake);

/* Puts back the sigaction saved by arm, exactly, unless the disposition is
 * no longer ours: the handler changed it while it ran (lua.c's resets it to
 * SIG_DFL, so that a second SIGINT ends the process), or SA_RESETHAND did.
 * SIGINT is blocked meanwhile, so that one that comes then finds the
 * disposition it will have. */
RLM_FN void rlm_interrupt_disarm(void);

#endif
