/* waitset.h: one descriptor that is readable whenever any of a changing set
 * of descriptors is: an epoll set, level-triggered. A session hands it to
 * the host's loop once and keeps it for life, while the processes behind it
 * (the interpreter probe, the sandbox, nested sessions) come and go. */
#ifndef RLM_WAITSET_H
#define RLM_WAITSET_H

#include "unit.h"

/* Returns the set's descriptor (close-on-exec), or -1 with errno set. */
RLM_FN int rlm_waitset_open(void);
/* Adds or removes fd (readable interest). 0, or -1 with errno set. */
RLM_FN int rlm_waitset_add(int set, int fd);
RLM_FN int rlm_waitset_remove(int set, int fd);
/* Waits until some descriptor of the set is readable or timeout_ms pass
 * (-1: no limit). 1 when one is, 0 on timeout or a signal, -1 with errno
 * set. */
RLM_FN int rlm_waitset_wait(int set, int timeout_ms);

#endif
