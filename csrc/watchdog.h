/* watchdog.h: the memory of a whole process tree, read from /proc. */
#ifndef RLM_WATCHDOG_H
#define RLM_WATCHDOG_H

#include "unit.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* What tells a poll that no process of a tree has run since the last
 * measure: its processes, each with one thread, each one's
 * /proc/PID/schedstat kept open (a read of it is one system call, and it
 * names that process for as long as it is open: a reused pid cannot stand
 * in for it), and the nanoseconds each had run on a CPU before that
 * measure read it. A process that has not run has mapped, touched, forked
 * and written nothing since. n is 0 when the measure found nothing to
 * compare by (more processes, or one with a thread more). Zeroed, it holds
 * nothing; rlm_tree_still_clear closes what it holds. */
#define RLM_TREE_STILL_MAX 8
typedef struct rlm_tree_still {
  size_t n;
  int fds[RLM_TREE_STILL_MAX];
  uint64_t ran_ns[RLM_TREE_STILL_MAX];
} rlm_tree_still;

RLM_FN void rlm_tree_still_clear(rlm_tree_still *still);

/* Sums the resident anonymous and shared-memory bytes of root and all its
 * descendants (the sandbox launcher, its init and the interpreter below
 * them), and fills still (when not NULL, what it held cleared first) for
 * rlm_tree_ran. Returns 0 when root is gone. */
RLM_FN uint64_t rlm_tree_rss(pid_t root, rlm_tree_still *still);

/* 0 when no process of still's has run since it was filled; 1 when one
 * has, or is gone, or nothing says (n 0, no schedstat). */
RLM_FN int rlm_tree_ran(const rlm_tree_still *still);

/* Lists root and its descendants, parents before children, into pids (at
 * most max). Returns how many. */
RLM_FN size_t rlm_tree_pids(pid_t root, pid_t *pids, size_t max);

#endif
