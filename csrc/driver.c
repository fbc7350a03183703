/* driver.c: the driver process on its own libuv loop. The driver's stdout
 * is read into one framing buffer (csrc/framing.c) and lines are taken out
 * of it one at a time, as views, when the caller polls: reading stops while
 * a complete line waits to be taken, so a driver that floods its stdout
 * fills the pipe and blocks, and what the host holds for it is that buffer
 * (at most max_line + 1 bytes) and a few terminal events, whatever it sends.
 *
 * The memory watchdog is a thread of its own per driver (see
 * watchdog_main), so that it keeps polling while the host is busy elsewhere
 * (a blocking model callback): it kills the sandbox itself and leaves a
 * flag that the loop turns into RLM_EV_MEMORY.
 *
 * The process is started with posix_spawn (or, when it must drop to another
 * uid, fork and exec), not uv_spawn, and watched through a pidfd: the child
 * closes every descriptor but its three pipes and the ones it is handed
 * (the seccomp filter, the context, the driver's text) before its first
 * exec, whatever the host leaked, and libuv never installs its process-wide
 * SIGCHLD handler, which would otherwise change how the host's own children
 * (Neovim's, nginx's) are reaped. */
#define _GNU_SOURCE
#include "driver.h"

#include "cgroup.h"
#include "framing.h"
#include "uid.h"
#include "watchdog.h"
#include "workdir.h"

#include "sandbox.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

extern char **environ;

#define READ_CHUNK 65536
#define KEEPER_STACK (256u << 10)
#define CHILD_STACK (64u << 10) /* the launcher's, until its exec */
#define STDERR_TAIL 4096
#define EXIT_GRACE_MS 200     /* after the process exits, wait this for EOF */
#define CLOSE_WAIT_MS 5000    /* bound on reaping a killed sandbox */
#define LAUNCHER_GRACE_MS 500 /* after its namespace's init was killed */
#define SANDBOX_TASKS 128     /* the cgroup's pids.max: threads, mostly */
#define MAX_WRITE_QUEUE (256u << 20)
#define MAX_INHERIT 16 /* descriptors handed to the child beyond 0..2 */

/* What the watchdog thread ended the sandbox for. */
enum { BREACH_NONE, BREACH_MEMORY, BREACH_FILES };

struct rlm_driver {
  uint64_t exec_ns; /* uv_hrtime() when the spawn returned: bubblewrap runs */
  uv_loop_t loop;
  uv_poll_t exit_watch; /* the pidfd turns readable when the process exits */
  int pidfd;
  pid_t pid;
  unsigned long pipe_ino[3]; /* the session's pipes, as /proc shows them */
  uv_pipe_t in, out, err;
  uv_timer_t deadline, wait, grace, launcher_grace;
  int handles; /* initialised handles not yet closed */

  unsigned spawned : 1, exited : 1, killed : 1, out_eof : 1, err_eof : 1,
      reading : 1, in_closed : 1, terminal_queued : 1, exit_queued : 1,
      wait_expired : 1, deadline_hit : 1, paused : 1, grace_due : 1;
  int64_t exit_status;
  int term_signal;

  rlm_framer framer;
  rlm_event line;         /* the line last handed out: a view into framer */
  rlm_event *head, *tail; /* terminal events: a handful at most */

  char err_tail[STDERR_TAIL + 1];
  size_t err_len;

  uint64_t max_rss, max_files;
  unsigned rss_interval_ms;
  rlm_cgroup cg;
  int uid_lock; /* held while the sandbox's uid is ours; -1: none */

  /* The keeper thread (keeper_main): it starts the process, watches its
   * memory, and after close() kills, reaps and frees it all. It writes pid,
   * pidfd, cg, uid and uid_lock before it publishes start_state, and the
   * host reads them only after it has seen that (on_started). */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  atomic_int closing;     /* the host has called close(): stop, tear down */
  int handed;             /* under mu: the host will not touch d again */
  int ctx_busy;           /* under mu: the keeper reads the caller's context */
  atomic_int ctx_done;    /* the keeper is done with the caller's context */
  atomic_int start_state; /* START_ values */
  uv_async_t started;     /* the keeper's word that the start is over */
  unsigned start_seen : 1, start_failed : 1, kill_pending : 1;
  char start_err[512];

  /* What the keeper starts, its own copies. */
  char **argv, **env, **stage;
  size_t n_stage;
  int child_fds[3 + MAX_INHERIT]; /* the child's 0, 1, 2, 3...; owned */
  int nfds;
  const char *context; /* the caller's, until ctx_done */
  size_t context_len;
  int context_at; /* the context memfd's place among child_fds; -1: none */
  int claim_uid, want_cgroup;
  uint32_t uid_first, uid_count, uid;
  unsigned run_as; /* nonzero: the child drops to this uid before exec */

  atomic_int wd_breach; /* the keeper killed the sandbox: a BREACH_ value */
  _Atomic uint64_t peak_rss;
  _Atomic uint64_t files_seen; /* in /session, at the last poll */
  char err_buf[4096];
};

enum { START_PENDING, START_OK, START_FAILED };

typedef struct write_req {
  uv_write_t req;
  size_t len;
  char data[];
} write_req;

/* Writes to a pipe whose reader died raise SIGPIPE, which would kill the
 * host. Block it around our own I/O and swallow what we raised, without
 * touching the host's disposition. */
typedef struct sigpipe_guard {
  sigset_t old;
  int was_pending;
} sigpipe_guard;

