/* cgroup.h: a memory and pids cgroup for one sandbox, where the host may
 * make one: cgroup v2 when its own cgroup delegates the memory controller,
 * or the v1 memory controller (as root). The kernel then enforces
 * max_rss_bytes on every process of the sandbox and on all of its memory,
 * tmpfs and shm included. */
#ifndef RLM_CGROUP_H
#define RLM_CGROUP_H

#include "unit.h"

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct rlm_cgroup {
  int version;         /* 0: none, 1 or 2 */
  char mem[PATH_MAX];  /* the memory cgroup directory */
  char pids[PATH_MAX]; /* v1: the pids cgroup directory, or "" */
} rlm_cgroup;

/* Makes a cgroup named `name` below the host's own, limited to `limit`
 * bytes (no swap) and `pids_max` tasks. cg->version says whether one was
 * made: no cgroup is not an error, the poll then stands alone. */
RLM_FN void rlm_cgroup_create(rlm_cgroup *cg, const char *name, uint64_t limit,
                              int pids_max);

/* Moves a process (all its threads) into the cgroup. Returns 0 or -1. */
RLM_FN int rlm_cgroup_add(const rlm_cgroup *cg, pid_t pid);

/* Whether pid is in the cgroup. */
RLM_FN int rlm_cgroup_holds(const rlm_cgroup *cg, pid_t pid);

/* The peak memory charged to the cgroup, and how many times the kernel's
 * OOM killer acted in it. */
RLM_FN uint64_t rlm_cgroup_peak(const rlm_cgroup *cg);
RLM_FN uint64_t rlm_cgroup_oom_kills(const rlm_cgroup *cg);

/* Kills everything in it (v2: cgroup.kill) and removes it once empty. */
RLM_FN void rlm_cgroup_remove(rlm_cgroup *cg);

#endif
