/* driver_connect.c: a stream to a listening rlm-keeper over TCP
 * (rlm_driver_connect; docs/protocol.md, "The claim"): the same Driver as
 * a stream to a process (its framing, channels, heartbeat, deadline and
 * events), with a socket where the pipes were and no process at all. The
 * connect is begun without blocking and finished by the loop; the claim
 * line goes first, and what the host sends meanwhile waits in libuv's
 * write queue (a write to a socket still connecting is EAGAIN, so libuv
 * waits for it to be writable). out reads the socket and in writes a dup
 * of it: libuv watches each descriptor once. The stream's end is the
 * socket's: the far side's close, an error, or the host's kill, which
 * shuts it down; nothing outlives rlm_driver_close. */
#define _GNU_SOURCE
#include "driver_impl.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

/* host (an IPv4 or IPv6 literal) and port (0 to 65535) as a socket
 * address: 0, or -1. rlm-keeper's --listen reads its address with it too. */
int rlm_socket_address(const char *host, unsigned port,
                       struct sockaddr_storage *ss, socklen_t *len) {
  memset(ss, 0, sizeof(*ss));
  struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
  if (port > 65535)
    return -1;
  if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)port);
    *len = sizeof(*v4);
    return 0;
  }
  if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons((uint16_t)port);
    *len = sizeof(*v6);
    return 0;
  }
  return -1;
}

static int sock_fd(rlm_driver *d) {
  uv_os_fd_t fd;
  return uv_is_closing((uv_handle_t *)&d->out) ||
                 uv_fileno((uv_handle_t *)&d->out, &fd) != 0
             ? -1
             : fd;
}

static void sock_note(rlm_driver *d, int status) {
  if (d->sock && status < 0 && status != UV_EOF && status != UV_ECANCELED &&
      d->sock_err == 0)
    d->sock_err = status;
}

static void sock_heard(rlm_driver *d) {
  if (d->sock && !d->sock_heard) {
    d->sock_heard = 1;
    uv_timer_stop(&d->claim_timer);
  }
}

/* The stream is over: the socket shut down both ways, and its end
 * reported as an exit whose "stderr" says why. */
static void sock_ended(rlm_driver *d, int status) {
  if (d->exited)
    return;
  sock_note(d, status);
  d->exited = 1;
  d->out_eof = 1;
  d->in_closed = 1;
  uv_timer_stop(&d->claim_timer);
  uv_timer_stop(&d->deadline);
  uv_timer_stop(&d->heartbeat);
  uv_timer_stop(&d->grace);
  stop_reading(d);
  int fd = sock_fd(d);
  if (fd >= 0)
    (void)shutdown(fd, SHUT_RDWR); /* ENOTCONN: it is down already */
  int n;
  if (d->killed && d->sock_err == 0)
    n = snprintf(d->err_tail, sizeof(d->err_tail),
                 "the host closed the connection to rlm-keeper at %s", d->peer);
  else if (d->sock_err != 0 && !d->sock_heard)
    n = snprintf(d->err_tail, sizeof(d->err_tail),
                 "connecting to rlm-keeper at %s: %s", d->peer,
                 uv_strerror(d->sock_err));
  else if (d->sock_err != 0)
    n = snprintf(d->err_tail, sizeof(d->err_tail),
                 "the connection to rlm-keeper at %s failed: %s", d->peer,
                 uv_strerror(d->sock_err));
  else
    n = snprintf(d->err_tail, sizeof(d->err_tail),
                 "rlm-keeper at %s closed the connection", d->peer);
  d->err_len = n > 0 ? (size_t)n : 0;
  if (d->err_len > STDERR_TAIL)
    d->err_len = STDERR_TAIL;
  maybe_queue_exit(d);
}

static void on_sock_killed(uv_timer_t *t) { sock_ended(t->data, 0); }

/* The host's kill: the socket shut down now (the keeper takes it as the
 * end of its input, and ends everything it started), the end reported on
 * the loop's next turn, after whatever terminal event the kill is for. */
static void sock_shutdown(rlm_driver *d) {
  if (d->killed || d->exited)
    return;
  d->killed = 1;
  d->in_closed = 1;
  int fd = sock_fd(d);
  if (fd >= 0)
    (void)shutdown(fd, SHUT_RDWR);
  uv_timer_start(&d->grace, on_sock_killed, 0, 0);
}

/* Nothing from the far side within claim_ms of the connect: no connection
 * (a host that drops the SYN: a deleted pod's address), or one that the
 * keeper never answered (a stopped one). */
static void on_claim_timeout(uv_timer_t *t) {
  rlm_driver *d = t->data;
  if (d->sock_heard || d->terminal_queued)
    return;
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  int fd = sock_fd(d);
  int connected = fd >= 0 && getpeername(fd, (struct sockaddr *)&ss, &len) == 0;
  snprintf(d->start_err, sizeof(d->start_err),
           connected ? "rlm-keeper at %s took the connection and sent "
                       "nothing within %u ms (sandbox.start_timeout_ms)"
                     : "connecting to rlm-keeper at %s: no connection "
                       "within %u ms (sandbox.start_timeout_ms)",
           d->peer, d->claim_ms);
  terminate(d, RLM_EV_FAILED);
  if (d->tail != NULL && d->tail->kind == RLM_EV_FAILED &&
      (d->tail->data = strdup(d->start_err)) != NULL)
    d->tail->len = strlen(d->tail->data);
  uv_stop(&d->loop); /* an event is queued: the wait is over */
}