static void sigpipe_block(sigpipe_guard *g) {
  sigset_t set, pending;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  sigpending(&pending);
  g->was_pending = sigismember(&pending, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void sigpipe_unblock(sigpipe_guard *g) {
  sigset_t set, pending;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  if (!g->was_pending && sigpending(&pending) == 0 &&
      sigismember(&pending, SIGPIPE)) {
    struct timespec zero = {0, 0};
    while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR)
      ;
  }
  pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* Only a pending write can raise SIGPIPE inside the loop; most turns have
 * none and skip the four system calls of the guard. */
static void run_loop(rlm_driver *d, uv_run_mode mode) {
  if (uv_stream_get_write_queue_size((uv_stream_t *)&d->in) == 0) {
    uv_run(&d->loop, mode);
    return;
  }
  sigpipe_guard g;
  sigpipe_block(&g);
  uv_run(&d->loop, mode);
  sigpipe_unblock(&g);
}

void rlm_event_free(rlm_event *ev) {
  if (ev != NULL && !ev->borrowed) {
    free(ev->data);
    free(ev);
  }
}

static rlm_event *event_new(rlm_event_kind kind) {
  rlm_event *ev = calloc(1, sizeof(*ev));
  if (ev != NULL)
    ev->kind = kind;
  return ev;
}

static void queue_event(rlm_driver *d, rlm_event *ev) {
  if (ev == NULL)
    return;
  if (d->tail)
    d->tail->next = ev;
  else
    d->head = ev;
  d->tail = ev;
}

static void drop_lines(rlm_driver *d) { rlm_framer_reset(&d->framer); }

static void stop_reading(rlm_driver *d) {
  d->paused = 0;
  if (d->reading) {
    uv_read_stop((uv_stream_t *)&d->out);
    d->reading = 0;
  }
}

static void on_close(uv_handle_t *h) {
  rlm_driver *d = h->data;
  d->handles--;
}

static void close_handle(rlm_driver *d, void *h) {
  uv_handle_t *handle = h;
  if (handle->data == d && !uv_is_closing(handle))
    uv_close(handle, on_close);
}

/* SIGKILL to the launcher (bubblewrap outside the namespaces), through the
 * pidfd so that a recycled pid can never be hit. ESRCH: it has exited
 * already, and the exit watch will say so. */
static void kill_launcher(rlm_driver *d) {
  if (syscall(SYS_pidfd_send_signal, d->pidfd, SIGKILL, NULL, 0) != 0 &&
      errno != ESRCH)
    (void)kill(d->pid, SIGKILL);
}

static void on_launcher_grace(uv_timer_t *t) {
  rlm_driver *d = t->data;
  if (!d->exited)
    kill_launcher(d);
}

/* Kills the pid namespace's init, not the launcher: the kernel then kills
 * and reaps everything in the namespace, the launcher reaps the init and
 * exits, and we reap the launcher, so nothing is left for the host's init to
 * collect, however slow it is. If the init is not there yet, or the launcher
 * lingers, the launcher gets SIGKILL too (--die-with-parent then takes the
 * rest down). */
static void kill_sandbox(rlm_driver *d) {
  if (!d->spawned && !d->start_failed) {
    d->kill_pending = 1; /* still starting: when it has (on_started) */
    return;
  }
  if (!d->spawned || d->exited || d->killed)
    return;
  d->killed = 1;
  pid_t pids[2];
  if (rlm_tree_pids(d->pid, pids, 2) == 2 && kill(pids[1], SIGKILL) == 0)
    uv_timer_start(&d->launcher_grace, on_launcher_grace, LAUNCHER_GRACE_MS, 0);
  else
    kill_launcher(d);
}

/* A terminal condition the host enforced: kill, drop what the driver said
 * after it, and report the reason once. */
static void terminate(rlm_driver *d, rlm_event_kind kind) {
  if (d->terminal_queued)
    return;
  d->terminal_queued = 1;
  kill_sandbox(d);
  stop_reading(d);
  drop_lines(d);
  rlm_event *ev = event_new(kind);
  if (ev != NULL)
    ev->peak_bytes = atomic_load(&d->peak_rss);
  queue_event(d, ev);
  uv_timer_stop(&d->deadline);
}

/* The watchdog thread killed the sandbox: say so, once, before anything
 * else the loop learns about it (its exit). */
static void report_breach(rlm_driver *d) {
  int breach = atomic_load(&d->wd_breach);
  terminate(d, breach == BREACH_FILES ? RLM_EV_FILES : RLM_EV_MEMORY);
  if (breach == BREACH_FILES && d->tail != NULL &&
      d->tail->kind == RLM_EV_FILES)
    d->tail->peak_bytes = atomic_load(&d->files_seen);
}

static void check_breach(rlm_driver *d) {
  if (atomic_load(&d->wd_breach) && !d->terminal_queued)
    report_breach(d);
}

/* Whether both of the driver's output pipes have reached their end: then
 * the exit event carries all it said, bubblewrap's own error included. */
static int drained(const rlm_driver *d) { return d->out_eof && d->err_eof; }

/* The exit is reported once the process is reaped and its stdout and stderr
 * are drained, or killed, or silent for EXIT_GRACE_MS after exiting. */
static void maybe_queue_exit(rlm_driver *d) {
  if (!d->exited || d->exit_queued ||
      (!drained(d) && !d->killed && uv_is_active((uv_handle_t *)&d->grace)))
    return;
  d->exit_queued = 1;
  uv_timer_stop(&d->grace);
  stop_reading(d);
  close_handle(d, &d->out);
  rlm_event *ev = event_new(RLM_EV_EXIT);
  if (ev == NULL)
    return;
  ev->exit_status = d->exit_status;
  ev->term_signal = d->term_signal;
  ev->data = malloc(d->err_len + 1);
  if (ev->data != NULL) {
    memcpy(ev->data, d->err_tail, d->err_len);
    ev->data[d->err_len] = '\0';
    ev->len = d->err_len;
  }
  queue_event(d, ev);
  d->terminal_queued = 1;
}

static void on_grace(uv_timer_t *t) {
  rlm_driver *d = t->data;
  uv_timer_stop(t);
  if (d->paused) {
    /* Not silent: the host is not reading, a line waits to be taken. The
     * grace starts again when reading does. */
    d->grace_due = 1;
    return;
  }
  maybe_queue_exit(d);
}

static void on_process_exit(uv_poll_t *w, int status, int events) {
  rlm_driver *d = w->data;
  (void)status;
  (void)events;
  int wstatus = 0;
  pid_t got;
  do
    got = waitpid(d->pid, &wstatus, WNOHANG);
  while (got < 0 && errno == EINTR);
  if (got == 0)
    return; /* not yet: readable pidfds mean exited, but be sure */
  uv_poll_stop(w);
  if (atomic_load(&d->wd_breach) && !d->terminal_queued) {
    d->killed = 1; /* the watchdog did */
    report_breach(d);
  }
  d->exited = 1;
  if (got < 0) { /* ECHILD: the host reaps children itself (SIGCHLD ignored) */
    d->exit_status = -1;
    d->term_signal = 0;
  } else {
    d->exit_status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 0;
    d->term_signal = WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0;
  }
  uv_timer_stop(&d->deadline);
  uv_timer_stop(&d->launcher_grace);
  if (!drained(d) && !d->killed)
    uv_timer_start(&d->grace, on_grace, EXIT_GRACE_MS, 0);
  maybe_queue_exit(d);
}

/* Reads go straight into the framing buffer. No room (a partial line past
 * the cap, or no memory) gives libuv an empty buffer: UV_ENOBUFS below. */
static void alloc_out(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  rlm_driver *d = h->data;
  size_t len;
  (void)hint;
  char *p = rlm_framer_space(&d->framer, READ_CHUNK, &len);
  *buf = uv_buf_init(p, (unsigned)len);
}

static void alloc_err(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  rlm_driver *d = h->data;
  (void)hint;
  *buf = uv_buf_init(d->err_buf, sizeof(d->err_buf));
}

static void on_read_out(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* Stops reading while a complete line waits: the back-pressure. */
static void pause_reading(rlm_driver *d) {
  stop_reading(d);
  d->paused = 1;
}

static void resume_reading(rlm_driver *d) {
  if (d->reading || d->out_eof || d->terminal_queued ||
      uv_is_closing((uv_handle_t *)&d->out))
    return;
  d->paused = 0;
  uv_read_start((uv_stream_t *)&d->out, alloc_out, on_read_out);
  d->reading = 1;
  if (d->grace_due) {
    d->grace_due = 0;
    uv_timer_start(&d->grace, on_grace, EXIT_GRACE_MS, 0);
  }
}

static void on_read_out(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  rlm_driver *d = s->data;
  (void)buf;
  if (nread == UV_ENOBUFS) {
    terminate(d, RLM_EV_OVERFLOW);
    return;
  }
  if (nread < 0) {
    d->out_eof = 1;
    stop_reading(d);
    maybe_queue_exit(d);
    return;
  }
  if (d->terminal_queued)
    return;
  rlm_framer_commit(&d->framer, (size_t)nread);
  if (rlm_framer_ready(&d->framer))
    pause_reading(d);
  else if (rlm_framer_overflowed(&d->framer))
    terminate(d, RLM_EV_OVERFLOW);
}

static void on_read_err(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  rlm_driver *d = s->data;
  if (nread < 0) {
    uv_read_stop(s);
    close_handle(d, s);
    d->err_eof = 1;
    maybe_queue_exit(d);
    return;
  }
  /* Keep the last STDERR_TAIL bytes. */
  size_t n = (size_t)nread;
  const char *p = buf->base;
  if (n >= STDERR_TAIL) {
    p += n - STDERR_TAIL;
    n = STDERR_TAIL;
    d->err_len = 0;
  } else if (d->err_len + n > STDERR_TAIL) {
    size_t drop = d->err_len + n - STDERR_TAIL;
    memmove(d->err_tail, d->err_tail + drop, d->err_len - drop);
    d->err_len -= drop;
  }
  memcpy(d->err_tail + d->err_len, p, n);
  d->err_len += n;
}

static void on_deadline(uv_timer_t *t) {
  rlm_driver *d = t->data;
  d->deadline_hit = 1;
  terminate(d, RLM_EV_TIMEOUT);
}

/* What the watchdog counts against max_rss: the resident memory of the
 * sandbox's processes plus what /session's tmpfs holds (where no cgroup
 * charges it, this is the only count of it); and the files in /session. */
static uint64_t watchdog_measure(rlm_driver *d, uint64_t *files) {
  uint64_t rss = rlm_tree_rss(d->pid), bytes = 0;
  *files = 0;
  if (rlm_workdir_usage(d->pid, &bytes, files) == 0)
    rss += bytes;
  return rss;
}

/* Whether the launcher has exited: its pid may then name another process. */
static int launcher_exited(rlm_driver *d) {
  struct pollfd p = {.fd = d->pidfd, .events = POLLIN};
  int n;
  do
    n = poll(&p, 1, 0);
  while (n < 0 && errno == EINTR);
  return n != 0; /* an error: do not trust the pid either */
}

/* Waits ms, or until told to stop. Returns nonzero when told to. */
static int watchdog_sleep(rlm_driver *d, unsigned ms) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&d->mu);
  while (!atomic_load(&d->closing) &&
         pthread_cond_timedwait(&d->cv, &d->mu, &until) == 0)
    ;
  int stop = atomic_load(&d->closing);
  pthread_mutex_unlock(&d->mu);
  return stop;
}

static uint64_t monotonic_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

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
  while (!watchdog_sleep(d, 0)) {
    if (launcher_exited(d))
      break;
    uint64_t files;
    uint64_t rss = watchdog_measure(d, &files);
    if (launcher_exited(d))
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
      if (rlm_tree_pids(d->pid, pids, 2) == 2)
        (void)kill(pids[1], SIGKILL);
      else
        kill_launcher(d);
      if (!watchdog_sleep(d, LAUNCHER_GRACE_MS) && !launcher_exited(d))
        kill_launcher(d);
      break;
    }
    if (watchdog_sleep(d, watchdog_next_ms(d, rss, &last_rss, &last_ms)))
      break;
  }
}

