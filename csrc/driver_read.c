/* driver_read.c: the driver's read side and its events. The driver's stdout
 * is read into one framing buffer (csrc/framing.c) and lines are taken out
 * of it one at a time, as views, when the caller polls: reading stops while
 * a complete line waits to be taken, so a driver that floods its stdout
 * fills the pipe and blocks, and what the host holds for it is that buffer
 * (at most max_line + 1 bytes) and a few terminal events, whatever it sends.
 * Its stderr keeps a tail for the exit's event. Here too: the queue of
 * terminal events, the wait (rlm_driver_wait, with its read ahead) and the
 * take, and the loop's descriptor and timeout for a host's own loop. */
#define _GNU_SOURCE
#include "driver_impl.h"

/* A socket's queued writes go out in the loop's turns: SIGPIPE is held
 * from the start when some wait, or from the write a callback queues. */
static void run_loop(rlm_driver *d, uv_run_mode mode) {
  if (uv_stream_get_write_queue_size((uv_stream_t *)&d->in) > 0)
    sock_guard(d);
  d->in_run = 1;
  uv_run(&d->loop, mode);
  d->in_run = 0;
  sock_unguard(d);
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
  if (nread < 0 && d->sock) {
    sock_ended(d, (int)nread); /* the stream's end is the socket's */
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
  sock_heard(d);
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
    if (n < 0 && errno != EAGAIN)
      sock_note(d, -errno); /* a socket's error is given once: keep it */
    d->read_ahead_skip = READ_AHEAD_BACKOFF;
    return 0;
  }
  sock_heard(d);
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

int rlm_driver_backend_fd(rlm_driver *d) { return uv_backend_fd(&d->loop); }

int rlm_driver_backend_timeout(rlm_driver *d) {
  return has_event(d) ? 0 : uv_backend_timeout(&d->loop);
}
