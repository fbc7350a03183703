/* uid.c: see uid.h. */
#define _GNU_SOURCE
#include "uid.h"

#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A directory of root's that nobody else may write to (a local user who
 * could plant lock files there could hold every uid, or share one). */
static int root_dir(const char *path, char *err, size_t errlen) {
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "mkdir %s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (lstat(path, &st) != 0) {
    snprintf(err, errlen, "lstat %s: %s", path, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022) != 0) {
    snprintf(err, errlen, "%s is not a directory of root's closed to others",
             path);
    return -1;
  }
  return 0;
}

/* Opens path and takes its lock without waiting. Returns the descriptor,
 * -2 when another process holds it, or -1 with a message. A release
 * unlinks the file while it holds the lock (rlm_uid_release), so a lock
 * taken on a file that is no longer the one at path (or no longer at all)
 * guards nothing: then again, on the file there now. */
static int lock_path(const char *path, char *err, size_t errlen) {
  for (int tries = 0; tries < 64; tries++) {
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      snprintf(err, errlen, "open %s: %s", path, strerror(errno));
      return -1;
    }
    int rc;
    while ((rc = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR)
      ;
    if (rc != 0) {
      int saved = errno;
      close(fd);
      if (saved == EWOULDBLOCK)
        return -2;
      snprintf(err, errlen, "flock %s: %s", path, strerror(saved));
      return -1;
    }
    struct stat held, now;
    if (fstat(fd, &held) != 0) {
      int saved = errno;
      snprintf(err, errlen, "fstat %s: %s", path, strerror(saved));
      close(fd);
      return -1;
    }
    int gone = lstat(path, &now) != 0 ? errno : 0;
    if (gone == 0 && now.st_dev == held.st_dev && now.st_ino == held.st_ino)
      return fd;
    close(fd);
    if (gone != 0 && gone != ENOENT) {
      snprintf(err, errlen, "lstat %s: %s", path, strerror(gone));
      return -1;
    }
  }
  snprintf(err, errlen, "%s: removed each time it was locked", path);
  return -1;
}

int rlm_uid_claim(uint32_t first, uint32_t count, uint32_t *uid, char *err,
                  size_t errlen) {
  /* A uid map takes uids below 2^31 (the kernel's EINVAL above). */
  if (first == 0 || count == 0 || (uint64_t)first + count > RLM_UID_LIMIT) {
    snprintf(err, errlen, "bad sandbox uid range %u + %u", first, count);
    return -1;
  }
  if (root_dir(RLM_RUN_DIR, err, errlen) != 0 ||
      root_dir(RLM_STAGE_DIR, err, errlen) != 0)
    return -1;
  /* Start anywhere, so that concurrent hosts rarely try the same uids. */
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  uint32_t start =
      (uint32_t)((uint64_t)now.tv_nsec ^ ((uint64_t)getpid() << 12)) % count;
  for (uint32_t k = 0; k < count; k++) {
    uint32_t n = first + (start + k) % count;
    char path[64];
    snprintf(path, sizeof(path), RLM_RUN_DIR "/uid-%u", n);
    int fd = lock_path(path, err, errlen);
    if (fd == -1)
      return -1;
    if (fd >= 0) {
      *uid = n;
      return fd;
    }
  }
  snprintf(err, errlen, "every sandbox uid from %u to %u is in use", first,
           first + count - 1);
  return -1;
}

void rlm_uid_release(int fd, uint32_t uid) {
  char path[64];
  snprintf(path, sizeof(path), RLM_RUN_DIR "/uid-%u", uid);
  struct stat held, now;
  /* Only the file this lock is on: a claim that opened it meanwhile finds
   * it unlinked once it has the lock, and opens the path anew. */
  if (fstat(fd, &held) == 0 && lstat(path, &now) == 0 &&
      now.st_dev == held.st_dev && now.st_ino == held.st_ino)
    (void)unlink(path);
  close(fd);
}
