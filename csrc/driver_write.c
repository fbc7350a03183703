/* driver_write.c: the driver's write side: lines to its stdin (straight
 * to the pipe when nothing waits before them, else copied into a bounded
 * queue), a stream's channel byte before each and its raw bytes written
 * from the caller's memory (the context after its message), and a stream's
 * heartbeat, which pings a quiet far side and kills one that stays quiet.
 *
 * A write to a pipe without a reader would raise SIGPIPE, which kills the
 * host unless it ignores it. The host holds a read end of the driver's
 * stdin pipe for the driver's whole life (in_reader), so the pipe always has
 * a reader: a write to a driver that died or closed its stdin fills the
 * pipe (and then the bounded write queue) instead, and the process's exit
 * says what happened, and a write costs one system call. A socket (a
 * stream to a listening keeper, driver_connect.c) has no such reader: a
 * write to a peer that reset it raises SIGPIPE. So while a socket's
 * driver writes (here, and in the loop's turns), SIGPIPE is blocked in
 * this thread, and one that the write raised is taken before the mask is
 * given back; the host's disposition, mask and a SIGPIPE it had pending
 * are left as they were. A pipe's driver touches no signal mask. */
#define _GNU_SOURCE
#include "driver_impl.h"

typedef struct write_req {
  uv_write_t req;
  size_t len;
  char data[];
} write_req;

static int send_line(rlm_driver *d, char channel, const char *data, size_t len);

static void on_write(uv_write_t *req, int status) {
  /* A failed write shows as the process's exit; a socket's error is
   * given once, to whichever call comes first: kept for that exit. */
  sock_note(req->handle->data, status);
  free(req);
}

int rlm_driver_send(rlm_driver *d, const char *data, size_t len) {
  return send_line(d, d->channel, data, len);
}

int rlm_driver_send_on(rlm_driver *d, char channel, const char *data,
                       size_t len) {
  if (!d->channel)
    return -1;
  return send_line(d, channel, data, len);
}

typedef struct raw_req {
  uv_write_t req;
  size_t len;
} raw_req;

static void on_raw_write(uv_write_t *req, int status) {
  raw_req *r = (raw_req *)req;
  rlm_driver *d = req->data;
  sock_note(d, status); /* as on_write */
  d->raw_pending--;
  d->raw_bytes -= r->len;
  free(r);
}

void sigpipe_block(const rlm_driver *d, sigpipe_hold *h) {
  sigset_t pipe, pending;
  h->held = 0;
  if (!d->sock)
    return;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  if (pthread_sigmask(SIG_BLOCK, &pipe, &h->old) != 0)
    return;
  h->held = 1;
  h->had = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
}

static void sock_guard(rlm_driver *d) {
  if (!d->sock_guard.held)
    sigpipe_block(d, &d->sock_guard);
}

static void sock_unguard(rlm_driver *d) {
  sigpipe_unblock(&d->sock_guard);
  d->sock_guard.held = 0;
}

void sigpipe_unblock(sigpipe_hold *h) {
  sigset_t pipe, pending;
  if (!h->held)
    return;
  int saved = errno;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  if (!h->had && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
    const struct timespec now = {0, 0};
    while (sigtimedwait(&pipe, NULL, &now) < 0 && errno == EINTR)
      ;
  }
  (void)pthread_sigmask(SIG_SETMASK, &h->old, NULL);
  errno = saved;
}

static int send_raw(rlm_driver *d, const char *data, size_t len);

int rlm_driver_send_raw(rlm_driver *d, const char *data, size_t len) {
  sigpipe_hold h;
  sigpipe_block(d, &h);
  int rc = send_raw(d, data, len);
  sigpipe_unblock(&h);
  return rc;
}