static void on_wait(uv_timer_t *t) {
  rlm_driver *d = t->data;
  d->wait_expired = 1;
}

static void init_timer(rlm_driver *d, uv_timer_t *t) {
  uv_timer_init(&d->loop, t); /* cannot fail on an initialised loop */
  t->data = d;
  d->handles++;
}

static int init_pipe(rlm_driver *d, uv_pipe_t *p) {
  int rc = uv_pipe_init(&d->loop, p, 0);
  if (rc == 0) {
    p->data = d;
    d->handles++;
  }
  return rc;
}

static void free_driver(rlm_driver *d) {
  if (d->pidfd >= 0)
    close(d->pidfd);
  if (d->uid_lock >= 0)
    close(d->uid_lock);
  for (size_t i = 0; i < sizeof(d->child_fds) / sizeof(int); i++)
    if (d->child_fds[i] >= 0)
      close(d->child_fds[i]);
  free(d->argv);
  free(d->env);
  free(d->stage);
  while (d->head != NULL) {
    rlm_event *ev = d->head;
    d->head = ev->next;
    rlm_event_free(ev);
  }
  rlm_framer_free(&d->framer);
  free(d);
}

/* Closes every handle and the loop. The process must have been reaped. */
static void close_loop(rlm_driver *d) {
  close_handle(d, &d->exit_watch);
  close_handle(d, &d->in);
  close_handle(d, &d->out);
  close_handle(d, &d->err);
  close_handle(d, &d->deadline);
  close_handle(d, &d->wait);
  close_handle(d, &d->grace);
  close_handle(d, &d->launcher_grace);
  close_handle(d, &d->started);
  while (d->handles > 0)
    run_loop(d, UV_RUN_ONCE);
  /* Every handle is closed, so this cannot report EBUSY. */
  (void)uv_loop_close(&d->loop);
}

