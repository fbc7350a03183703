/* farside_listen.c: rlm-keeper --listen ADDR:PORT --token-file PATH
 * (docs/backends.md, "A keeper that listens"; docs/protocol.md, "The
 * claim"): the stream on a TCP connection rather than on stdin and stdout,
 * for a pod that the host reaches over the cluster's network without a
 * kubectl process of its own. The keeper reads its token once, listens,
 * and serves one session: a connection's first line must be the claim with
 * that token within CLAIM_WAIT_MS of its connect; a wrong token, a line
 * that is not a claim or is too long, silence, and an end before the line
 * are refused (said on the connection, logged on stderr) and closed while
 * the keeper goes on listening. The first right claim takes the keeper:
 * the listener and every other connection are closed, and the stream runs
 * on that connection as it would on stdin and stdout. */
#define _GNU_SOURCE
#include "farside.h"
#include "jsonread.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static int term_pipe[2] = {-1, -1};

static void on_term(int sig) {
  (void)sig;
  int saved = errno;
  (void)!write(term_pipe[1], "T", 1); /* full: a byte is there already */
  errno = saved;
}

int far_term_init(void) {
  if (pipe2(term_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    return -1;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_term;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  return sigaction(SIGTERM, &sa, NULL);
}

int far_term_fd(void) { return term_pipe[0]; }

#define CLAIM_WAIT_MS 2000 /* from a connect to its claim's newline */
#define CLAIM_LINE_MAX 256 /* the claim, with its channel byte and newline */
#define CLAIM_PENDING 16   /* connections waiting to claim at once */
/* A refused connection is shut for writing and read to its end (or this
 * long) before it is closed: a close with the host's start still unread
 * would be a reset, which may overtake the refusal it was told. */
#define CLAIM_CLOSE_MS 1000
#define CLAIM_TOKEN_LEN 32 /* 16 bytes of the host's random source, as hex */
/* TCP's keep-alive on the claimed connection: a host whose machine is
 * gone (no FIN, no RST) ends the stream after about a minute. */
#define KEEPALIVE_IDLE_S 30
#define KEEPALIVE_INTVL_S 10
#define KEEPALIVE_COUNT 3

typedef struct claim_conn {
  int fd;
  uint64_t since; /* its accept, on monotonic_ms's clock */
  size_t len;     /* of its first line, read so far */
  int closing;    /* refused: read to its end, then closed (since: then) */
  char line[CLAIM_LINE_MAX];
  char peer[64];
} claim_conn;

struct far_listener {
  int fd;
  char token[CLAIM_TOKEN_LEN + 1];
  char where[80];
  claim_conn pending[CLAIM_PENDING];
  int n;
};

/* The token, from a regular file no other uid may write: 32 of [0-9a-f],
 * then a newline or nothing. A FIFO or a device is never opened for long
 * (O_NONBLOCK), and then refused. 0, or -1 with err. */
static int read_token_file(const char *path, char *out, char *err,
                           size_t errlen) {
  int fd;
  do
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    snprintf(err, errlen, "open %.200s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    snprintf(err, errlen, "fstat %.200s: %s", path, strerror(errno));
    close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode) || (st.st_mode & S_IWOTH) != 0) {
    snprintf(err, errlen,
             "the token file %.200s is not a regular file that no other "
             "user may write (mode %o)",
             path, (unsigned)(st.st_mode & 07777));
    close(fd);
    return -1;
  }
  char buf[CLAIM_TOKEN_LEN + 2];
  size_t n = 0;
  while (n < sizeof(buf)) {
    ssize_t r = read(fd, buf + n, sizeof(buf) - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      snprintf(err, errlen, "read %.200s: %s", path, strerror(errno));
      close(fd);
      return -1;
    }
    if (r == 0)
      break;
    n += (size_t)r;
  }
  close(fd);
  if (n == CLAIM_TOKEN_LEN + 1 && buf[CLAIM_TOKEN_LEN] == '\n')
    n--;
  buf[n < sizeof(buf) ? n : sizeof(buf) - 1] = '\0';
  if (n != CLAIM_TOKEN_LEN ||
      !token_form_ok(buf, CLAIM_TOKEN_LEN, CLAIM_TOKEN_LEN)) {
    snprintf(err, errlen,
             "the token file %.200s does not hold %d of [0-9a-f] (and an "
             "optional newline)",
             path, CLAIM_TOKEN_LEN);
    return -1;
  }
  memcpy(out, buf, CLAIM_TOKEN_LEN + 1);
  return 0;
}

/* ADDR:PORT: an IPv4 literal, or an IPv6 one in brackets ([::]:7070). */
static int parse_listen(const char *spec, struct sockaddr_storage *ss,
                        socklen_t *len) {
  char host[64];
  const char *colon = strrchr(spec, ':');
  if (colon == NULL || colon == spec || colon[1] == '\0')
    return -1;
  size_t hl = (size_t)(colon - spec);
  if (spec[0] == '[') {
    if (hl < 3 || spec[hl - 1] != ']')
      return -1;
    spec++;
    hl -= 2;
  }
  if (hl >= sizeof(host))
    return -1;
  memcpy(host, spec, hl);
  host[hl] = '\0';
  char *end;
  errno = 0;
  long port = strtol(colon + 1, &end, 10);
  if (*end != '\0' || errno != 0 || port < 0 || port > 65535)
    return -1;
  return rlm_socket_address(host, (unsigned)port, ss, len);
}

/* "10.0.0.1:7070" or "[fd00::1]:7070". */
static void format_address(const struct sockaddr_storage *ss, char *out,
                           size_t len) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)ss;
    (void)inet_ntop(AF_INET6, &v6->sin6_addr, ip, sizeof(ip));
    snprintf(out, len, "[%s]:%u", ip, (unsigned)ntohs(v6->sin6_port));
  } else {
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)ss;
    (void)inet_ntop(AF_INET, &v4->sin_addr, ip, sizeof(ip));
    snprintf(out, len, "%s:%u", ip, (unsigned)ntohs(v4->sin_port));
  }
}

