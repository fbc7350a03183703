/* farside_linger.c: a keeper that outlives its stream (docs/protocol.md,
 * "Lingering"). When the host's start asks for it ("linger": ms, id,
 * token, fence), the keeper listens on a Unix socket named by the id, in a
 * directory only its uid can open; when its stream ends it keeps the
 * driver, its REPL and the lines it sent, for ms at most, and another
 * invocation of rlm-keeper (--attach, in the same place: podman exec -i,
 * kubectl exec -i, a local process: farside_attach.c) hands it a new
 * stream through that socket: its stdin and stdout, with the host's attach
 * line. The token (farside_token.c's compare) and
 * a fence no lower than the last one let it in; anything else is refused,
 * said and logged, and the keeper goes on as it was. The lines the dead
 * stream may have lost are replayed from the number the host says it saw.
 * The token never appears on a command line: it comes on the streams. */
#define _GNU_SOURCE
#include "farside.h"
#include "jsonread.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <unistd.h>

#define LINGER_MAX_MS 600000       /* ten minutes: a bound on what is left */
#define ATTACH_WAIT_MS 2000        /* for an attacher's message once it is in */
#define REPLAY_MIN ((size_t)65536) /* kept past one line of max_line */
#define REPLAY_MAX ((size_t)64 << 20)
#define FENCE_MAX ((int64_t)1 << 53) /* a Lua number holds it exactly */

/* --- the directory and the names ---------------------------------------- */

/* The socket's directory: --linger-dir (or RLM_KEEPER_LINGER_DIR), else
 * $XDG_RUNTIME_DIR/rlm-keeper, else /tmp/rlm-keeper-<euid>. */
static int linger_dir_path(const char *given, char *out, size_t len) {
  const char *env = getenv("RLM_KEEPER_LINGER_DIR");
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n;
  if (given == NULL && env != NULL && env[0] != '\0')
    given = env;
  if (given != NULL)
    n = snprintf(out, len, "%s", given);
  else if (xdg != NULL && xdg[0] == '/')
    n = snprintf(out, len, "%s/rlm-keeper", xdg);
  else
    n = snprintf(out, len, "/tmp/rlm-keeper-%u", (unsigned)geteuid());
  return n > 0 && (size_t)n < len && out[0] == '/' ? 0 : -1;
}

/* The directory is this uid's own: a directory (not a link to one), its
 * owner this uid, no bit for its group or others. Made so when make is
 * set and it is not there. 0, or -1 with why. */
static int linger_dir_check(const char *dir, int make, char *err,
                            size_t errlen) {
  if (make && mkdir(dir, 0700) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "mkdir %.200s: %s", dir, strerror(errno));
    return -1;
  }
  struct stat st;
  if (lstat(dir, &st) != 0) {
    snprintf(err, errlen, "lstat %.200s: %s", dir, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0) {
    snprintf(
        err, errlen,
        "the linger directory %.200s is not a directory of uid %u that only "
        "it can open (mode %o, owner %u)",
        dir, (unsigned)geteuid(), (unsigned)(st.st_mode & 07777),
        (unsigned)st.st_uid);
    return -1;
  }
  return 0;
}

static int id_ok(const char *id) {
  size_t n = strlen(id);
  if (n == 0 || n > 64)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') ||
          (id[i] >= '0' && id[i] <= '9') || id[i] == '-' || id[i] == '_'))
      return 0;
  return 1;
}

static int sock_address(struct sockaddr_un *a, const char *dir,
                        const char *id) {
  memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  int n = snprintf(a->sun_path, sizeof(a->sun_path), "%s/%s", dir, id);
  return n > 0 && (size_t)n < sizeof(a->sun_path) ? 0 : -1;
}