/* Descriptors the child moves into 0..2 + MAX_INHERIT are first numbered
 * above that, so that its dup2s cannot clobber one another. */
#define FD_BASE (3 + MAX_INHERIT + 1)

/* A pipe whose two ends are close-on-exec and numbered FD_BASE or more. */
static int make_pipe(int fds[2]) {
  int raw[2];
  if (pipe2(raw, O_CLOEXEC) != 0)
    return -1;
  for (int i = 0; i < 2; i++) {
    fds[i] = fcntl(raw[i], F_DUPFD_CLOEXEC, FD_BASE);
    close(raw[i]);
  }
  if (fds[0] < 0 || fds[1] < 0) {
    int saved = errno;
    if (fds[0] >= 0)
      close(fds[0]);
    if (fds[1] >= 0)
      close(fds[1]);
    errno = saved;
    return -1;
  }
  return 0;
}

static void close_pair(int fds[2]) {
  for (int i = 0; i < 2; i++)
    if (fds[i] >= 0) {
      close(fds[i]);
      fds[i] = -1;
    }
}

/* What the child of a fork does, in order, with only system calls: mount
 * what its uid could not reach (see sandbox.h), drop to the uid, reset its
 * signals, leave the host's session, set its descriptors, exec. A failure
 * writes errno to `report` (close-on-exec: EOF means the exec happened). */
typedef struct child_plan {
  const rlm_driver *o;
  int fds[3 + MAX_INHERIT]; /* the child's 0, 1, 2, 3... from these */
  int nfds, report;
  char (*stage_dst)[64];
  unsigned char *stage_dir; /* whether each staged path is a directory */
} child_plan;

/* The child runs on a stack of its own in the host's memory: AddressSanitizer
 * (make check) cannot follow it there, and must not instrument it. */
#define CHILD_CODE __attribute__((no_sanitize_address))

CHILD_CODE __attribute__((noreturn)) static void
child_fail(const child_plan *p) {
  int e = errno;
  while (write(p->report, &e, sizeof(e)) < 0 && errno == EINTR)
    ;
  _exit(127);
}

CHILD_CODE __attribute__((noreturn)) static void
child_run(const child_plan *p) {
  const rlm_driver *o = p->o;
  if (o->n_stage > 0) {
    /* A mount namespace of this child's alone, where none of this
     * propagates back to the host's. */
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0 ||
        mount("rlm-stage", RLM_STAGE_DIR, "tmpfs", MS_NOSUID | MS_NODEV,
              "mode=0755,size=64k") != 0)
      child_fail(p);
    for (size_t i = 0; i < o->n_stage; i++) {
      if (p->stage_dir[i]) {
        if (mkdir(p->stage_dst[i], 0755) != 0)
          child_fail(p);
      } else {
        int fd = open(p->stage_dst[i], O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
          child_fail(p);
        close(fd);
      }
      if (mount(o->stage[i], p->stage_dst[i], NULL, MS_BIND | MS_REC, NULL) !=
          0)
        child_fail(p);
    }
  }
  /* The raw system calls: libc's wrappers would set the ids of every
   * thread of the host, whose memory this child shares. */
  if (o->run_as != 0 &&
      (syscall(SYS_setgroups, 0, NULL) != 0 ||
       syscall(SYS_setresgid, o->run_as, o->run_as, o->run_as) != 0 ||
       syscall(SYS_setresuid, o->run_as, o->run_as, o->run_as) != 0))
    child_fail(p);
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; sig++)
    if (sig != SIGKILL && sig != SIGSTOP)
      (void)sigaction(sig, &dfl, NULL); /* fails only for libc's own */
  sigset_t none;
  sigemptyset(&none);
  if (sigprocmask(SIG_SETMASK, &none, NULL) != 0 || setsid() < 0)
    child_fail(p);
  for (int i = 0; i < p->nfds; i++)
    if (dup2(p->fds[i], i) < 0)
      child_fail(p);
  /* Everything else goes, leaked host descriptors included; the report
   * pipe closes at the exec. */
  if (syscall(SYS_close_range, (unsigned)p->nfds, (unsigned)p->report - 1, 0) !=
          0 ||
      syscall(SYS_close_range, (unsigned)p->report + 1, ~0u, 0) != 0)
    child_fail(p);
  execve(o->argv[0], o->argv, o->env ? o->env : environ);
  child_fail(p);
}

CHILD_CODE static int child_entry(void *arg) { child_run(arg); }