far_listener *far_listen_open(const char *addr, const char *token_file,
                              char *err, size_t errlen) {
  struct sockaddr_storage ss;
  socklen_t len;
  if (parse_listen(addr, &ss, &len) != 0) {
    snprintf(err, errlen,
             "--listen %.200s is not ADDR:PORT (an IPv4 address, or an IPv6 "
             "one in brackets, and a port of 0 to 65535)",
             addr);
    return NULL;
  }
  far_listener *l = calloc(1, sizeof(*l));
  if (l == NULL) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  if (read_token_file(token_file, l->token, err, errlen) != 0) {
    free(l);
    return NULL;
  }
  l->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int one = 1;
  if (l->fd < 0 ||
      setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      bind(l->fd, (struct sockaddr *)&ss, len) != 0 ||
      listen(l->fd, CLAIM_PENDING) != 0 ||
      getsockname(l->fd, (struct sockaddr *)&ss, &len) != 0) {
    snprintf(err, errlen, "listening on %.200s: %s", addr, strerror(errno));
    if (l->fd >= 0)
      close(l->fd);
    explicit_bzero(l->token, sizeof(l->token));
    free(l);
    return NULL;
  }
  format_address(&ss, l->where, sizeof(l->where));
  /* The bound port (--listen ...:0 takes any): for whoever started it. */
  fprintf(stderr, "rlm-keeper[%d]: listening on %s\n", (int)getpid(), l->where);
  return l;
}

/* Closes pending connection i and forgets it. */
static void claim_close(far_listener *l, int i) {
  close(l->pending[i].fd);
  memmove(&l->pending[i], &l->pending[i + 1],
          (size_t)(l->n - i - 1) * sizeof(claim_conn));
  l->n--;
}

