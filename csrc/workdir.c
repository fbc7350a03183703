/* workdir.c: see workdir.h. */
#define _GNU_SOURCE
#include "workdir.h"

#include "sandbox.h"
#include "watchdog.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

int rlm_context_fd(const char *data, size_t len) {
  int fd = (int)syscall(SYS_memfd_create, "rlm-context",
                        MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return -1;
  const char *p = data;
  size_t left = len;
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      int saved = n < 0 ? errno : EIO;
      close(fd);
      errno = saved;
      return -1;
    }
    p += n;
    left -= (size_t)n;
  }
  if (fcntl(fd, F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0 ||
      lseek(fd, 0, SEEK_SET) != 0) {
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

int rlm_workdir_usage(pid_t launcher, uint64_t *bytes, uint64_t *files) {
  pid_t pids[2];
  if (rlm_tree_pids(launcher, pids, 2) != 2)
    return -1;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/root" RLM_SANDBOX_WORKDIR,
           (int)pids[1]);
  struct statvfs st;
  int rc;
  while ((rc = statvfs(path, &st)) != 0 && errno == EINTR)
    ;
  if (rc != 0)
    return -1;
  *bytes = (uint64_t)(st.f_blocks - st.f_bfree) * st.f_frsize;
  uint64_t used = (uint64_t)(st.f_files - st.f_ffree);
  *files = used > 0 ? used - 1 : 0;
  return 0;
}