/* child_run in a child that shares the host's memory until its exec (as
 * posix_spawn does): a fork would make every page of the host's
 * copy-on-write, and the host's thread would pay for it in page faults
 * while the sandboxes start. Returns 0, or an errno value. */
static int fork_child(rlm_driver *d, const rlm_driver *o, const int *fds,
                      int nfds) {
  child_plan p;
  memset(&p, 0, sizeof(p));
  p.o = o;
  p.nfds = nfds;
  memcpy(p.fds, fds, (size_t)nfds * sizeof(int));
  int report[2] = {-1, -1}, rc = 0;
  if (o->n_stage > 0) {
    p.stage_dst = calloc(o->n_stage, sizeof(*p.stage_dst));
    p.stage_dir = calloc(o->n_stage, 1);
    if (p.stage_dst == NULL || p.stage_dir == NULL) {
      rc = ENOMEM;
      goto out;
    }
    for (size_t i = 0; i < o->n_stage; i++) {
      struct stat st;
      if (stat(o->stage[i], &st) != 0) {
        rc = errno;
        goto out;
      }
      p.stage_dir[i] = S_ISDIR(st.st_mode);
      snprintf(p.stage_dst[i], sizeof(p.stage_dst[i]), RLM_STAGE_DIR "/%zu", i);
    }
  }
  if (make_pipe(report) != 0) {
    rc = errno;
    goto out;
  }
  p.report = report[1];
  /* No handler of the host's may run in the child before it resets them. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  char *stack = malloc(CHILD_STACK);
  pid_t pid = stack == NULL ? -1
                            : clone(child_entry, stack + CHILD_STACK,
                                    CLONE_VM | CLONE_VFORK | SIGCHLD, &p);
  int fork_errno = stack == NULL ? ENOMEM : errno;
  free(stack); /* the child has exec'd or exited */
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) {
    rc = fork_errno;
    goto out;
  }
  close(report[1]);
  report[1] = -1;
  int child_errno = 0;
  ssize_t n;
  while ((n = read(report[0], &child_errno, sizeof(child_errno))) < 0 &&
         errno == EINTR)
    ;
  if (n > 0) {
    rc = child_errno ? child_errno : EIO;
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
    goto out;
  }
  d->pid = pid;
out:
  close_pair(report);
  free(p.stage_dst);
  free(p.stage_dir);
  return rc;
}

/* posix_spawn with the same descriptors, signals and session. Returns 0, or
 * an errno value. */
static int posix_spawn_child(rlm_driver *d, const rlm_driver *o, const int *fds,
                             int nfds) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  int e = posix_spawn_file_actions_init(&fa);
  if (e != 0)
    return e;
  for (int i = 0; i < nfds && e == 0; i++)
    e = posix_spawn_file_actions_adddup2(&fa, fds[i], i);
  /* Everything else goes, leaked host descriptors included. */
  if (e == 0)
    e = posix_spawn_file_actions_addclosefrom_np(&fa, nfds);
  int attr_ok = 0;
  if (e == 0)
    attr_ok = (e = posix_spawnattr_init(&attr)) == 0;
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  if (e == 0)
    e = posix_spawnattr_setsigmask(&attr, &none);
  if (e == 0)
    e = posix_spawnattr_setsigdefault(&attr, &all);
  /* A session of its own: no controlling terminal, and a ^C in the user's
   * terminal reaches the host, which decides. */
  if (e == 0)
    e = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK |
                                            POSIX_SPAWN_SETSIGDEF |
                                            POSIX_SPAWN_SETSID);
  if (e == 0)
    e = posix_spawn(&d->pid, o->argv[0], &fa, &attr, (char *const *)o->argv,
                    o->env ? (char *const *)o->env : environ);
  posix_spawn_file_actions_destroy(&fa);
  if (attr_ok)
    posix_spawnattr_destroy(&attr);
  return e;
}

static int spawn_process(rlm_driver *d, char *err, size_t errlen) {
  int e = d->run_as != 0 || d->n_stage > 0
              ? fork_child(d, d, d->child_fds, d->nfds)
              : posix_spawn_child(d, d, d->child_fds, d->nfds);
  if (e != 0) {
    snprintf(err, errlen, "spawning %s%s: %s", d->argv[0],
             d->run_as ? " as the sandbox's uid" : "", strerror(e));
    return -1;
  }
  d->pidfd = (int)syscall(SYS_pidfd_open, d->pid, 0);
  if (d->pidfd < 0) {
    /* Kernels before 5.3: the process cannot be watched safely. */
    snprintf(err, errlen, "pidfd_open: %s", strerror(errno));
    (void)kill(d->pid, SIGKILL);
    while (waitpid(d->pid, NULL, 0) < 0 && errno == EINTR)
      ;
    return -1;
  }
  (void)fcntl(d->pidfd, F_SETFD, FD_CLOEXEC); /* pidfds are, but be sure */
  return 0;
}