static void linger_log(far *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void linger_log(far *f, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  /* stderr: the first host's, gone perhaps; a pipe's end is an EPIPE */
  fprintf(stderr, "rlm-keeper[%d] %s: %s\n", (int)getpid(), f->linger_id, msg);
}

/* --- the start: the host's linger, and the socket ---------------------- */

/* The socket, bound and listening. A name another keeper's socket holds
 * is refused while that keeper answers; one no process listens on is a
 * dead keeper's, and taken. */
static int linger_listen(far *f, char *err, size_t errlen) {
  if (linger_dir_path(f->linger_dir, f->sock_dir, sizeof(f->sock_dir)) != 0) {
    snprintf(err, errlen, "the linger directory's path is too long");
    return -1;
  }
  struct sockaddr_un a;
  if (sock_address(&a, f->sock_dir, f->linger_id) != 0) {
    snprintf(err, errlen, "the socket's path in %.200s is too long",
             f->sock_dir);
    return -1;
  }
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -1;
  }
  int rc = -1;
  for (int tries = 0; tries < 3 && rc != 0; tries++) {
    /* again after ENOENT: another keeper's end took the empty directory */
    if (linger_dir_check(f->sock_dir, 1, err, errlen) != 0)
      break;
    rc = bind(fd, (struct sockaddr *)&a, sizeof(a));
    if (rc != 0 && errno == EADDRINUSE) {
      int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
      int e =
          probe >= 0 && connect(probe, (struct sockaddr *)&a, sizeof(a)) != 0
              ? errno
              : 0;
      if (probe >= 0)
        close(probe);
      if (e != ECONNREFUSED) {
        snprintf(err, errlen, "a keeper lingers as %s already", f->linger_id);
        break;
      }
      (void)unlink(a.sun_path);
    } else if (rc != 0 && errno != ENOENT) {
      snprintf(err, errlen, "bind %s: %s", a.sun_path, strerror(errno));
      break;
    }
  }
  if (rc == 0 && listen(fd, 8) != 0) {
    snprintf(err, errlen, "listen: %s", strerror(errno));
    (void)unlink(a.sun_path);
    rc = -1;
  }
  if (rc != 0) {
    close(fd);
    return -1;
  }
  snprintf(f->sock_path, sizeof(f->sock_path), "%s", a.sun_path);
  f->listen_fd = fd;
  return 0;
}

/* The start's "linger" object at t[i]: {"ms","id","token","fence"}. */
static int linger_read(far *f, const start_msg *m, long i, char *err,
                       size_t errlen) {
  start_msg sub = {.s = m->s, .t = m->t, .root = i};
  int64_t ms, fence;
  if (m->t[i].type != RLM_JT_OBJECT ||
      field_int(&sub, "ms", 1, LINGER_MAX_MS, &ms) != 0 ||
      field_int(&sub, "fence", 0, FENCE_MAX, &fence) != 0 ||
      rlm_json_string(m->s, m->t, rlm_json_get(m->s, m->t, i, "id"),
                      f->linger_id, sizeof(f->linger_id)) < 0 ||
      rlm_json_string(m->s, m->t, rlm_json_get(m->s, m->t, i, "token"),
                      f->token, sizeof(f->token)) < 0 ||
      !id_ok(f->linger_id) || !token_form_ok(f->token, 32, 128)) {
    snprintf(err, errlen,
             "the host's linger is not {ms: 1 to %d, id: 1 to 64 of "
             "[A-Za-z0-9_-], token: 32 to 128 of [0-9a-f], fence: 0 to 2^53}",
             LINGER_MAX_MS);
    return -1;
  }
  if (linger_listen(f, err, errlen) != 0)
    return -1;
  f->linger_ms = (uint64_t)ms;
  f->fence = fence;
  f->keep_max = f->max_line + 2 + REPLAY_MIN;
  if (f->keep_max > REPLAY_MAX)
    f->keep_max = REPLAY_MAX;
  return 0;
}

/* --- the stream's end, the wait, and an attach --------------------------- */

/* Lets go of the stream (stdin and stdout keep their numbers, on
 * /dev/null) and of its attacher. */
static void stream_drop(far *f) {
  int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  int fds[2] = {f->in_fd, f->out_fd};
  for (int i = 0; i < 2; i++) {
    if (fds[i] <= 1 && null >= 0)
      (void)dup2(null, fds[i]);
    else if (fds[i] > 1)
      close(fds[i]);
  }
  if (null >= 0)
    close(null);
  f->in_fd = 0;
  f->out_fd = 1;
  if (f->conn_fd >= 0)
    close(f->conn_fd); /* the attacher's wait ends */
  f->conn_fd = -1;
  f->line_len = 0; /* half a line of the dead stream's */
  f->chunk_at = f->chunk_end = 0;
  f->pre_len = f->pre_off = 0;
}

