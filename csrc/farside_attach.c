/* farside_attach.c: rlm-keeper --attach (docs/protocol.md, "Lingering"):
 * run where a lingering keeper runs (podman exec -i, kubectl exec -i, a
 * local process), it reads the host's attach line, checks the socket's
 * directory as the keeper does (farside_linger.c), and hands its stdin and
 * stdout with that line to the keeper that lingers as the line's id; then
 * it waits while that stream lives. */
#define _GNU_SOURCE
#include "farside.h"
#include "jsonread.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int attach_fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static int attach_fail(const char *fmt, ...) {
  char why[512], esc[6 * sizeof(why)];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof(why), fmt, ap);
  va_end(ap);
  size_t len = strlen(why);
  rlm_json_escape(why, len, esc);
  esc[rlm_json_escaped_len(why, len)] = '\0';
  printf("K{\"type\":\"failed\",\"message\":\"rlm-keeper --attach: %s\"}\n",
         esc);
  fflush(stdout);
  fprintf(stderr, "rlm-keeper --attach: %s\n", why);
  return 1;
}

int far_attach_main(const char *linger_dir) {
  (void)signal(SIGPIPE, SIG_IGN);
  /* The host's first line, a byte at a time: what follows it is the
   * keeper's to read. */
  char line[ATTACH_LINE_MAX];
  size_t n = 0;
  while (n < sizeof(line)) {
    ssize_t r = read(0, line + n, 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    if (line[n++] == '\n')
      break;
  }
  rlm_jtok t[64];
  char id[65] = "", type[16] = "";
  long nt = n >= 2 && line[0] == 'K' && line[n - 1] == '\n'
                ? rlm_json_parse(line + 1, n - 2, t, 64, 4)
                : -1;
  if (nt < 1 || t[0].type != RLM_JT_OBJECT ||
      rlm_json_string(line + 1, t, rlm_json_get(line + 1, t, 0, "type"), type,
                      sizeof(type)) < 0 ||
      strcmp(type, "attach") != 0 ||
      rlm_json_string(line + 1, t, rlm_json_get(line + 1, t, 0, "id"), id,
                      sizeof(id)) < 0 ||
      !id_ok(id))
    return attach_fail("the first line is not an attach message with an id");
  char dir[PATH_MAX], err[PATH_MAX + 128];
  struct sockaddr_un a;
  if (linger_dir_path(linger_dir, dir, sizeof(dir)) != 0 ||
      sock_address(&a, dir, id) != 0)
    return attach_fail("the socket's path is too long");
  /* Only a socket this uid made gets the token. */
  if (linger_dir_check(dir, 0, err, sizeof(err)) != 0)
    return attach_fail("%s", err);
  int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (c < 0)
    return attach_fail("socket: %s", strerror(errno));
  if (connect(c, (struct sockaddr *)&a, sizeof(a)) != 0) {
    int e = errno;
    close(c);
    return attach_fail("no keeper lingers as %s here (connect: %s)", id,
                       strerror(e));
  }
  int fds[2] = {0, 1};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(fds))];
  } ctl;
  memset(&ctl, 0, sizeof(ctl));
  struct iovec io = {.iov_base = line, .iov_len = n};
  struct msghdr msg = {.msg_iov = &io,
                       .msg_iovlen = 1,
                       .msg_control = ctl.buf,
                       .msg_controllen = sizeof(ctl.buf)};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(fds));
  memcpy(CMSG_DATA(cm), fds, sizeof(fds));
  ssize_t r;
  do
    r = sendmsg(c, &msg, MSG_NOSIGNAL);
  while (r < 0 && errno == EINTR);
  if (r != (ssize_t)n) {
    int e = errno;
    close(c);
    return attach_fail("sendmsg: %s", strerror(e));
  }
  /* The stream is the keeper's now: this process's copies go, so that its
   * end is the keeper's alone. It waits while the stream lives (the keeper
   * closes the connection then): a podman or kubectl exec lasts as long. */
  int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0) {
    (void)dup2(null, 0);
    (void)dup2(null, 1);
    close(null);
  }
  char b;
  while ((r = read(c, &b, 1)) > 0 || (r < 0 && errno == EINTR))
    ;
  close(c);
  return 0;
}
