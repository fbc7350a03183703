/* waitset.c: see waitset.h. */
#define _GNU_SOURCE
#include "waitset.h"

#include <errno.h>
#include <stddef.h>
#include <sys/epoll.h>

int rlm_waitset_open(void) { return epoll_create1(EPOLL_CLOEXEC); }

int rlm_waitset_add(int set, int fd) {
  struct epoll_event ev = {.events = EPOLLIN, .data = {.fd = fd}};
  if (epoll_ctl(set, EPOLL_CTL_ADD, fd, &ev) == 0 || errno == EEXIST)
    return 0;
  return -1;
}

int rlm_waitset_remove(int set, int fd) {
  if (epoll_ctl(set, EPOLL_CTL_DEL, fd, NULL) == 0 || errno == ENOENT ||
      errno == EBADF)
    return 0;
  return -1;
}

int rlm_waitset_wait(int set, int timeout_ms) {
  struct epoll_event ev;
  int n = epoll_wait(set, &ev, 1, timeout_ms);
  if (n < 0 && errno == EINTR)
    return 0;
  return n;
}