static int linger_detach(far *f) {
  if (f->linger_ms == 0 || f->listen_fd < 0 || f->d == NULL || f->ended)
    return 0;
  if (f->raw_left > 0) {
    linger_log(f, "the stream ended inside the context: no linger");
    return 0;
  }
  stream_drop(f);
  f->detached = 1;
  f->detached_ms = monotonic_ms();
  linger_log(f, "the stream ended: lingering %llu ms, %llu lines sent",
             (unsigned long long)f->linger_ms, (unsigned long long)f->out_seq);
  return 1;
}

static int linger_left_ms(far *f) {
  if (!f->detached)
    return -1;
  uint64_t spent = monotonic_ms() - f->detached_ms;
  return spent >= f->linger_ms ? 0 : (int)(f->linger_ms - spent);
}

/* A refused attach: said on its stream (best effort), logged (stderr and
 * syslog), and let go of; the keeper goes on as it was. */
static void refuse(far *f, int conn, const int *fds, const char *why) {
  linger_log(f, "refused an attach: %s", why);
  /* The stderr above is the first stream's, gone with a dead host's pipe:
   * syslog's authpriv too, where the machine has one. */
  syslog(LOG_AUTHPRIV | LOG_WARNING, "rlm-keeper[%d] %s: refused an attach: %s",
         (int)getpid(), f->linger_id, why);
  if (fds[1] >= 0) {
    char line[600];
    size_t n = (size_t)snprintf(line, sizeof(line),
                                "K{\"type\":\"refused\",\"message\":\"");
    size_t len = strlen(why);
    if (rlm_json_escaped_len(why, len) < sizeof(line) - n - 4) {
      rlm_json_escape(why, len, line + n);
      n += rlm_json_escaped_len(why, len);
    }
    memcpy(line + n, "\"}\n", 3);
    (void)fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK);
    (void)!write(fds[1], line, n + 3);
  }
  for (int i = 0; i < 2; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  close(conn);
}

/* The attacher's message: its line (the host's attach) and two
 * descriptors (its stdin and stdout), within ATTACH_WAIT_MS. 0, or -1 with
 * why (what came of the descriptors is closed). */
static int take_message(int conn, char *line, size_t cap, size_t *len, int *fds,
                        const char **why) {
  struct pollfd p = {.fd = conn, .events = POLLIN};
  int n;
  do
    n = poll(&p, 1, ATTACH_WAIT_MS);
  while (n < 0 && errno == EINTR);
  if (n <= 0) {
    *why = "no message within the attach's wait";
    return -1;
  }
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int) * 4)];
  } ctl;
  struct iovec io = {.iov_base = line, .iov_len = cap};
  struct msghdr msg = {.msg_iov = &io,
                       .msg_iovlen = 1,
                       .msg_control = ctl.buf,
                       .msg_controllen = sizeof(ctl.buf)};
  ssize_t r;
  do
    r = recvmsg(conn, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  while (r < 0 && errno == EINTR);
  int got = 0;
  for (struct cmsghdr *c = r >= 0 ? CMSG_FIRSTHDR(&msg) : NULL; c != NULL;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (got < 2)
        fds[got] = fd;
      else
        close(fd);
      got++;
    }
  }
  if (r <= 0 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || got != 2) {
    *why = r <= 0 ? "no message" : "not a line and two descriptors";
    return -1;
  }
  *len = (size_t)r;
  return 0;
}

/* What the attach line says, checked against this keeper. NULL, or why
 * it is refused. */