int rlm_fd_headroom(int need) {
  int fds[64], n = 0;
  if (need > 64)
    need = 64;
  while (n < need) {
    int fd =
        n == 0 ? eventfd(0, EFD_CLOEXEC) : fcntl(fds[0], F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
      break;
    fds[n++] = fd;
  }
  for (int i = 0; i < n; i++)
    close(fds[i]);
  return n;
}

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

/* The start, on the keeper: the context, the uid, the process, its
 * cgroup. Returns 0, or -1 with start_err set. */
static int keeper_start(rlm_driver *d) {
  char *err = d->start_err;
  size_t errlen = sizeof(d->start_err);
  if (d->context_at >= 0 && write_context(d, err, errlen) != 0)
    return -1;
  if (d->claim_uid) {
    /* Never host root inside: an unprivileged uid of the session's own. */
    uint32_t uid;
    d->uid_lock = rlm_uid_claim(d->uid_first, d->uid_count, &uid, err, errlen);
    if (d->uid_lock < 0)
      return -1;
    d->uid = uid;
    d->run_as = uid;
  }
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
  }
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

static void teardowns_add(int n) {
  pthread_mutex_lock(&teardowns_mu);
  teardowns += n;
  if (teardowns == 0)
    pthread_cond_broadcast(&teardowns_cv);
  pthread_mutex_unlock(&teardowns_mu);
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

/* After close(): kill what still runs (the pid namespace's init, then the
 * launcher if it lingers), reap the launcher, remove the cgroup, let go of
 * the uid, and drop /session's pin only then (its tmpfs's teardown). */
static void keeper_teardown(rlm_driver *d) {
  int pin = -1;
  if (!d->exited) {
    if (d->max_files > 0)
      pin = rlm_workdir_pin(d->pid);
    pid_t pids[2];
    if (!(rlm_tree_pids(d->pid, pids, 2) == 2 && kill(pids[1], SIGKILL) == 0 &&
          wait_launcher(d, LAUNCHER_GRACE_MS)))
      kill_launcher(d);
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

/* The keeper's report, on the host's loop: the process runs (watch it, read
 * it), or it could not start (an event says why). */
static void on_started(uv_async_t *a) {
  rlm_driver *d = a->data;
  int state = atomic_load(&d->start_state);
  if (state == START_PENDING || d->start_seen)
    return;
  d->start_seen = 1;
  uv_unref((uv_handle_t *)a);
  if (state == START_FAILED) {
    d->start_failed = 1;
    uv_timer_stop(&d->deadline);
    if (!d->terminal_queued) {
      rlm_event *ev = event_new(RLM_EV_FAILED);
      if (ev != NULL && (ev->data = strdup(d->start_err)) != NULL)
        ev->len = strlen(ev->data);
      queue_event(d, ev);
      d->terminal_queued = 1;
    }
    return;
  }
  d->spawned = 1;
  int e = uv_poll_init(&d->loop, &d->exit_watch, d->pidfd);
  if (e == 0) {
    d->exit_watch.data = d;
    d->handles++;
    e = uv_poll_start(&d->exit_watch, UV_READABLE, on_process_exit);
  }
  if (e != 0) {
    /* Unwatched, it must not run: killed now, reaped by the keeper. */
    kill_launcher(d);
    d->killed = 1;
    snprintf(d->start_err, sizeof(d->start_err), "watching the driver: %s",
             uv_strerror(e));
    terminate(d, RLM_EV_FAILED);
    if (d->tail != NULL && d->tail->kind == RLM_EV_FAILED &&
        (d->tail->data = strdup(d->start_err)) != NULL)
      d->tail->len = strlen(d->tail->data);
    return;
  }
  if (!d->terminal_queued) {
    uv_read_start((uv_stream_t *)&d->out, alloc_out, on_read_out);
    d->reading = 1;
  }
  if (uv_read_start((uv_stream_t *)&d->err, alloc_err, on_read_err) != 0)
    d->err_eof = 1; /* unread: its end is not waited for */
  if (d->kill_pending) {
    d->kill_pending = 0;
    kill_sandbox(d);
  }
}

/* A copy of a NULL-terminated list of strings (n: how many, when it is not
 * terminated), in one block. */
static char **copy_strings(char *const *v, size_t n) {
  if (v == NULL)
    return NULL;
  if (n == (size_t)-1)
    for (n = 0; v[n] != NULL; n++)
      ;
  size_t bytes = (n + 1) * sizeof(char *);
  for (size_t i = 0; i < n; i++)
    bytes += strlen(v[i]) + 1;
  char **out = malloc(bytes);
  if (out == NULL)
    return NULL;
  char *p = (char *)(out + n + 1);
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(v[i]) + 1;
    out[i] = memcpy(p, v[i], len);
    p += len;
  }
  out[n] = NULL;
  return out;
}

/* Keeps this library loaded for the life of the process: the keeper may
 * outlive the Lua state, which unloads it on close. */
static int pin_library(void) {
  Dl_info self;
  return dladdr((void *)keeper_main, &self) != 0 && self.dli_fname != NULL &&
                 dlopen(self.dli_fname,
                        RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) != NULL
             ? 0
             : -1;
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

rlm_driver *rlm_driver_start(const rlm_driver_opts *o, char *err,
                             size_t errlen) {
  /* libuv aborts the process when its loop cannot get its descriptors:
   * make sure they are there first. */
  int free_fds = rlm_fd_headroom(RLM_DRIVER_FDS);
  if (free_fds < RLM_DRIVER_FDS) {
    struct rlimit rl;
    long soft = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (long)rl.rlim_cur : -1;
    snprintf(err, errlen,
             "too few free file descriptors (EMFILE): %d free of the %d a "
             "driver needs (RLIMIT_NOFILE %ld)",
             free_fds, RLM_DRIVER_FDS, soft);
    errno = EMFILE;
    return NULL;
  }
  if (o->n_inherit > MAX_INHERIT) {
    snprintf(err, errlen, "too many descriptors for the child");
    return NULL;
  }
  (void)pthread_once(&teardowns_once, register_exit_wait);
  if (pin_library() != 0) {
    snprintf(err, errlen, "keeping rlm.core loaded: %s", dlerror());
    return NULL;
  }
  rlm_driver *d = calloc(1, sizeof(*d));
  if (d == NULL) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  d->uid_lock = -1;
  d->pidfd = -1;
  d->uid = (uint32_t)getuid();
  for (size_t i = 0; i < sizeof(d->child_fds) / sizeof(int); i++)
    d->child_fds[i] = -1;
  d->argv = copy_strings(o->argv, (size_t)-1);
  d->env = copy_strings(o->env, (size_t)-1);
  d->stage = copy_strings(o->stage, o->n_stage);
  d->n_stage = o->n_stage;
  if (d->argv == NULL || (o->env != NULL && d->env == NULL) ||
      (o->n_stage > 0 && d->stage == NULL)) {
    snprintf(err, errlen, "out of memory");
    free_driver(d);
    return NULL;
  }
  d->context = o->context;
  d->context_len = o->context_len;
  d->context_at = o->context != NULL ? o->context_at : -1;
  if (d->context_at < 0)
    atomic_store(&d->ctx_done, 1);
  d->claim_uid = o->claim_uid;
  d->uid_first = o->uid_first;
  d->uid_count = o->uid_count;
  d->want_cgroup = o->cgroup;
  d->framer.max = o->max_line;
  d->max_rss = o->max_rss;
  d->max_files = o->max_files;
  d->rss_interval_ms = o->rss_interval_ms ? o->rss_interval_ms : 50;

  int rc = uv_loop_init(&d->loop);
  if (rc != 0) {
    snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(rc));
    free_driver(d);
    return NULL;
  }
  init_timer(d, &d->deadline);
  init_timer(d, &d->wait);
  init_timer(d, &d->grace);
  init_timer(d, &d->launcher_grace);
  if ((rc = init_pipe(d, &d->in)) != 0 || (rc = init_pipe(d, &d->out)) != 0 ||
      (rc = init_pipe(d, &d->err)) != 0) {
    snprintf(err, errlen, "uv_pipe_init: %s", uv_strerror(rc));
    goto failed;
  }
  if ((rc = uv_async_init(&d->loop, &d->started, on_started)) != 0) {
    snprintf(err, errlen, "uv_async_init: %s", uv_strerror(rc));
    goto failed;
  }
  d->started.data = d;
  d->handles++;

  /* The pipes and the handed descriptors, here: the host writes to the
   * driver's stdin at once, and the child's ends wait for the keeper. */
  int p_in[2] = {-1, -1}, p_out[2] = {-1, -1}, p_err[2] = {-1, -1};
  if (make_pipe(p_in) || make_pipe(p_out) || make_pipe(p_err)) {
    snprintf(err, errlen, "pipe2: %s", strerror(errno));
    goto failed_pipes;
  }
  int ends[3] = {p_in[0], p_out[1], p_err[1]};
  for (int i = 0; i < 3; i++) {
    struct stat st;
    if (fstat(ends[i], &st) != 0) {
      snprintf(err, errlen, "fstat: %s", strerror(errno));
      goto failed_pipes;
    }
    d->pipe_ino[i] = (unsigned long)st.st_ino;
  }
  if ((rc = uv_pipe_open(&d->in, p_in[1])) == 0)
    p_in[1] = -1;
  if (rc == 0 && (rc = uv_pipe_open(&d->out, p_out[0])) == 0)
    p_out[0] = -1;
  if (rc == 0 && (rc = uv_pipe_open(&d->err, p_err[0])) == 0)
    p_err[0] = -1;
  if (rc != 0) {
    snprintf(err, errlen, "watching the driver: %s", uv_strerror(rc));
    goto failed_pipes;
  }
  d->child_fds[0] = p_in[0];
  d->child_fds[1] = p_out[1];
  d->child_fds[2] = p_err[1];
  d->nfds = 3 + (int)o->n_inherit;
  for (size_t i = 0; i < o->n_inherit; i++) {
    if ((int)i == d->context_at)
      continue; /* the keeper makes it */
    if ((d->child_fds[3 + i] =
             fcntl(o->inherit_fds[i], F_DUPFD_CLOEXEC, FD_BASE)) < 0) {
      snprintf(err, errlen, "fcntl(F_DUPFD_CLOEXEC): %s", strerror(errno));
      goto failed;
    }
  }
  if ((rc = start_keeper(d)) != 0) {
    snprintf(err, errlen, "starting the sandbox's keeper thread: %s",
             strerror(rc));
    goto failed;
  }
  return d;

failed_pipes:
  close_pair(p_in);
  close_pair(p_out);
  close_pair(p_err);
failed:
  close_loop(d);
  free_driver(d);
  return NULL;
}

static void on_write(uv_write_t *req, int status) {
  (void)status; /* a failed write shows as the process's exit */
  free(req);
}

int rlm_driver_send(rlm_driver *d, const char *data, size_t len) {
  /* While it starts, what is sent waits in the pipe. */
  if (d->start_failed || d->kill_pending || d->exited || d->killed ||
      d->in_closed)
    return -1;
  if (memchr(data, '\n', len) != NULL)
    return -1;
  if (uv_stream_get_write_queue_size((uv_stream_t *)&d->in) + len >
      MAX_WRITE_QUEUE)
    return -1;
  write_req *w = malloc(sizeof(*w) + len + 1);
  if (w == NULL)
    return -1;
  memcpy(w->data, data, len);
  w->data[len] = '\n';
  w->len = len + 1;
  uv_buf_t buf = uv_buf_init(w->data, (unsigned)w->len);
  sigpipe_guard g;
  sigpipe_block(&g);
  int rc = uv_write(&w->req, (uv_stream_t *)&d->in, &buf, 1, on_write);
  sigpipe_unblock(&g);
  if (rc != 0) {
    free(w);
    return -1;
  }
  return 0;
}

/* Lines come before the queued events (the exit follows what the driver
 * said before it); a terminal condition the host enforced has dropped them
 * already. */
static int has_event(rlm_driver *d) {
  check_breach(d);
  return d->head != NULL || rlm_framer_ready(&d->framer);
}

static rlm_event *pop_event(rlm_driver *d) {
  check_breach(d);
  const char *line;
  size_t len;
  if (rlm_framer_next(&d->framer, &line, &len)) {
    if (!rlm_framer_ready(&d->framer))
      resume_reading(d);
    memset(&d->line, 0, sizeof(d->line));
    d->line.kind = RLM_EV_LINE;
    d->line.data = (char *)line;
    d->line.len = len;
    d->line.borrowed = 1;
    return &d->line;
  }
  rlm_event *ev = d->head;
  if (ev == NULL)
    return NULL;
  d->head = ev->next;
  if (d->head == NULL)
    d->tail = NULL;
  ev->next = NULL;
  return ev;
}

rlm_event *rlm_driver_poll(rlm_driver *d, int timeout_ms) {
  if (!has_event(d)) {
    if (timeout_ms == 0) {
      run_loop(d, UV_RUN_NOWAIT);
    } else {
      d->wait_expired = 0;
      if (timeout_ms > 0)
        uv_timer_start(&d->wait, on_wait, (uint64_t)timeout_ms, 0);
      while (!has_event(d) && !d->wait_expired && uv_loop_alive(&d->loop))
        run_loop(d, UV_RUN_ONCE);
      uv_timer_stop(&d->wait);
    }
  }
  return pop_event(d);
}

void rlm_driver_line_taken(rlm_driver *d) { rlm_framer_trim(&d->framer); }

void rlm_driver_kill(rlm_driver *d) {
  kill_sandbox(d);
  stop_reading(d);
  drop_lines(d);
  uv_timer_stop(&d->deadline);
}

void rlm_driver_set_deadline(rlm_driver *d, uint64_t ms) {
  d->deadline_hit = 0;
  uv_timer_stop(&d->deadline);
  if (ms > 0 && !d->start_failed && !d->exited) {
    uv_update_time(&d->loop);
    uv_timer_start(&d->deadline, on_deadline, ms, 0);
  }
}

int rlm_driver_deadline_passed(rlm_driver *d) {
  if (d->deadline_hit)
    return 1;
  if (!uv_is_active((uv_handle_t *)&d->deadline))
    return 0;
  uv_update_time(&d->loop);
  return uv_timer_get_due_in(&d->deadline) == 0;
}

int rlm_driver_pid(const rlm_driver *d) {
  return d->spawned && !d->exited ? d->pid : 0;
}

size_t rlm_driver_tree(const rlm_driver *d, int *pids, size_t max) {
  if (!d->spawned || d->exited)
    return 0;
  pid_t buf[256];
  size_t n = rlm_tree_pids(d->pid, buf, max < 256 ? max : 256);
  for (size_t i = 0; i < n; i++)
    pids[i] = buf[i];
  return n;
}

/* Whether a descriptor's /proc link names something the sandbox may hold:
 * one of the session's pipes, or a kernel object bubblewrap made for itself
 * (signalfd, eventfd). */
static int fd_is_ours(const rlm_driver *d, const char *target) {
  unsigned long ino;
  if (strncmp(target, "anon_inode:", 11) == 0)
    return 1;
  if (sscanf(target, "pipe:[%lu]", &ino) == 1)
    for (int i = 0; i < 3; i++)
      if (ino == d->pipe_ino[i])
        return 1;
  return 0;
}

int rlm_driver_foreign_fds(const rlm_driver *d, rlm_fd_visitor visit,
                           void *ud) {
  int pids[256];
  size_t n = rlm_driver_tree(d, pids, 256);
  int found = 0;
  for (size_t i = 0; i < n; i++) {
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/fd", pids[i]);
    DIR *fds = opendir(dir);
    if (fds == NULL)
      continue; /* it exited meanwhile */
    struct dirent *ent;
    while ((ent = readdir(fds)) != NULL) {
      if (ent->d_name[0] < '0' || ent->d_name[0] > '9')
        continue;
      char link[352], target[256];
      snprintf(link, sizeof(link), "%s/%s", dir, ent->d_name);
      ssize_t len = readlink(link, target, sizeof(target) - 1);
      if (len < 0)
        continue; /* the opendir's own descriptor, closed by now */
      target[len] = '\0';
      if (!fd_is_ours(d, target)) {
        found++;
        visit(ud, pids[i], atoi(ent->d_name), target);
      }
    }
    closedir(fds);
  }
  return found;
}

int rlm_driver_adopt(rlm_driver *d) {
  if (!d->spawned || d->cg.version == 0)
    return 0;
  int pids[256];
  size_t n = rlm_driver_tree(d, pids, 256);
  for (size_t i = 0; i < n; i++)
    if (!rlm_cgroup_holds(&d->cg, pids[i]) &&
        (rlm_cgroup_add(&d->cg, pids[i]) != 0 ||
         !rlm_cgroup_holds(&d->cg, pids[i])))
      return -1;
  return 0;
}

const char *rlm_driver_memory_mechanism(const rlm_driver *d) {
  return !d->spawned          ? "poll"
         : d->cg.version == 2 ? "cgroup v2"
         : d->cg.version == 1 ? "cgroup v1"
                              : "poll";
}

uint64_t rlm_driver_oom_kills(const rlm_driver *d, uint64_t *peak) {
  *peak = 0;
  if (!d->spawned)
    return 0;
  *peak = rlm_cgroup_peak(&d->cg);
  return rlm_cgroup_oom_kills(&d->cg);
}

int rlm_driver_alive(const rlm_driver *d) {
  return !d->start_failed && !d->kill_pending && !d->exited && !d->killed;
}

uint64_t rlm_driver_peak_rss(rlm_driver *d) {
  return atomic_load(&d->peak_rss);
}

int rlm_driver_backend_fd(rlm_driver *d) { return uv_backend_fd(&d->loop); }

int rlm_driver_backend_timeout(rlm_driver *d) {
  return has_event(d) ? 0 : uv_backend_timeout(&d->loop);
}

unsigned rlm_driver_uid(const rlm_driver *d) { return d->spawned ? d->uid : 0; }

uint64_t rlm_driver_exec_ns(const rlm_driver *d) {
  return d->spawned ? d->exec_ns : 0;
}

int rlm_driver_context_done(rlm_driver *d) { return atomic_load(&d->ctx_done); }

/* Never waits for the sandbox: the keeper kills and reaps it. What waits is
 * the keeper's slice of the caller's context, if it is writing one (a
 * millisecond or so), since the caller may free it once this returns. */
void rlm_driver_close(rlm_driver *d) {
  if (d == NULL)
    return;
  pthread_mutex_lock(&d->mu);
  atomic_store(&d->closing, 1);
  pthread_cond_broadcast(&d->cv);
  while (d->ctx_busy)
    pthread_cond_wait(&d->cv, &d->mu);
  pthread_mutex_unlock(&d->mu);
  stop_reading(d);
  close_loop(d); /* the pidfd's watch too: from here only the keeper reaps */
  teardowns_add(1);
  pthread_mutex_lock(&d->mu);
  d->handed = 1;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
}
