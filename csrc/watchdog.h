/* watchdog.h: the memory of a whole process tree, read from /proc. */
#ifndef RLM_WATCHDOG_H
#define RLM_WATCHDOG_H

#include "unit.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Sums the resident anonymous and shared-memory bytes of root and all its
 * descendants (the sandbox launcher, its init and the interpreter below
 * them). Returns 0 when root is gone. */
RLM_FN uint64_t rlm_tree_rss(pid_t root);

/* Lists root and its descendants, parents before children, into pids (at
 * most max). Returns how many. */
RLM_FN size_t rlm_tree_pids(pid_t root, pid_t *pids, size_t max);

#endif
