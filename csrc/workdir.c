/* workdir.c: the session workdir. Everything in it was written by hostile
 * code, so removal never follows a symlink and never recurses deeper than a
 * fixed bound (deeper directories are moved up to the top and removed from
 * there). */
#define _GNU_SOURCE
#include "workdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEPTH 16

int rlm_workdir_create(const char *base, char *out, size_t outlen) {
  int w = snprintf(out, outlen, "%s/rlm-XXXXXX", base);
  if (w < 0 || (size_t)w >= outlen) {
    errno = ENAMETOOLONG;
    return -1;
  }
  return mkdtemp(out) ? 0 : -1; /* mkdtemp creates it 0700 */
}

static int write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    data += n;
    len -= (size_t)n;
  }
  return 0;
}

int rlm_workdir_write(const char *dir, const char *name, const char *data,
                      size_t len) {
  char path[PATH_MAX];
  if (strchr(name, '/') != NULL || name[0] == '\0' || name[0] == '.') {
    errno = EINVAL;
    return -1;
  }
  int w = snprintf(path, sizeof(path), "%s/%s", dir, name);
  if (w < 0 || (size_t)w >= sizeof(path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd =
      open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return -1;
  int rc = write_all(fd, data, len);
  int saved = errno;
  if (close(fd) != 0 && rc == 0) {
    saved = errno;
    rc = -1;
  }
  if (rc != 0) {
    (void)unlink(path);
    errno = saved;
  }
  return rc;
}

static int open_dir_at(int dfd, const char *name) {
  int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == EACCES && fchmodat(dfd, name, 0700, 0) == 0)
    fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  return fd;
}

/* Empties the directory open at dfd. Directories found at MAX_DEPTH are
 * renamed into top (the workdir) instead, and *moved is set so that the
 * caller goes round again. */
static int empty_dir(int top, int dfd, int depth, int *moved,
                     unsigned long *serial) {
  int dup_fd = dup(dfd);
  if (dup_fd < 0)
    return -1;
  DIR *dir = fdopendir(dup_fd);
  if (dir == NULL) {
    close(dup_fd);
    return -1;
  }
  rewinddir(dir); /* the dup shares dfd's offset, at the end after a pass */
  int rc = 0;
  struct dirent *ent;
  errno = 0;
  while ((ent = readdir(dir)) != NULL) {
    const char *name = ent->d_name;
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
      continue;
    if (unlinkat(dfd, name, 0) == 0)
      continue;
    if (errno != EISDIR && errno != EPERM) {
      rc = -1;
      continue;
    }
    if (depth >= MAX_DEPTH) {
      char fresh[64];
      snprintf(fresh, sizeof(fresh), ".rm-%lu", ++*serial);
      if (renameat(dfd, name, top, fresh) == 0)
        *moved = 1;
      else
        rc = -1;
      continue;
    }
    int sub = open_dir_at(dfd, name);
    if (sub < 0) {
      rc = -1;
      continue;
    }
    if (empty_dir(top, sub, depth + 1, moved, serial) != 0)
      rc = -1;
    close(sub);
    if (unlinkat(dfd, name, AT_REMOVEDIR) != 0)
      rc = -1;
  }
  closedir(dir);
  return rc;
}

int rlm_workdir_remove(const char *dir) {
  int top = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (top < 0)
    return errno == ENOENT ? 0 : -1;
  unsigned long serial = 0;
  int moved, passes = 0;
  do {
    moved = 0;
    (void)empty_dir(top, top, 0, &moved, &serial);
  } while (moved && ++passes < 1000000);
  close(top);
  /* Whatever failed on the way shows here: the directory is not empty. */
  return rmdir(dir);
}
