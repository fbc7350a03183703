/* keeper.c: the keeper thread, one per driver, from the start to the
 * reaping: the context's memfd, the uid, the spawn (spawn.c), the memory
 * watchdog's loop (keeper_watchdog.c), and after close() the kill, the
 * reaping and the freeing. */
#define _GNU_SOURCE
#include "canary.h"
#include "driver_impl.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

_Static_assert(RLM_CANARY_FD_MIN >= FD_BASE,
               "a canary's leaked descriptor must not share a number with "
               "what a sandbox is handed");

/* The context, written into a sealed memfd in slices, so that a close()
 * that comes meanwhile waits for one slice at most. */
#define CONTEXT_SLICE (1u << 20)
static int write_context(rlm_driver *d, char *err, size_t errlen) {
  pthread_mutex_lock(&d->mu);
  int go = !atomic_load(&d->closing);
  d->ctx_busy = go;
  pthread_mutex_unlock(&d->mu);
  int fd = -1, e = ECANCELED;
  if (go) {
    e = 0;
    fd = rlm_context_open();
    if (fd < 0)
      e = errno;
    size_t off = 0;
    while (e == 0 && off < d->context_len) {
      if (atomic_load(&d->closing)) {
        e = ECANCELED;
        break;
      }
      size_t n = d->context_len - off;
      if (n > CONTEXT_SLICE)
        n = CONTEXT_SLICE;
      if (rlm_context_append(fd, d->context + off, n) != 0)
        e = errno;
      off += n;
    }
  }
  pthread_mutex_lock(&d->mu);
  d->ctx_busy = 0;
  d->context = NULL;
  atomic_store(&d->ctx_done, 1);
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  int high = -1;
  if (e == 0 && rlm_context_seal(fd) == 0 &&
      (high = fcntl(fd, F_DUPFD_CLOEXEC, FD_BASE)) >= 0)
    d->child_fds[3 + d->context_at] = high;
  else if (e == 0)
    e = errno;
  if (fd >= 0)
    close(fd);
  if (e != 0) {
    snprintf(err, errlen, "handing the context over: %s", strerror(e));
    return -1;
  }
  return 0;
}

/* The command line, what to stage and the descriptors to hand over, made
 * by the caller's prepare (off the host's thread), kept as the driver's
 * own. Returns 0, or -1 with a message. */
static int keeper_prepare(rlm_driver *d, char *err, size_t errlen) {
  rlm_prepared p;
  memset(&p, 0, sizeof(p));
  for (size_t i = 0; i < RLM_PREPARED_FDS; i++)
    p.fds[i] = -1;
  int rc = d->prepare(d->prepare_arg, &p, err, errlen);
  d->prepare_free(d->prepare_arg);
  d->prepare_arg = NULL;
  if (rc == 0 && (p.n_fds > MAX_INHERIT || p.argv.n == 0)) {
    snprintf(err, errlen, "too many descriptors for the child");
    rc = -1;
  }
  if (rc == 0) {
    d->argv = copy_strings(p.argv.v, (size_t)-1);
    d->stage = copy_strings(p.stage.v, p.stage.n);
    d->n_stage = p.stage.n;
    if (d->argv == NULL || (p.stage.n > 0 && d->stage == NULL)) {
      snprintf(err, errlen, "out of memory");
      rc = -1;
    }
  }
  for (size_t i = 0; rc == 0 && i < p.n_fds; i++) {
    if ((int)i == d->context_at)
      continue; /* write_context makes it */
    if ((d->child_fds[3 + i] = fcntl(p.fds[i], F_DUPFD_CLOEXEC, FD_BASE)) < 0) {
      snprintf(err, errlen, "fcntl(F_DUPFD_CLOEXEC): %s", strerror(errno));
      rc = -1;
    }
  }
  if (rc == 0)
    d->nfds = 3 + (int)p.n_fds;
  for (size_t i = 0; i < RLM_PREPARED_FDS; i++)
    if (p.fds[i] >= 0)
      close(p.fds[i]);
  rlm_argv_free(&p.argv);
  rlm_argv_free(&p.stage);
  return rc;
}

