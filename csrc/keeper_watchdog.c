/* keeper_watchdog.c: the keeper thread's memory watchdog, its loop from
 * the sandbox's start to its end or a breach (what the sandbox's process
 * tree holds is watchdog.c's to measure). */
#define _GNU_SOURCE
#include "driver_impl.h"

/* A poll at least every WATCHDOG_FULL_POLLS measures in full, whatever
 * the run times say: what else may grow (a file the host writes into
 * /session) waits at most that many polls. */
#define WATCHDOG_FULL_POLLS 20

static uint64_t monotonic_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* The last full measure, for the polls that find nothing has run since. */
typedef struct watchdog_memo {
  rlm_tree_still still;
  uint64_t rss, files;
  unsigned polls; /* since the last full measure */
} watchdog_memo;

/* What the watchdog counts against max_rss: the resident memory of the
 * sandbox's processes plus what /session's tmpfs holds (where no cgroup
 * charges it, this is the only count of it); and the files in /session.
 * When no process of the sandbox has run on a CPU since the last full
 * measure, nothing of it can have grown: that measure stands (an idle
 * session's poll reads a few run times, not every status and /session),
 * and *fresh is 0. */
static uint64_t watchdog_measure(rlm_driver *d, uint64_t *files,
                                 watchdog_memo *m, int *fresh) {
  *fresh = !(m->polls > 0 && m->polls < WATCHDOG_FULL_POLLS &&
             !rlm_tree_ran(&m->still));
  if (!*fresh) {
    m->polls++;
    *files = m->files;
    return m->rss;
  }
  uint64_t rss = rlm_tree_rss(d->pid, &m->still), bytes = 0;
  *files = 0;
  if (d->seccomp_only
          ? rlm_workdir_walk(d->workdir, d->max_files, &bytes, files) == 0
          : rlm_workdir_usage(d->pid, &bytes, files) == 0)
    rss += bytes;
  m->rss = rss;
  m->files = *files;
  m->polls = 1;
  return rss;
}

/* Waits up to ms for the launcher's exit (its pid may then name another
 * process) or close() (its word on wake_fd). Returns nonzero when either
 * came, or the wait failed (then nothing of the pid is to be trusted). One
 * system call: an idle poll's sleep and its check of the launcher. */
static int watchdog_wait(rlm_driver *d, unsigned ms) {
  struct pollfd p[2] = {{.fd = d->pidfd, .events = POLLIN},
                        {.fd = d->wake_fd, .events = POLLIN}};
  uint64_t until = monotonic_ms() + ms;
  int n;
  for (;;) {
    uint64_t now = monotonic_ms();
    n = poll(p, 2, now < until ? (int)(until - now) : 0);
    if (n >= 0 || errno != EINTR)
      break;
  }
  return n != 0 || atomic_load(&d->closing);
}

/* Whether the launcher has exited, without waiting. */
static int launcher_exited(rlm_driver *d) { return watchdog_wait(d, 0); }

/* How long until the next poll: rss_interval_ms, or less when the memory
 * grows toward the limit: half the time the growth seen since the last
 * poll would take to reach it (at least WATCHDOG_MIN_MS), and a fifth of the
 * interval in the last eighth below the limit. So a steady climb is caught
 * within about WATCHDOG_MIN_MS of its growth; only a burst out of a flat
 * line can still run for a whole interval. */
#define WATCHDOG_MIN_MS 1
static unsigned watchdog_next_ms(rlm_driver *d, uint64_t rss,
                                 uint64_t *last_rss, uint64_t *last_ms) {
  uint64_t now = monotonic_ms();
  unsigned ms = d->rss_interval_ms;
  if (d->max_rss == 0)
    return ms; /* files only: no climb to watch */
  uint64_t headroom = d->max_rss > rss ? d->max_rss - rss : 0;
  if (*last_ms != 0 && rss > *last_rss && now > *last_ms) {
    /* bytes per ms since the last poll */
    uint64_t rate = (rss - *last_rss) / (now - *last_ms);
    if (rate > 0 && headroom / rate / 2 < ms)
      ms = (unsigned)(headroom / rate / 2);
  }
  if (headroom < d->max_rss / 8 && ms > d->rss_interval_ms / 5)
    ms = d->rss_interval_ms / 5;
  if (ms < WATCHDOG_MIN_MS)
    ms = WATCHDOG_MIN_MS;
  *last_rss = rss;
  *last_ms = now;
  return ms;
}

/* Polls the sandbox's memory every rss_interval_ms (sooner near the limit),
 * whatever the host's thread is doing. On a breach it kills the pid namespace's
 * init (the kernel then kills the rest), and the launcher too if that lingers;
 * the loop learns of it from the launcher's exit or its next poll. A
 * measurement counts only if the launcher was still alive after it: a
 * reaped pid may be another process's by then. */
static void watchdog_run(rlm_driver *d) {
  uint64_t last_rss = 0, last_ms = 0;
  watchdog_memo memo = {.polls = 0};
  unsigned ms = 0;
  while (!watchdog_wait(d, ms)) {
    uint64_t files;
    int fresh;
    uint64_t rss = watchdog_measure(d, &files, &memo, &fresh);
    /* A measure that stands was checked when it was made. */
    if (fresh && launcher_exited(d))
      break;
    atomic_store(&d->files_seen, files);
    uint64_t peak = atomic_load(&d->peak_rss);
    while (rss > peak &&
           !atomic_compare_exchange_weak(&d->peak_rss, &peak, rss))
      ;
    int breach = d->max_files > 0 && files > d->max_files ? BREACH_FILES
                 : d->max_rss > 0 && rss > d->max_rss     ? BREACH_MEMORY
                                                          : BREACH_NONE;
    if (breach != BREACH_NONE) {
      atomic_store(&d->wd_breach, breach);
      pid_t pids[2];
      if (d->seccomp_only) {
        /* its session (the launcher is not reaped: the id is still its) */
        (void)kill(-d->pid, SIGKILL);
        kill_launcher(d);
      } else if (rlm_tree_pids(d->pid, pids, 2) == 2) {
        (void)kill(pids[1], SIGKILL);
      } else {
        kill_launcher(d);
      }
      if (!watchdog_wait(d, LAUNCHER_GRACE_MS))
        kill_launcher(d);
      break;
    }
    ms = watchdog_next_ms(d, rss, &last_rss, &last_ms);
  }
  rlm_tree_still_clear(&memo.still);
}
