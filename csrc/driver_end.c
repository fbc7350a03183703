/* driver_end.c: how a driver's process ends, on the host's loop: killed
 * (rlm_driver_kill; a step deadline; a terminal condition the host
 * enforced, reported once), exited (reaped through its pidfd, reported once
 * its output is drained), and closed (rlm_driver_close hands what is left
 * to the keeper thread, which kills, reaps and frees it).
 *
 * The memory watchdog runs on the driver's keeper thread (keeper.c,
 * watchdog_run), so that it keeps polling while the host is busy elsewhere
 * (a blocking model callback): it kills the sandbox itself and leaves a
 * flag that the loop turns into RLM_EV_MEMORY or RLM_EV_FILES
 * (check_breach). */
#define _GNU_SOURCE
#include "driver_impl.h"

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
  if (d->sock) {
    sock_shutdown(d); /* no process: the connection is the stream */
    return;
  }
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

static void on_deadline(uv_timer_t *t) {
  rlm_driver *d = t->data;
  d->deadline_hit = 1;
  terminate(d, RLM_EV_TIMEOUT);
  uv_stop(&d->loop); /* an event is queued: the wait is over (on_wait) */
}

int rlm_driver_linger(rlm_driver *d) {
  if (!d->channel)
    return -1;
  d->lingers = 1; /* read by the keeper thread after close() hands it over */
  return 0;
}

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

static void free_driver(rlm_driver *d) {
  if (d->prepare_arg != NULL)
    d->prepare_free(d->prepare_arg);
  if (d->pidfd >= 0)
    close(d->pidfd);
  if (d->wake_fd >= 0)
    close(d->wake_fd);
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
  close_handle(d, &d->claim_timer);
  close_handle(d, &d->started);
  close_handle(d, &d->sigint);
  while (d->handles > 0)
    run_loop(d, UV_RUN_ONCE);
  /* Every handle is closed, so this cannot report EBUSY. */
  (void)uv_loop_close(&d->loop);
}

/* Never waits for the sandbox: the keeper kills and reaps it. What waits is
 * the keeper's slice of the caller's context, if it is writing one (a
 * millisecond or so), since the caller may free it once this returns. */
void rlm_driver_close(rlm_driver *d) {
  if (d == NULL)
    return;
  if (d->sock) {
    /* No keeper thread, nothing to reap: the socket closes with the loop
     * (the far side reads its end), and the rest is freed now. */
    stop_reading(d);
    close_loop(d);
    free_driver(d);
    return;
  }
  pthread_mutex_lock(&d->mu);
  atomic_store(&d->closing, 1);
  pthread_cond_broadcast(&d->cv);
  /* Ends the watchdog's wait. It cannot fail (one count in an eventfd no
   * one reads); if it did, the watchdog would see closing a poll later. */
  uint64_t one = 1;
  if (d->wake_fd >= 0) {
    ssize_t n = write(d->wake_fd, &one, sizeof(one));
    (void)n;
  }
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