/* What the launcher forked before it joined its cgroup (bubblewrap's pid
 * namespace init, most often: making the cgroup takes about as long as
 * bubblewrap's first clone) joins it now, the launcher's own move just
 * made. A move into a v1 cgroup takes the kernel's threadgroup lock, which
 * may wait out an RCU grace period unless a move came just before: the
 * same move at the hello, once a blocking model call held the host's thread
 * (the first root call overlaps the start), took 10-15 ms of it under load,
 * against 0.1 ms here. Best effort: rlm_driver_adopt, at the hello, moves
 * and checks every process of the tree all the same. */
static void cgroup_adopt_forked(rlm_driver *d) {
  pid_t pids[8];
  size_t n = rlm_tree_pids(d->pid, pids, 8);
  for (size_t i = 1; i < n; i++)
    if (!rlm_cgroup_holds(&d->cg, pids[i]))
      (void)rlm_cgroup_add(&d->cg, pids[i]);
}

/* The start, on the keeper: the command line (prepare), the context, the
 * uid, the process, its cgroup. Returns 0, or -1 with start_err set. */
static int keeper_start(rlm_driver *d) {
  char *err = d->start_err;
  size_t errlen = sizeof(d->start_err);
  d->stamps[0] = uv_hrtime();
  if (d->prepare != NULL && keeper_prepare(d, err, errlen) != 0)
    return -1;
  d->stamps[5] = uv_hrtime();
  if (d->context_at >= 0 && write_context(d, err, errlen) != 0)
    return -1;
  d->stamps[1] = uv_hrtime();
  if (d->claim_uid) {
    /* Never host root inside: an unprivileged uid of the session's own. */
    uint32_t uid;
    d->uid_lock = rlm_uid_claim(d->uid_first, d->uid_count, &uid, err, errlen);
    if (d->uid_lock < 0)
      return -1;
    d->uid = uid;
    d->run_as = uid;
  }
  d->stamps[2] = uv_hrtime();
  if (atomic_load(&d->closing)) {
    snprintf(err, errlen, "closed before it started");
    return -1;
  }
  if (spawn_process(d, err, errlen) != 0)
    return -1;
  d->exec_ns = uv_hrtime(); /* the spawn returns once the child has exec'd */
  if (d->want_cgroup && d->max_rss > 0) {
    /* Now, while bubblewrap sets up: its children inherit the cgroup. What
     * it forked before this is moved by rlm_driver_adopt after the hello.
     * The name says whose it is, so that a later host can sweep it. */
    char name[64];
    snprintf(name, sizeof(name), "rlm-%d-%d", (int)getpid(), (int)d->pid);
    rlm_cgroup_create(&d->cg, name, d->max_rss, SANDBOX_TASKS);
    if (d->cg.version != 0 && rlm_cgroup_add(&d->cg, d->pid) != 0)
      rlm_cgroup_remove(&d->cg);
    else if (d->cg.version != 0)
      cgroup_adopt_forked(d);
  }
  d->stamps[4] = uv_hrtime();
  return 0;
}

/* The teardowns handed to keepers and not yet over, process-wide (threads
 * and children are the process's, not one Lua state's): a host that exits
 * right after close() waits for them, up to EXIT_WAIT_MS, at exit, so that
 * it reaps its own children rather than leave them to init. */
#define EXIT_WAIT_MS 2000
static pthread_mutex_t teardowns_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t teardowns_cv = PTHREAD_COND_INITIALIZER;
static int teardowns;
static pthread_once_t teardowns_once = PTHREAD_ONCE_INIT;

static void wait_teardowns(void) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += EXIT_WAIT_MS / 1000;
  pthread_mutex_lock(&teardowns_mu);
  while (teardowns > 0 &&
         pthread_cond_timedwait(&teardowns_cv, &teardowns_mu, &until) == 0)
    ;
  pthread_mutex_unlock(&teardowns_mu);
}

