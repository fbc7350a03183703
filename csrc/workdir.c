/* workdir.c: see workdir.h. */
#define _GNU_SOURCE
#include "workdir.h"

#include "sandbox.h"
#include "watchdog.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

int rlm_context_open(void) {
  return (int)syscall(SYS_memfd_create, "rlm-context",
                      MFD_CLOEXEC | MFD_ALLOW_SEALING);
}

int rlm_context_append(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0)
        errno = EIO;
      return -1;
    }
    data += n;
    len -= (size_t)n;
  }
  return 0;
}

int rlm_context_seal(int fd) {
  const int all = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
  if (fcntl(fd, F_ADD_SEALS, all) != 0 || lseek(fd, 0, SEEK_SET) != 0)
    return -1;
  /* Read back: the driver checks the seals only of a context it maps. */
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return -1;
  if ((seals & all) != all) {
    errno = EPERM;
    return -1;
  }
  return 0;
}

int rlm_sealed_reopen(int fd) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  int r;
  while ((r = open(path, O_RDONLY | O_CLOEXEC)) < 0 && errno == EINTR)
    ;
  return r;
}

/* /proc/<init>/root/session, where init is the launcher's child. */
static int workdir_path(pid_t launcher, char *path, size_t len) {
  pid_t pids[2];
  if (rlm_tree_pids(launcher, pids, 2) != 2)
    return -1;
  snprintf(path, len, "/proc/%d/root" RLM_SANDBOX_WORKDIR, (int)pids[1]);
  return 0;
}

int rlm_workdir_pin(pid_t launcher) {
  char path[64];
  if (workdir_path(launcher, path, sizeof(path)) != 0)
    return -1;
  int fd;
  while ((fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0 &&
         errno == EINTR)
    ;
  return fd;
}

int rlm_workdir_usage(pid_t launcher, uint64_t *bytes, uint64_t *files) {
  char path[64];
  if (workdir_path(launcher, path, sizeof(path)) != 0)
    return -1;
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

/* --- a workdir that is a plain directory (seccomp_only, driver.h) -------- */

/* How deep a directory may sit below the workdir: deeper, the walk counts
 * the workdir as full, and the removal moves it up first. */
#define WALK_DEPTH 64

typedef struct walk {
  uint64_t bytes, files, max_files;
  int over;
} walk;

/* Counts what the directory at fd holds (and closes fd). */
static void walk_in(int fd, int depth, walk *w) {
  DIR *dir = fdopendir(fd);
  if (dir == NULL) {
    close(fd);
    return;
  }
  struct dirent *e;
  while (!w->over && (e = readdir(dir)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    if (++w->files > w->max_files) {
      w->over = 1;
      break;
    }
    struct stat st;
    if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
      continue; /* gone meanwhile */
    w->bytes += (uint64_t)st.st_blocks * 512;
    if (!S_ISDIR(st.st_mode))
      continue;
    if (depth + 1 >= WALK_DEPTH) {
      w->over = 1;
      break;
    }
    int sub = openat(dirfd(dir), e->d_name,
                     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub >= 0)
      walk_in(sub, depth + 1, w);
  }
  closedir(dir);
}

int rlm_workdir_walk(const char *path, uint64_t max_files, uint64_t *bytes,
                     uint64_t *files) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return -1;
  walk w = {.max_files = max_files > 0 ? max_files : UINT64_MAX - 1};
  walk_in(fd, 0, &w);
  *bytes = w.bytes;
  *files = w.over ? w.max_files + 1 : w.files;
  return 0;
}