/* Lets go of pending connection i: told why (best effort, never blocking)
 * and logged; then closed at once (hard), or shut for writing and left to
 * claim_closing, so that the refusal reaches the host before any reset. */
static void claim_drop(far_listener *l, int i, const char *why, int hard) {
  claim_conn *c = &l->pending[i];
  if (why != NULL && !c->closing) {
    char line[160];
    int n = snprintf(line, sizeof(line),
                     "K{\"type\":\"refused\",\"message\":\"%s\"}\n", why);
    if (n > 0 && (size_t)n < sizeof(line))
      (void)!send(c->fd, line, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    fprintf(stderr, "rlm-keeper[%d]: refused a claim from %s: %s\n",
            (int)getpid(), c->peer, why);
  }
  if (hard || c->closing || shutdown(c->fd, SHUT_WR) != 0) {
    claim_close(l, i);
    return;
  }
  c->closing = 1;
  c->since = monotonic_ms();
}

/* A refused connection that the poll found readable: what it sent is
 * read and dropped; at its end (or an error) it is closed. */
static void claim_closing(far_listener *l, int i) {
  char sink[4096];
  for (int k = 0; k < 16; k++) {
    ssize_t r = recv(l->pending[i].fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (r <= 0)
      break;
  }
  claim_close(l, i);
}

/* NULL when line (its channel byte to its newline) is the claim with this
 * keeper's token; else why not. */
static const char *claim_problem(far_listener *l, const char *line,
                                 size_t len) {
  rlm_jtok t[16];
  char type[16], token[CLAIM_TOKEN_LEN * 4 + 1];
  if (len < 2 || line[0] != 'K' || line[len - 1] != '\n')
    return "the first line is not a claim";
  long n = rlm_json_parse(line + 1, len - 2, t, 16, 2);
  const char *s = line + 1;
  if (n < 1 || t[0].type != RLM_JT_OBJECT ||
      rlm_json_string(s, t, rlm_json_get(s, t, 0, "type"), type, sizeof(type)) <
          0 ||
      strcmp(type, "claim") != 0 ||
      rlm_json_string(s, t, rlm_json_get(s, t, 0, "token"), token,
                      sizeof(token)) < 0)
    return "the first line is not a claim";
  int same = same_secret(token, l->token);
  explicit_bzero(token, sizeof(token));
  return same ? NULL : "a wrong token";
}

/* Reads what connection i sent of its first line, up to its newline and
 * never past it (what follows is the stream's). 1: the right claim; 0: not
 * yet a line; -1: refused and closed. */
static int claim_read(far_listener *l, int i) {
  claim_conn *c = &l->pending[i];
  size_t room = sizeof(c->line) - c->len;
  ssize_t r;
  do
    r = recv(c->fd, c->line + c->len, room, MSG_PEEK);
  while (r < 0 && errno == EINTR);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    return 0;
  if (r <= 0) {
    claim_drop(l, i, r == 0 ? "it ended before its claim" : strerror(errno), 1);
    return -1;
  }
  char *nl = memchr(c->line + c->len, '\n', (size_t)r);
  size_t take = nl != NULL ? (size_t)(nl - (c->line + c->len)) + 1 : (size_t)r;
  ssize_t got;
  do
    got = recv(c->fd, c->line + c->len, take, 0);
  while (got < 0 && errno == EINTR);
  if (got != (ssize_t)take) {
    claim_drop(l, i, "its first line could not be read", 1);
    return -1;
  }
  c->len += take;
  if (nl == NULL) {
    if (c->len < sizeof(c->line))
      return 0;
    claim_drop(l, i, "a first line longer than a claim", 0);
    return -1;
  }
  const char *why = claim_problem(l, c->line, c->len);
  explicit_bzero(c->line, sizeof(c->line));
  if (why != NULL) {
    claim_drop(l, i, why, 0);
    return -1;
  }
  return 1;
}

static void claim_accept(far_listener *l) {
  for (;;) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = accept4(l->fd, (struct sockaddr *)&ss, &len,
                     SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0 && errno == EINTR)
      continue;
    if (fd < 0)
      return; /* EAGAIN, or a connection that died in the queue */
    if (l->n == CLAIM_PENDING)
      claim_drop(l, 0, "too many connections waiting to claim", 1);
    claim_conn *c = &l->pending[l->n++];
    memset(c, 0, sizeof(*c));
    c->fd = fd;
    c->since = monotonic_ms();
    format_address(&ss, c->peer, sizeof(c->peer));
  }
}

/* The claimed connection as the stream wants it: lines go out at once
 * (no Nagle: a step is a line each way), and a host that vanished without
 * a word is noticed by TCP's keep-alive. */
static int claim_tune(int fd, char *err, size_t errlen) {
  int one = 1, idle = KEEPALIVE_IDLE_S, intvl = KEEPALIVE_INTVL_S,
      count = KEEPALIVE_COUNT;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count)) != 0) {
    snprintf(err, errlen, "setsockopt: %s", strerror(errno));
    return -1;
  }
  return 0;
}