static void register_exit_wait(void) { (void)atexit(wait_teardowns); }

/* A host that ran many sessions at once keeps what they freed in its
 * allocator: glibc holds free chunks inside its heaps, and leaves them
 * resident (100 exec sessions at once, closed and collected, left 13 MB of
 * RSS with 1.2 MB in use; 19 MB after 800: issue 39). When the last
 * teardown of the process ends, its thread gives the free pages back
 * (malloc_trim; what the Lua side frees later, the collection of the
 * sessions gives back: core.trim_token). The trim walks every heap under
 * its lock, so it is made at most once a TRIM_EVERY_MS unless TRIM_AFTER
 * sessions ended since the last: what a few sessions left free between
 * trims is all that stays. */
#define TRIM_EVERY_MS 1000
#define TRIM_AFTER 8
static int ended_untrimmed;
static uint64_t last_trim_ms;

static int trim_due(void) {
  uint64_t now = monotonic_ms();
  if (ended_untrimmed < TRIM_AFTER && now - last_trim_ms < TRIM_EVERY_MS)
    return 0;
  ended_untrimmed = 0;
  last_trim_ms = now;
  return 1;
}

static void teardowns_add(int n) {
  pthread_mutex_lock(&teardowns_mu);
  teardowns += n;
  int trim = 0;
  if (n < 0) {
    ended_untrimmed -= n;
    trim = teardowns == 0 && trim_due();
  }
  if (teardowns == 0)
    pthread_cond_broadcast(&teardowns_cv);
  pthread_mutex_unlock(&teardowns_mu);
  if (trim)
    rlm_driver_trim_heap();
}

void rlm_driver_trim_heap(void) {
#ifdef __GLIBC__
  (void)malloc_trim(0);
#endif
}

int rlm_driver_teardowns(void) {
  pthread_mutex_lock(&teardowns_mu);
  int n = teardowns;
  pthread_mutex_unlock(&teardowns_mu);
  return n;
}

/* Waits up to ms (<0: no limit) for the launcher to exit. */
static int wait_launcher(rlm_driver *d, int ms) {
  struct pollfd p = {.fd = d->pidfd, .events = POLLIN};
  int n;
  do
    n = poll(&p, 1, ms);
  while (n < 0 && errno == EINTR);
  return n != 0;
}

/* Kills the pid namespace's init and waits for the launcher to reap it
 * and exit. Returns nonzero when it did. The wait is for the init's exit
 * first, up to CLOSE_WAIT_MS (the kernel kills and reaps the whole
 * namespace before the init is gone, which under load takes longer than
 * LAUNCHER_GRACE_MS), then LAUNCHER_GRACE_MS for the launcher: a launcher
 * killed while its init is still dying leaves the init unreaped, a zombie
 * for the host's init to collect (start_gap_spec, under load). */
static int kill_init(rlm_driver *d, pid_t init) {
  int fd = (int)syscall(SYS_pidfd_open, init, 0);
  if (kill(init, SIGKILL) != 0) {
    if (fd >= 0)
      close(fd);
    return 0;
  }
  if (fd >= 0) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, CLOSE_WAIT_MS) < 0 && errno == EINTR)
      ;
    close(fd);
  }
  return wait_launcher(d, LAUNCHER_GRACE_MS);
}

/* After close(): kill what still runs (the pid namespace's init, then the
 * launcher if it lingers), reap the launcher, remove the cgroup, let go of
 * the uid, and drop /session's pin only then (its tmpfs's teardown). */