static int send_raw(rlm_driver *d, const char *data, size_t len) {
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

/* One line of a write: its channel byte (0: none) and its bytes. */
typedef struct line_part {
  char channel;
  const char *data;
  size_t len;
} line_part;

static int write_lines(rlm_driver *d, const line_part *lines, int n_lines);

static int send_line(rlm_driver *d, char channel, const char *data,
                     size_t len) {
  line_part one = {channel, data, len};
  return write_lines(d, &one, 1);
}

int rlm_driver_send_pair(rlm_driver *d, const char *keeper, size_t klen,
                         const char *data, size_t len) {
  if (!d->channel)
    return -1;
  line_part two[2] = {{'K', keeper, klen}, {d->channel, data, len}};
  return write_lines(d, two, 2);
}

/* uv_try_write for a socket: sendmsg with MSG_NOSIGNAL, so that a write
 * after a peer's reset is EPIPE, never SIGPIPE, and no signal mask need
 * change around it (blocking SIGPIPE and taking back one that came cost a
 * write four system calls). Nothing goes before what libuv has queued. */
static int sock_try_write(rlm_driver *d, const uv_buf_t *bufs, int n) {
  uv_os_fd_t fd;
  if (uv_stream_get_write_queue_size((uv_stream_t *)&d->in) > 0)
    return UV_EAGAIN;
  if (uv_fileno((const uv_handle_t *)&d->in, &fd) != 0)
    return UV_EBADF;
  struct iovec iov[6];
  for (int i = 0; i < n; i++)
    iov[i] = (struct iovec){.iov_base = bufs[i].base, .iov_len = bufs[i].len};
  struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
  ssize_t r;
  do
    r = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
  if (r >= 0)
    return (int)r;
  return errno == EAGAIN || errno == EWOULDBLOCK
             ? UV_EAGAIN
             : uv_translate_sys_error(errno);
}

/* Lines (at most two) in one write: each its channel byte, its bytes and
 * its newline; all of them or none. */
static int write_lines(rlm_driver *d, const line_part *lines, int n_lines) {
  /* While it starts, what is sent waits in the pipe. A uv_buf_t's length
   * holds len (MAX_WRITE_QUEUE). */
  if (d->start_failed || d->kill_pending || d->exited || d->killed ||
      d->in_closed || n_lines < 1 || n_lines > 2)
    return -1;
  uv_buf_t bufs[6];
  int n = 0;
  size_t len = 0; /* every line's bytes, with their channels and newlines */
  for (int i = 0; i < n_lines; i++) {
    const line_part *l = &lines[i];
    if (l->len > MAX_WRITE_QUEUE || memchr(l->data, '\n', l->len) != NULL)
      return -1;
    if (l->channel)
      bufs[n++] = uv_buf_init(l->channel == 'K' ? "K" : "D", 1);
    bufs[n++] = uv_buf_init((char *)l->data, (unsigned)l->len);
    bufs[n++] = uv_buf_init("\n", 1);
    len += l->len + 1 + (l->channel ? 1 : 0);
  }
  /* A stream's raw context is the caller's memory, not the queue's (of
   * which libuv may have written part at once). */
  size_t queued = uv_stream_get_write_queue_size((uv_stream_t *)&d->in);
  queued -= queued < d->raw_bytes ? queued : d->raw_bytes;
  if (len > MAX_WRITE_QUEUE || queued + len > MAX_WRITE_QUEUE)
    return -1;
  /* The lines straight to the pipe when nothing waits before them (short
   * lines always fit); what the pipe does not take now is copied and
   * queued. */
  int sent = d->sock ? sock_try_write(d, bufs, n)
                     : uv_try_write((uv_stream_t *)&d->in, bufs, (unsigned)n);
  if (sent == UV_EAGAIN || sent == UV_ENOSYS)
    sent = 0;
  else if (sent < 0)
    return -1;
  if ((size_t)sent == len)
    return 0;
  size_t done = (size_t)sent, rest = len - done;
  write_req *w = malloc(sizeof(*w) + rest);
  if (w == NULL) {
    if (done > 0)
      kill_sandbox(d); /* part of a line went: the stream is broken */
    return -1;
  }
  /* What is left of the lines, from byte `done` on. */
  size_t at = 0, skip = done;
  for (int i = 0; i < n; i++) {
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
  sock_guard(d); /* uv_write writes at once what it can, with write() */
  int rc = uv_write(&w->req, (uv_stream_t *)&d->in, &buf, 1, on_write);
  if (!d->in_run)
    sock_unguard(d); /* else at the run's end: the loop may write the rest */
  if (rc != 0) {
    free(w);
    if (done > 0)
      kill_sandbox(d); /* part of a line went: the stream is broken */
    return -1;
  }
  return 0;
}

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

/* A tick of a stream's heartbeat (rlm_driver_heartbeat): what the far
 * side took of the write queue since the last tick counts as heard, as
 * what it sent does (on_read_out); a quiet stream is pinged, and one that
 * stays quiet lost_ms after its ping is killed. Each tick sets the next
 * for when the next of those can be due (every_ms after the last heard,
 * lost_ms after the ping), not a fixed period later: a stopped far side
 * is lost every_ms + lost_ms after it last spoke, not up to two periods
 * past that. */
static void on_heartbeat(uv_timer_t *t) {
  rlm_driver *d = t->data;
  uint64_t now = uv_now(&d->loop), next;
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
      return;
    }
    next = d->hb_ping_at + d->hb_lost - now;
  } else if (now - d->hb_heard >= d->hb_every) {
    if (send_line(d, 'K', d->hb_ping, d->hb_ping_len) == 0) {
      d->hb_waiting = 1;
      d->hb_ping_at = now;
      d->hb_queued = uv_stream_get_write_queue_size((uv_stream_t *)&d->in);
    }
    next = d->hb_waiting ? d->hb_lost : d->hb_every;
  } else {
    next = d->hb_heard + d->hb_every - now;
  }
  /* Within every_ms at most: a write queue that shrinks is heard only at
   * a tick. */
  if (next > d->hb_every)
    next = d->hb_every;
  uv_timer_start(t, on_heartbeat, next > 0 ? next : 1, 0);
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
  uv_timer_start(&d->heartbeat, on_heartbeat, every_ms, 0);
  return 0;
}
