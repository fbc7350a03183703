/* canary.c: see canary.h. Each canary is something a weaker sandbox would
 * let the driver reach; the self-test tries them all. */
#define _GNU_SOURCE
#include "canary.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static void random_hex(char *out, size_t n) {
  unsigned char raw[16];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  ssize_t got = fd >= 0 ? read(fd, raw, sizeof(raw)) : -1;
  if (fd >= 0)
    close(fd);
  if (got != (ssize_t)sizeof(raw)) { /* not secret, only unique */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    memcpy(raw, &ts, sizeof(raw) < sizeof(ts) ? sizeof(raw) : sizeof(ts));
  }
  for (size_t i = 0; i < sizeof(raw) && 2 * i + 2 < n; i++)
    snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

static int listen_on(int family, const struct sockaddr *addr, socklen_t len) {
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  if (bind(fd, addr, len) != 0 || listen(fd, 1) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void rlm_canaries_plant(rlm_canaries *c, const char *home, const char *dir) {
  memset(c, 0, sizeof(*c));
  c->tcp_port = -1;
  c->leaked_fd = -1;
  for (int i = 0; i < 3; i++)
    c->fds[i] = -1;
  char id[33];
  random_hex(id, sizeof(id));
  snprintf(c->secret, sizeof(c->secret), "rlm-canary-%.24s", id);

  if (home != NULL && home[0] == '/') {
    snprintf(c->home_file, sizeof(c->home_file), "%s/.rlm-canary-%.12s", home,
             id);
    int fd = open(c->home_file,
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, c->secret, strlen(c->secret)) < 0)
      c->home_file[0] = '\0';
    if (fd >= 0)
      close(fd);
  }

  struct sockaddr_in in4;
  memset(&in4, 0, sizeof(in4));
  in4.sin_family = AF_INET;
  in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  c->fds[0] = listen_on(AF_INET, (struct sockaddr *)&in4, sizeof(in4));
  socklen_t len = sizeof(in4);
  if (c->fds[0] >= 0 &&
      getsockname(c->fds[0], (struct sockaddr *)&in4, &len) == 0)
    c->tcp_port = ntohs(in4.sin_port);

  struct sockaddr_un un;
  memset(&un, 0, sizeof(un));
  un.sun_family = AF_UNIX;
  int w = snprintf(un.sun_path, sizeof(un.sun_path),
                   "%s/.rlm-canary-%.12s.sock", dir, id);
  if (w > 0 && (size_t)w < sizeof(un.sun_path)) {
    c->fds[1] = listen_on(AF_UNIX, (struct sockaddr *)&un, sizeof(un));
    if (c->fds[1] >= 0)
      memcpy(c->unix_path, un.sun_path, sizeof(c->unix_path));
  }

  memset(&un, 0, sizeof(un));
  un.sun_family = AF_UNIX;
  snprintf(c->abstract_name, sizeof(c->abstract_name), "rlm-canary-%.12s", id);
  memcpy(un.sun_path + 1, c->abstract_name, strlen(c->abstract_name));
  c->fds[2] = listen_on(AF_UNIX, (struct sockaddr *)&un,
                        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                                    strlen(c->abstract_name)));
  if (c->fds[2] < 0)
    c->abstract_name[0] = '\0';

  /* What an nginx worker might have left open: no O_CLOEXEC, and the secret
   * behind it. */
  c->leaked_fd = open(c->home_file[0] ? c->home_file : "/dev/null", O_RDONLY);
}

void rlm_canaries_close_leaked(rlm_canaries *c) {
  if (c->leaked_fd >= 0) {
    close(c->leaked_fd);
    c->leaked_fd = -1;
  }
}

void rlm_canaries_remove(rlm_canaries *c) {
  for (int i = 0; i < 3; i++)
    if (c->fds[i] >= 0) {
      close(c->fds[i]);
      c->fds[i] = -1;
    }
  if (c->unix_path[0]) {
    (void)unlink(c->unix_path);
    c->unix_path[0] = '\0';
  }
  if (c->home_file[0]) {
    (void)unlink(c->home_file);
    c->home_file[0] = '\0';
  }
  rlm_canaries_close_leaked(c);
}
