/* interrupt.h: SIGINT during a blocking wait of run() and step(). The
 * standalone interpreters (lua.c, luajit.c) answer SIGINT with a hook that
 * raises "interrupted!" at the next Lua instruction, but while the host
 * waits in a libuv loop no instruction runs, and libuv goes back to its
 * epoll_wait after EINTR: the wait would last until its timeout.
 *
 * While armed (for one run() or step(), rlm.blocking), SIGINT runs the
 * handler that was there as it always did (it is called from ours, with
 * its own flags and mask), counts, and then, when a wait has set a wake
 * handle, wakes that driver's loop through it, which a signal handler may
 * do (uv_async_send). Arming costs two sigaction calls and disarming four
 * per run, not per wait: a wait only stores its handle. Whether a SIGINT
 * ends the wait is for rlm.core to say (a hook the handler set: see core.c's
 * interrupt_asked).
 *
 * Only a handler is chained: with SIG_DFL the signal ends the process as it
 * always did, and with SIG_IGN nothing happens. One arming at a time in the
 * process: a run while another is armed (nested in its callback, or another
 * thread's) does not arm, and its waits wake through the first one's. */
#ifndef RLM_INTERRUPT_H
#define RLM_INTERRUPT_H

#include <uv.h>

#include "unit.h"

/* Chains our handler in front of SIGINT's when that is a handler. Returns
 * 1 when armed (disarm it), else 0: the disposition is not a handler, it is
 * armed already, or sigaction failed (the waits then are as they were: only
 * their timeout or an event ends them). */
RLM_FN int rlm_interrupt_arm(void);

/* Puts back the sigaction saved by arm, exactly, unless the disposition is
 * no longer ours: the handler changed it while it ran (lua.c's resets it to
 * SIG_DFL, so that a second SIGINT ends the process), SA_RESETHAND did, or
 * a callback installed its own. SIGINT is blocked meanwhile, so that one
 * that comes then finds the disposition it will have. */
RLM_FN void rlm_interrupt_disarm(void);

/* The handle a SIGINT wakes from now (NULL: none), for one wait. */
RLM_FN void rlm_interrupt_wake(uv_async_t *wake);

/* How many SIGINTs the armed handler has seen: a wait that reads it before
 * it sets its handle knows whether one came in between. */
RLM_FN unsigned rlm_interrupt_count(void);

#endif