int far_listen_claim(far_listener *l, char *err, size_t errlen) {
  int won = -1;
  while (won < 0) {
    struct pollfd p[2 + CLAIM_PENDING];
    uint64_t now = monotonic_ms();
    int timeout = -1;
    p[0] = (struct pollfd){.fd = l->fd, .events = POLLIN};
    /* SIGTERM before a claim: the keeper ends (far_term_init). */
    p[1 + l->n] = (struct pollfd){.fd = far_term_fd(), .events = POLLIN};
    for (int i = 0; i < l->n; i++) {
      p[1 + i] = (struct pollfd){.fd = l->pending[i].fd, .events = POLLIN};
      uint64_t due = l->pending[i].since +
                     (l->pending[i].closing ? CLAIM_CLOSE_MS : CLAIM_WAIT_MS);
      int left = due > now ? (int)(due - now) : 0;
      if (timeout < 0 || left < timeout)
        timeout = left;
    }
    int n = poll(p, (nfds_t)(2 + l->n), timeout);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      snprintf(err, errlen, "poll: %s", strerror(errno));
      return -1;
    }
    if (p[1 + l->n].revents != 0) {
      snprintf(err, errlen, "SIGTERM before a claim: the keeper ends");
      return -1;
    }
    now = monotonic_ms();
    /* From the last: a drop moves only the ones after it, seen already. */
    for (int i = l->n - 1; i >= 0 && won < 0; i--) {
      int r = 0;
      if (l->pending[i].closing) {
        if (now >= l->pending[i].since + CLAIM_CLOSE_MS)
          claim_close(l, i);
        else if (p[1 + i].revents != 0)
          claim_closing(l, i);
        continue;
      }
      if (p[1 + i].revents != 0)
        r = claim_read(l, i);
      if (r == 1)
        won = i;
      else if (r == 0 && now >= l->pending[i].since + CLAIM_WAIT_MS)
        claim_drop(l, i, "no claim within 2000 ms of its connect", 0);
    }
    if (won < 0 && (p[0].revents & POLLIN))
      claim_accept(l);
  }
  claim_conn c = l->pending[won];
  l->pending[won].fd = -1;
  memmove(&l->pending[won], &l->pending[won + 1],
          (size_t)(l->n - won - 1) * sizeof(claim_conn));
  l->n--;
  while (l->n > 0)
    claim_drop(l, l->n - 1, "the keeper is claimed", 1);
  close(l->fd);
  l->fd = -1;
  explicit_bzero(l->token, sizeof(l->token));
  if (claim_tune(c.fd, err, errlen) != 0) {
    close(c.fd);
    return -1;
  }
  fprintf(stderr, "rlm-keeper[%d]: claimed by %s on %s\n", (int)getpid(),
          c.peer, l->where);
  return c.fd;
}