static const char *check_attach(far *f, const char *line, size_t len,
                                int64_t *fence, uint64_t *seen) {
  rlm_jtok t[64];
  if (len < 2 || line[0] != 'K' || line[len - 1] != '\n')
    return "the first line is not an attach message";
  long n = rlm_json_parse(line + 1, len - 2, t, 64, 4);
  const char *s = line + 1;
  char type[16], id[65], token[129];
  int64_t v;
  start_msg m = {.s = s, .t = t, .root = 0};
  if (n < 1 || t[0].type != RLM_JT_OBJECT ||
      rlm_json_string(s, t, rlm_json_get(s, t, 0, "type"), type, sizeof(type)) <
          0 ||
      strcmp(type, "attach") != 0 ||
      rlm_json_string(s, t, rlm_json_get(s, t, 0, "id"), id, sizeof(id)) < 0 ||
      rlm_json_string(s, t, rlm_json_get(s, t, 0, "token"), token,
                      sizeof(token)) < 0 ||
      field_int(&m, "fence", 0, FENCE_MAX, fence) != 0 ||
      field_int(&m, "seen", 0, INT64_MAX, &v) != 0)
    return "the first line is not an attach message";
  if (strcmp(id, f->linger_id) != 0)
    return "the attach names another keeper";
  if (!same_secret(token, f->token))
    return "a wrong token";
  if (*fence < f->fence)
    return "a stale fence (lower than the last one)";
  if ((uint64_t)v > f->out_seq)
    return "it says it saw more lines than were sent";
  *seen = (uint64_t)v;
  return NULL;
}

static void linger_accept(far *f) {
  int conn = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (conn < 0)
    return;
  int fds[2] = {-1, -1};
  struct ucred cred;
  socklen_t clen = sizeof(cred);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 ||
      cred.uid != geteuid()) {
    /* the directory lets no other uid in; this is the second wall */
    char why[64];
    snprintf(why, sizeof(why), "a connection of uid %d",
             clen == sizeof(cred) ? (int)cred.uid : -1);
    refuse(f, conn, fds, why);
    return;
  }
  char line[ATTACH_LINE_MAX];
  size_t len = 0;
  const char *why = NULL;
  int64_t fence = 0;
  uint64_t seen = 0;
  if (take_message(conn, line, sizeof(line), &len, fds, &why) != 0 ||
      (why = check_attach(f, line, len, &fence, &seen)) != NULL) {
    refuse(f, conn, fds, why);
    return;
  }
  if (!f->detached) {
    /* A newer owner takes the sandbox: the stream that drove it is cut,
     * told so when it is between lines. */
    if (f->out_off == f->out_keep || f->out[f->out_off - 1] == '\n') {
      char cut[96];
      int n =
          snprintf(cut, sizeof(cut), "K{\"type\":\"fenced\",\"fence\":%lld}\n",
                   (long long)fence);
      (void)!write(f->out_fd, cut, (size_t)n);
    }
    linger_log(f, "fence %lld takes the sandbox from fence %lld",
               (long long)fence, (long long)f->fence);
    stream_drop(f);
  }
  f->in_fd = fds[0];
  f->out_fd = fds[1];
  f->conn_fd = conn;
  (void)fcntl(f->out_fd, F_SETFL, fcntl(f->out_fd, F_GETFL) | O_NONBLOCK);
  f->fence = fence;
  f->detached = 0;
  /* The replay: from the line the host has not seen, or the oldest kept. */
  uint64_t from = seen < f->keep_seq ? f->keep_seq : seen;
  size_t at = f->out_keep;
  for (uint64_t k = f->keep_seq; k < from; k++) {
    char *nl = memchr(f->out + at, '\n', f->out_len - at);
    at = (size_t)(nl - f->out) + 1; /* lines below out_seq are whole */
  }
  f->out_off = at;
  f->pre_off = 0;
  f->pre_len = (size_t)snprintf(
      f->pre, sizeof(f->pre),
      "K{\"type\":\"attached\",\"fence\":%lld,\"seen\":%llu,\"from\":%llu,"
      "\"lost\":%llu,\"sent\":%llu,\"taken\":%llu,\"sandbox\":\"%s\","
      "\"pid\":%d}\n",
      (long long)fence, (unsigned long long)seen, (unsigned long long)from,
      (unsigned long long)(from - seen), (unsigned long long)f->out_seq,
      (unsigned long long)f->host_lines, far_mode_name(f->mode), (int)getpid());
  linger_log(f, "attached (fence %lld): lines %llu to %llu again, %llu lost",
             (long long)fence, (unsigned long long)from,
             (unsigned long long)f->out_seq, (unsigned long long)(from - seen));
}

static void linger_end(far *f) {
  if (f->listen_fd < 0)
    return;
  close(f->listen_fd);
  f->listen_fd = -1;
  (void)unlink(f->sock_path);
  (void)rmdir(f->sock_dir); /* when no other keeper's socket is there */
  if (f->conn_fd >= 0)
    close(f->conn_fd);
  f->conn_fd = -1;
}