static void keeper_teardown(rlm_driver *d) {
  int pin = -1;
  if (!d->exited && d->channel) {
    /* A stream ends with its input: the far side kills what it started and
     * exits, and the local process after it. What lingers past
     * STREAM_END_MS, and whatever of its process group is left (a relay's
     * other half), is killed, while the launcher is not yet reaped (its pid,
     * the group's id, cannot be another's meanwhile). One that lingers
     * (rlm_driver_linger) and was not killed is waited for: it ends on its
     * own, after its linger time or with the session of whoever attached. */
    if (d->in_hold >= 0) {
      close(d->in_hold);
      d->in_hold = -1;
    }
    (void)wait_launcher(d, d->lingers && !d->killed ? -1 : STREAM_END_MS);
    (void)kill(-d->pid, SIGKILL);
    while (!wait_launcher(d, CLOSE_WAIT_MS))
      kill_launcher(d);
    while (waitpid(d->pid, NULL, WNOHANG) < 0 && errno == EINTR)
      ;
  } else if (!d->exited) {
    if (d->max_files > 0 && !d->seccomp_only)
      pin = rlm_workdir_pin(d->pid);
    pid_t pids[2];
    if (d->seccomp_only) {
      (void)kill(-d->pid, SIGKILL); /* no init: the interpreter, its group */
      kill_launcher(d);
    } else if (!(rlm_tree_pids(d->pid, pids, 2) == 2 &&
                 kill_init(d, pids[1]))) {
      kill_launcher(d);
    }
    if (d->in_hold >= 0) {
      close(d->in_hold); /* the init is gone, or the launcher killed */
      d->in_hold = -1;
    }
    while (!wait_launcher(d, CLOSE_WAIT_MS))
      kill_launcher(d); /* a launcher that will not go: again, and wait */
    /* ECHILD: the host reaps children itself (SIGCHLD ignored, nginx). */
    while (waitpid(d->pid, NULL, WNOHANG) < 0 && errno == EINTR)
      ;
  }
  rlm_cgroup_remove(&d->cg);
  if (pin >= 0)
    close(pin);
}

/* The keeper: one thread per driver, from the start to the reaping. It
 * forks the launcher, so it must outlive it: bubblewrap's --die-with-parent
 * follows the thread that forked it (and so the host, whose exit ends every
 * thread). */
static void *keeper_main(void *arg) {
  rlm_driver *d = arg;
  int rc = keeper_start(d);
  for (int i = 0; i < d->nfds; i++)
    if (d->child_fds[i] >= 0) {
      close(d->child_fds[i]); /* the child has its copies */
      d->child_fds[i] = -1;
    }
  pthread_mutex_lock(&d->mu);
  atomic_store(&d->start_state, rc == 0 ? START_OK : START_FAILED);
  if (!atomic_load(&d->closing))
    uv_async_send(&d->started);
  pthread_mutex_unlock(&d->mu);
  if (rc == 0 && (d->max_rss > 0 || d->max_files > 0))
    watchdog_run(d);
  pthread_mutex_lock(&d->mu);
  while (!d->handed)
    pthread_cond_wait(&d->cv, &d->mu);
  pthread_mutex_unlock(&d->mu);
  if (rc == 0)
    keeper_teardown(d);
  pthread_mutex_destroy(&d->mu);
  pthread_cond_destroy(&d->cv);
  free_driver(d);
  teardowns_add(-1);
  return NULL;
}

static int start_keeper(rlm_driver *d) {
  pthread_condattr_t ca;
  int e = pthread_condattr_init(&ca);
  if (e == 0) {
    e = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (e == 0)
      e = pthread_cond_init(&d->cv, &ca);
    pthread_condattr_destroy(&ca);
  }
  if (e == 0 && (e = pthread_mutex_init(&d->mu, NULL)) != 0)
    pthread_cond_destroy(&d->cv);
  if (e == 0 && (d->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
    e = errno;
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
  }
  if (e != 0)
    return e;
  /* The thread takes none of the host's signals. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t ta;
  pthread_t t;
  e = pthread_attr_init(&ta);
  if (e == 0) {
    (void)pthread_attr_setstacksize(&ta, KEEPER_STACK);
    (void)pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    e = pthread_create(&t, &ta, keeper_main, d);
    pthread_attr_destroy(&ta);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (e != 0) {
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
  }
  return e;
}
