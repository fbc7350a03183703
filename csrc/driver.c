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
#include "driver_impl.h"

typedef struct write_req {
  uv_write_t req;
  size_t len;
  char data[];
} write_req;

/* A write to a pipe without a reader would raise SIGPIPE, which kills the
 * host unless it ignores it. The host holds a read end of the driver's
 * stdin pipe for the driver's whole life (in_reader), so the pipe always has
 * a reader: a write to a driver that died or closed its stdin fills the
 * pipe (and then the bounded write queue) instead, and the process's exit
 * says what happened. No signal mask is touched, and a write costs one
 * system call. */
static void run_loop(rlm_driver *d, uv_run_mode mode) {
  uv_run(&d->loop, mode);
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

static void on_stream_grace(uv_timer_t *t) {
  rlm_driver *d = t->data;
  if (!d->exited) {
    (void)kill(-d->pid, SIGKILL);
    kill_launcher(d);
  }
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
  if (d->channel) {
    /* A stream is a local process and what it started (sh, cat, kubectl),
     * in its own process group, and at its far end a keeper that cleans
     * up what it made there (its sandbox, its directories) when its input
     * ends: the input ends now, and the group is killed STREAM_END_MS
     * later if it has not exited by then. */
    close_handle(d, &d->in);
    d->in_closed = 1;
    uv_timer_start(&d->launcher_grace, on_stream_grace, STREAM_END_MS, 0);
    return;
  }
  if (d->seccomp_only) {
    /* The interpreter alone (its filter forbids new processes), in a
     * session of its own: no namespace's init to aim at. */
    (void)kill(-d->pid, SIGKILL);
    kill_launcher(d);
    return;
  }
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
  uv_timer_stop(&d->heartbeat);
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
  uv_stop(&d->loop); /* on_wait */
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
  uv_timer_stop(&d->heartbeat);
  if (!drained(d) && !d->killed)
    uv_timer_start(&d->grace, on_grace, EXIT_GRACE_MS, 0);
  maybe_queue_exit(d);
}

/* Reads go straight into the framing buffer. No room (a partial line past
 * the cap, or no memory) gives libuv an empty buffer: UV_ENOBUFS below. */
static void alloc_out(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  rlm_driver *d = h->data;
  size_t len = 0;
  (void)hint;
  /* A complete line waits (paused): no room, the read below stops. */
  char *p = d->paused ? NULL : rlm_framer_space(&d->framer, READ_CHUNK, &len);
  *buf = uv_buf_init(p, (unsigned)len);
}

static void alloc_err(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  rlm_driver *d = h->data;
  (void)hint;
  *buf = uv_buf_init(d->err_buf, sizeof(d->err_buf));
}

static void on_read_out(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* The back-pressure: nothing more is read while a complete line waits to be
 * taken (paused). The stop itself is lazy: reading stays on, and only when
 * the driver sends more before the line is taken does alloc_out give no
 * room and the read stop (UV_ENOBUFS while paused), so that the usual turn
 * (one line, taken, the next one later) costs no epoll_ctl. */
static void resume_reading(rlm_driver *d) {
  if (d->out_eof || d->terminal_queued || uv_is_closing((uv_handle_t *)&d->out))
    return;
  d->paused = 0;
  if (!d->reading) {
    uv_read_start((uv_stream_t *)&d->out, alloc_out, on_read_out);
    d->reading = 1;
  }
  if (d->grace_due) {
    d->grace_due = 0;
    uv_timer_start(&d->grace, on_grace, EXIT_GRACE_MS, 0);
  }
}

static void on_read_out(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  rlm_driver *d = s->data;
  (void)buf;
  if (nread == UV_ENOBUFS && d->paused) {
    uv_read_stop(s); /* more came while a line waits: stop until it is taken */
    d->reading = 0;
    return;
  }
  if (nread == UV_ENOBUFS) {
    terminate(d, RLM_EV_OVERFLOW);
    return;
  }
  if (nread < 0) {
    d->out_eof = 1;
    stop_reading(d);
    /* A stream whose output ended is over, whatever of it still runs (a
     * relay's first half blocked on its input): it goes now, so that its
     * exit says so at once. */
    if (d->channel)
      kill_sandbox(d);
    maybe_queue_exit(d);
    return;
  }
  if (d->terminal_queued)
    return;
  d->hb_heard = uv_now(&d->loop);
  d->hb_waiting = 0;
  rlm_framer_commit(&d->framer, (size_t)nread);
  if (rlm_framer_ready(&d->framer))
    d->paused = 1;
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
  uv_stop(&d->loop); /* an event is queued: the wait is over (on_wait) */
}

static int send_line(rlm_driver *d, char channel, const uv_buf_t *parts, int n);

/* Whether the stream's output holds bytes the loop has not read yet (or
 * its end): the far side spoke while the loop did not run. */
static int output_waiting(rlm_driver *d) {
  uv_os_fd_t fd;
  if (d->paused)
    return 1; /* a line waits to be taken: the host is the one not reading */
  if (uv_fileno((uv_handle_t *)&d->out, &fd) != 0)
    return 0;
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int n;
  do
    n = poll(&p, 1, 0);
  while (n < 0 && errno == EINTR);
  return n > 0;
}

/* Every tick of a stream's heartbeat (rlm_driver_heartbeat): what the far
 * side took of the write queue since the last tick counts as heard, as
 * what it sent does (on_read_out); a quiet stream is pinged, and one that
 * stays quiet lost_ms after its ping is killed. */
static void on_heartbeat(uv_timer_t *t) {
  rlm_driver *d = t->data;
  uint64_t now = uv_now(&d->loop);
  size_t queued = uv_stream_get_write_queue_size((uv_stream_t *)&d->in);
  if (queued < d->hb_queued || output_waiting(d)) {
    d->hb_heard = now;
    d->hb_waiting = 0;
  }
  d->hb_queued = queued;
  if (d->hb_waiting) {
    if (now - d->hb_ping_at >= d->hb_lost) {
      terminate(d, RLM_EV_SILENT);
      uv_stop(&d->loop); /* an event is queued: the wait is over */
    }
  } else if (now - d->hb_heard >= d->hb_every) {
    uv_buf_t part = uv_buf_init(d->hb_ping, (unsigned)d->hb_ping_len);
    if (send_line(d, 'K', &part, 1) == 0) {
      d->hb_waiting = 1;
      d->hb_ping_at = now;
      d->hb_queued = uv_stream_get_write_queue_size((uv_stream_t *)&d->in);
    }
  }
}

int rlm_driver_heartbeat(rlm_driver *d, const char *ping, size_t len,
                         unsigned every_ms, unsigned lost_ms) {
  uv_timer_stop(&d->heartbeat);
  if (every_ms == 0)
    return 0;
  if (!d->channel || len == 0 || len > sizeof(d->hb_ping) ||
      memchr(ping, '\n', len) != NULL || lost_ms == 0)
    return -1;
  if (d->start_failed || d->exited || d->killed || d->terminal_queued)
    return 0; /* its end is on its way */
  memcpy(d->hb_ping, ping, len);
  d->hb_ping_len = len;
  d->hb_every = every_ms;
  d->hb_lost = lost_ms;
  uv_update_time(&d->loop);
  d->hb_heard = uv_now(&d->loop);
  d->hb_waiting = 0;
  d->hb_queued = uv_stream_get_write_queue_size((uv_stream_t *)&d->in);
  uv_timer_start(&d->heartbeat, on_heartbeat, every_ms, every_ms);
  return 0;
}

/* A timer that fires in uv_run's timers phase, before its poll, would not
 * end a UV_RUN_ONCE: with no timer left the poll blocks until the sandbox
 * says something, and an idle one never does (a late context's 1 ms waits
 * hung the host so). uv_stop makes that poll return at once. */
static void on_wait(uv_timer_t *t) {
  rlm_driver *d = t->data;
  d->wait_expired = 1;
  uv_stop(&d->loop);
}

/* SIGINT came while rlm_driver_wait's handle was set (csrc/interrupt.h). */
static void on_sigint_wake(uv_async_t *a) {
  rlm_driver *d = a->data;
  d->interrupted = 1;
  uv_stop(&d->loop);
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
  if (d->prepare_arg != NULL)
    d->prepare_free(d->prepare_arg);
  if (d->pidfd >= 0)
    close(d->pidfd);
  if (d->in_reader >= 0)
    close(d->in_reader);
  if (d->in_hold >= 0)
    close(d->in_hold);
  if (d->uid_lock >= 0)
    rlm_uid_release(d->uid_lock, d->uid);
  for (size_t i = 0; i < sizeof(d->child_fds) / sizeof(int); i++)
    if (d->child_fds[i] >= 0)
      close(d->child_fds[i]);
  free(d->argv);
  free(d->env);
  free(d->stage);
  free(d->workdir);
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
  close_handle(d, &d->heartbeat);
  close_handle(d, &d->started);
  close_handle(d, &d->sigint);
  while (d->handles > 0)
    run_loop(d, UV_RUN_ONCE);
  /* Every handle is closed, so this cannot report EBUSY. */
  (void)uv_loop_close(&d->loop);
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
 * outlive the Lua state, which unloads it on close. A program (rlm-keeper,
 * RLM_PROGRAM) is never unloaded. */
static int pin_library(void) {
#ifdef RLM_PROGRAM
  return 0;
#endif
  Dl_info self;
  return dladdr((void *)keeper_main, &self) != 0 && self.dli_fname != NULL &&
                 dlopen(self.dli_fname,
                        RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) != NULL
             ? 0
             : -1;
}

static rlm_driver *driver_start(const rlm_driver_opts *o, char *err,
                                size_t errlen, int *took);

rlm_driver *rlm_driver_start(const rlm_driver_opts *o, char *err,
                             size_t errlen) {
  int took = 0;
  rlm_driver *d = driver_start(o, err, errlen, &took);
  /* Once made, the driver owns prepare_arg (free_driver frees it). */
  if (d == NULL && !took && o->prepare_arg != NULL)
    o->prepare_free(o->prepare_arg);
  return d;
}

static rlm_driver *driver_start(const rlm_driver_opts *o, char *err,
                                size_t errlen, int *took) {
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
    errno = EINVAL;
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
  d->prepare = o->prepare;
  d->prepare_arg = o->prepare_arg;
  d->prepare_free = o->prepare_free;
  *took = 1;
  d->uid_lock = -1;
  d->pidfd = -1;
  d->in_reader = -1;
  d->in_hold = -1;
  d->uid = (uint32_t)getuid();
  for (size_t i = 0; i < sizeof(d->child_fds) / sizeof(int); i++)
    d->child_fds[i] = -1;
  d->argv = copy_strings(o->argv, (size_t)-1);
  d->env = copy_strings(o->env, (size_t)-1);
  d->stage = copy_strings(o->stage, o->n_stage);
  d->n_stage = o->n_stage;
  if ((o->prepare == NULL && d->argv == NULL) ||
      (o->env != NULL && d->env == NULL) ||
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
  d->channel = o->channel;
  d->seccomp_only = o->seccomp_only;
  if (o->seccomp_only &&
      (!o->claim_uid || o->workdir == NULL || o->workdir[0] != '/' ||
       (d->workdir = strdup(o->workdir)) == NULL)) {
    snprintf(err, errlen,
             "a seccomp-only sandbox needs a uid of its own and "
             "an absolute workdir");
    free_driver(d);
    errno = EINVAL;
    return NULL;
  }

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
  init_timer(d, &d->heartbeat);
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
  if ((rc = uv_async_init(&d->loop, &d->sigint, on_sigint_wake)) != 0) {
    snprintf(err, errlen, "uv_async_init: %s", uv_strerror(rc));
    goto failed;
  }
  d->sigint.data = d;
  d->handles++;
  uv_unref((uv_handle_t *)&d->sigint); /* keeps no loop alive */

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
  if ((d->in_reader = fcntl(p_in[0], F_DUPFD_CLOEXEC, FD_BASE)) < 0) {
    snprintf(err, errlen, "fcntl(F_DUPFD_CLOEXEC): %s", strerror(errno));
    goto failed_pipes;
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
  if (len > MAX_WRITE_QUEUE)
    return -1; /* and a uv_buf_t's length holds it */
  uv_buf_t part = uv_buf_init((char *)data, (unsigned)len);
  return rlm_driver_sendv(d, &part, 1);
}

int rlm_driver_sendv(rlm_driver *d, const uv_buf_t *parts, int n) {
  return send_line(d, d->channel, parts, n);
}

int rlm_driver_send_on(rlm_driver *d, char channel, const char *data,
                       size_t len) {
  if (len > MAX_WRITE_QUEUE || !d->channel)
    return -1;
  uv_buf_t part = uv_buf_init((char *)data, (unsigned)len);
  return send_line(d, channel, &part, 1);
}

typedef struct raw_req {
  uv_write_t req;
  size_t len;
} raw_req;

static void on_raw_write(uv_write_t *req, int status) {
  raw_req *r = (raw_req *)req;
  rlm_driver *d = req->data;
  (void)status; /* a failed write shows as the process's exit */
  d->raw_pending--;
  d->raw_bytes -= r->len;
  free(r);
}

int rlm_driver_send_raw(rlm_driver *d, const char *data, size_t len) {
  if (d->start_failed || d->kill_pending || d->exited || d->killed ||
      d->in_closed || !d->channel)
    return -1;
  /* In slices a uv_buf_t's length holds; libuv keeps their order. */
  const size_t slice = 1u << 30;
  for (size_t at = 0; at < len; at += slice) {
    size_t n = len - at < slice ? len - at : slice;
    raw_req *r = malloc(sizeof(*r));
    uv_buf_t buf = uv_buf_init((char *)data + at, (unsigned)n);
    if (r == NULL ||
        uv_write(&r->req, (uv_stream_t *)&d->in, &buf, 1, on_raw_write) != 0) {
      free(r);
      if (at > 0)
        kill_sandbox(d); /* part of it went: the stream is broken */
      return -1;
    }
    r->req.data = d;
    r->len = n;
    d->raw_pending++;
    d->raw_bytes += n;
  }
  return 0;
}

int rlm_driver_raw_done(const rlm_driver *d) { return d->raw_pending == 0; }

static int send_line(rlm_driver *d, char channel, const uv_buf_t *parts,
                     int n) {
  /* While it starts, what is sent waits in the pipe. */
  if (d->start_failed || d->kill_pending || d->exited || d->killed ||
      d->in_closed || n < 1 || n > 8)
    return -1;
  uv_buf_t bufs[10];
  size_t len = 0;
  int first = 0;
  if (channel) {
    bufs[0] = uv_buf_init(channel == 'K' ? "K" : "D", 1);
    first = 1;
    len = 1;
  }
  for (int i = 0; i < n; i++) {
    if (memchr(parts[i].base, '\n', parts[i].len) != NULL)
      return -1;
    bufs[first + i] = parts[i];
    len += parts[i].len;
  }
  n += first;
  /* A stream's raw context is the caller's memory, not the queue's (of
   * which libuv may have written part at once). */
  size_t queued = uv_stream_get_write_queue_size((uv_stream_t *)&d->in);
  queued -= queued < d->raw_bytes ? queued : d->raw_bytes;
  if (queued + len > MAX_WRITE_QUEUE)
    return -1;
  /* The line and its newline straight to the pipe when nothing waits before
   * it (a short line always fits); what the pipe does not take now is
   * copied and queued. */
  bufs[n] = uv_buf_init("\n", 1);
  int sent = uv_try_write((uv_stream_t *)&d->in, bufs, (unsigned)n + 1);
  if (sent == UV_EAGAIN || sent == UV_ENOSYS)
    sent = 0;
  else if (sent < 0)
    return -1;
  if ((size_t)sent == len + 1)
    return 0;
  size_t done = (size_t)sent, rest = len + 1 - done;
  write_req *w = malloc(sizeof(*w) + rest);
  if (w == NULL) {
    if (done > 0)
      kill_sandbox(d); /* part of a line went: the stream is broken */
    return -1;
  }
  /* What is left of the parts and the newline, from byte `done` on. */
  size_t at = 0, skip = done;
  for (int i = 0; i <= n; i++) {
    size_t take = bufs[i].len;
    if (skip >= take) {
      skip -= take;
      continue;
    }
    memcpy(w->data + at, bufs[i].base + skip, take - skip);
    at += take - skip;
    skip = 0;
  }
  w->len = rest;
  uv_buf_t buf = uv_buf_init(w->data, (unsigned)w->len);
  if (uv_write(&w->req, (uv_stream_t *)&d->in, &buf, 1, on_write) != 0) {
    free(w);
    if (done > 0)
      kill_sandbox(d); /* part of a line went: the stream is broken */
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

/* How many waits read_ahead sits out after a try that found nothing. */
#define READ_AHEAD_BACKOFF 8

/* Before the loop waits, one read of the driver's stdout straight into the
 * framing buffer: on one CPU the driver has usually answered by the time
 * the host waits (the write that woke it let it run), and the line is then
 * had with the one read the floor makes, without the loop's epoll_wait.
 * Only while reading is on and no timer of the loop is due (the deadline
 * still fires in the loop); a try that finds nothing (EAGAIN: the usual
 * case when the driver runs on another CPU), the end or an error leaves it
 * all to the loop, and the next READ_AHEAD_BACKOFF waits do not try.
 * Returns 1 when a complete line is held. */
static int read_ahead(rlm_driver *d) {
  if (d->read_ahead_skip > 0) {
    d->read_ahead_skip--;
    return 0;
  }
  if (!d->reading || d->paused || d->out_eof || d->terminal_queued)
    return 0;
  uv_update_time(&d->loop);
  if (uv_backend_timeout(&d->loop) == 0)
    return 0;
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&d->out, &fd) != 0)
    return 0;
  size_t len;
  char *p = rlm_framer_space(&d->framer, READ_CHUNK, &len);
  if (p == NULL)
    return 0; /* no room: the loop's read reports the overflow */
  ssize_t n;
  do
    n = read(fd, p, len);
  while (n < 0 && errno == EINTR);
  if (n <= 0) {
    d->read_ahead_skip = READ_AHEAD_BACKOFF;
    return 0;
  }
  d->hb_heard = uv_now(&d->loop);
  d->hb_waiting = 0;
  rlm_framer_commit(&d->framer, (size_t)n);
  if (rlm_framer_ready(&d->framer)) {
    d->paused = 1;
    return 1;
  }
  if (rlm_framer_overflowed(&d->framer))
    terminate(d, RLM_EV_OVERFLOW);
  return 0;
}

int rlm_driver_wait(rlm_driver *d, int timeout_ms, int interruptible,
                    unsigned seen) {
  if (has_event(d))
    return 0;
  if (timeout_ms != 0 && read_ahead(d))
    return 0;
  if (timeout_ms == 0) {
    run_loop(d, UV_RUN_NOWAIT);
    return 0;
  }
  d->wait_expired = 0;
  d->interrupted = 0;
  if (interruptible) {
    rlm_interrupt_wake(&d->sigint);
    if (rlm_interrupt_count() != seen) { /* one came before the handle */
      rlm_interrupt_wake(NULL);
      return 1;
    }
  }
  if (timeout_ms > 0) {
    /* From now, not from when the loop last ran (its cached clock). */
    uv_update_time(&d->loop);
    uv_timer_start(&d->wait, on_wait, (uint64_t)timeout_ms, 0);
  }
  while (!has_event(d) && !d->wait_expired && !d->interrupted &&
         uv_loop_alive(&d->loop))
    run_loop(d, UV_RUN_ONCE);
  if (interruptible)
    rlm_interrupt_wake(NULL);
  uv_timer_stop(&d->wait);
  return d->interrupted;
}

rlm_event *rlm_driver_take(rlm_driver *d) { return pop_event(d); }

void rlm_driver_line_taken(rlm_driver *d) { rlm_framer_trim(&d->framer); }

void rlm_driver_kill(rlm_driver *d) {
  kill_sandbox(d);
  stop_reading(d);
  drop_lines(d);
  uv_timer_stop(&d->deadline);
  uv_timer_stop(&d->heartbeat);
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

const uint64_t *rlm_driver_stamps(const rlm_driver *d) {
  return d->spawned ? d->stamps : NULL;
}

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
  /* At the end of its input the driver leaves at once, and bubblewrap's
   * init follows it on its own, racing the launcher, which may exit
   * before it has reaped the init: a zombie for the host's init to
   * collect (start_gap_spec, under load). So no end of input comes from
   * here: the keeper kills the init first, then lets the stdin go. */
  uv_os_fd_t in_fd;
  if (d->spawned && !d->exited &&
      uv_fileno((const uv_handle_t *)&d->in, &in_fd) == 0)
    d->in_hold = fcntl(in_fd, F_DUPFD_CLOEXEC, FD_BASE);
  stop_reading(d);
  close_loop(d); /* the pidfd's watch too: from here only the keeper reaps */
  teardowns_add(1);
  pthread_mutex_lock(&d->mu);
  d->handed = 1;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
}
