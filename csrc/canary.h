/* canary.h: things on the host the sandbox must not reach, planted for the
 * start-up self-test: a file in the user's home, a TCP listener on
 * 127.0.0.1, a path and an abstract unix socket, a descriptor leaked without
 * O_CLOEXEC. */
#ifndef RLM_CANARY_H
#define RLM_CANARY_H

#include "unit.h"

#include <limits.h>

/* The leaked descriptor's least number: above every number a sandbox is
 * handed (0..2 and 3 + MAX_INHERIT, keeper.c checks), so that the
 * self-test's look at that number never finds one of the driver's own. */
#define RLM_CANARY_FD_MIN 32

typedef struct rlm_canaries {
  char secret[40];          /* written into the home file */
  char home_file[PATH_MAX]; /* "" when $HOME is not writable */
  char unix_path[108];
  char abstract_name[64]; /* without the leading NUL */
  int tcp_port;
  int leaked_fd; /* not close-on-exec, on purpose; >= RLM_CANARY_FD_MIN */
  int lock_fd;   /* holds a lock on home_file while this process lives */
  int fds[3];    /* tcp, unix, abstract listeners */
} rlm_canaries;

/* Plants what can be planted (a failing piece is left out: -1 or ""), under
 * dir for the unix socket. The first plant of a process in a directory also
 * removes the canaries a killed host left there (rlm_canaries_sweep). */
RLM_FN void rlm_canaries_plant(rlm_canaries *c, const char *home,
                               const char *dir);
/* The leaked descriptor is needed only across the spawn: closing it then
 * keeps the host's other children (a host may spawn while a session boots)
 * from inheriting it. */
RLM_FN void rlm_canaries_close_leaked(rlm_canaries *c);
RLM_FN void rlm_canaries_remove(rlm_canaries *c);
/* Removes from dir the canaries whose host is gone, and returns how many:
 * a home file nobody holds a lock on, a socket nobody listens on, both ours
 * and older than a few seconds (the time between a plant's create and its
 * lock or listen). */
RLM_FN int rlm_canaries_sweep(const char *dir);

#endif