static rlm_driver *connect_failed(rlm_driver *d, int *fds) {
  for (int i = 0; i < 2; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  close_loop(d);
  free_driver(d);
  return NULL;
}

rlm_driver *rlm_driver_connect(const rlm_connect_opts *o, char *err,
                               size_t errlen) {
  struct sockaddr_storage ss;
  socklen_t len;
  if (o->port == 0 || rlm_socket_address(o->host, o->port, &ss, &len) != 0) {
    snprintf(err, errlen, "%.100s is not an IPv4 or IPv6 address", o->host);
    errno = EINVAL;
    return NULL;
  }
  int free_fds = rlm_fd_headroom(RLM_DRIVER_FDS);
  if (free_fds < RLM_DRIVER_FDS) {
    snprintf(err, errlen,
             "too few free file descriptors (EMFILE): %d free of the %d a "
             "driver needs",
             free_fds, RLM_DRIVER_FDS);
    errno = EMFILE;
    return NULL;
  }
  rlm_driver *d = calloc(1, sizeof(*d));
  if (d == NULL) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  d->uid_lock = d->pidfd = d->wake_fd = d->in_reader = d->in_hold = -1;
  for (size_t i = 0; i < sizeof(d->child_fds) / sizeof(int); i++)
    d->child_fds[i] = -1;
  d->context_at = -1;
  atomic_store(&d->ctx_done, 1);
  d->framer.max = o->max_line;
  d->channel = 'D';
  d->sock = 1;
  d->err_eof = 1; /* no stderr: the exit's text is the socket's end */
  d->claim_ms = o->claim_ms;
  snprintf(d->peer, sizeof(d->peer),
           ss.ss_family == AF_INET6 ? "[%.60s]:%u" : "%.60s:%u", o->host,
           o->port);
  int fds[2] = {-1, -1}, rc = uv_loop_init(&d->loop);
  if (rc != 0) {
    snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(rc));
    free_driver(d);
    return NULL;
  }
  uv_timer_t *timers[] = {&d->deadline, &d->wait, &d->grace, &d->heartbeat,
                          &d->claim_timer};
  for (size_t i = 0; i < sizeof(timers) / sizeof(timers[0]); i++)
    init_timer(d, timers[i]);
  if ((rc = init_pipe(d, &d->in)) != 0 || (rc = init_pipe(d, &d->out)) != 0 ||
      (rc = uv_async_init(&d->loop, &d->sigint, on_sigint_wake)) != 0) {
    snprintf(err, errlen, "the stream's loop: %s", uv_strerror(rc));
    return connect_failed(d, fds);
  }
  d->sigint.data = d;
  d->handles++;
  uv_unref((uv_handle_t *)&d->sigint);
  int one = 1, e = 0;
  fds[0] = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fds[0] < 0 ||
      setsockopt(fds[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
      ((rc = connect(fds[0], (struct sockaddr *)&ss, len)) != 0 &&
       errno != EINPROGRESS) ||
      (fds[1] = fcntl(fds[0], F_DUPFD_CLOEXEC, 0)) < 0)
    e = errno;
  if (e != 0) {
    snprintf(err, errlen, "connecting to rlm-keeper at %s: %s", d->peer,
             strerror(e));
    errno = e;
    return connect_failed(d, fds);
  }
  if ((rc = uv_pipe_open(&d->out, fds[0])) == 0)
    fds[0] = -1;
  if (rc == 0 && (rc = uv_pipe_open(&d->in, fds[1])) == 0)
    fds[1] = -1;
  if (rc != 0) {
    snprintf(err, errlen, "watching the connection to %s: %s", d->peer,
             uv_strerror(rc));
    return connect_failed(d, fds);
  }
  d->spawned = d->start_seen = 1;
  d->exec_ns = uv_hrtime();
  /* A refusal on the same machine comes within connect(): said now. */
  struct pollfd p = {.fd = fds[0] >= 0 ? fds[0] : sock_fd(d),
                     .events = POLLOUT};
  socklen_t elen = sizeof(e);
  if (poll(&p, 1, 0) == 1 &&
      getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &e, &elen) == 0 && e != 0) {
    snprintf(err, errlen, "connecting to rlm-keeper at %s: %s", d->peer,
             strerror(e));
    errno = e;
    return connect_failed(d, fds);
  }
  /* The claim first: what the host sends next queues behind it. */
  if (rlm_driver_send_on(d, 'K', o->claim, o->claim_len) != 0) {
    snprintf(err, errlen,
             "connecting to rlm-keeper at %s: the connection failed as it "
             "was made",
             d->peer);
    return connect_failed(d, fds);
  }
  uv_read_start((uv_stream_t *)&d->out, alloc_out, on_read_out);
  d->reading = 1;
  uv_timer_start(&d->claim_timer, on_claim_timeout, o->claim_ms, 0);
  return d;
}
