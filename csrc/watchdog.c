/* watchdog.c: the memory the sandbox holds. The launcher (bubblewrap) is a
 * few MB; the interpreter sits two levels below it, and anything it forks
 * below that, so the whole tree is summed. */
#define _GNU_SOURCE
#include "watchdog.h"

#include "smallfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PIDS 1024

static uint64_t status_kb(const char *status, const char *key) {
  const char *p = strstr(status, key);
  return p ? strtoull(p + strlen(key), NULL, 10) : 0;
}

/* What the watchdog counts of one process (its resident anonymous and
 * shared-memory bytes), and its number of threads (0: not read). */
static uint64_t process_rss(pid_t pid, long *threads) {
  char path[64], buf[4096];
  *threads = 0;
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  if (rlm_read_small(path, buf, sizeof(buf)) <= 0)
    return 0;
  *threads = (long)status_kb(buf, "\nThreads:");
  return (status_kb(buf, "\nRssAnon:") + status_kb(buf, "\nRssShmem:")) * 1024;
}

/* Appends the children of pid's thread tid to pids. */
static void add_thread_children(pid_t pid, const char *tid, pid_t *pids,
                                size_t *n, size_t max) {
  char path[320], buf[8192];
  snprintf(path, sizeof(path), "/proc/%d/task/%s/children", (int)pid, tid);
  if (rlm_read_small(path, buf, sizeof(buf)) <= 0)
    return;
  for (char *p = buf, *end; *n < max; p = end) {
    long child = strtol(p, &end, 10);
    if (end == p)
      break;
    pids[(*n)++] = (pid_t)child;
  }
}

/* Appends the children of every thread of pid to pids: of its one thread
 * when threads is 1 (its id is pid's: no listing of /proc/pid/task, which
 * costs a poll five system calls more), else of each thread listed there. */
static void add_children(pid_t pid, long threads, pid_t *pids, size_t *n,
                         size_t max) {
  char path[64];
  if (threads == 1) {
    snprintf(path, sizeof(path), "%d", (int)pid);
    add_thread_children(pid, path, pids, n, max);
    return;
  }
  snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  DIR *tasks = opendir(path);
  if (tasks == NULL)
    return;
  struct dirent *ent;
  while ((ent = readdir(tasks)) != NULL && *n < max)
    if (ent->d_name[0] >= '0' && ent->d_name[0] <= '9')
      add_thread_children(pid, ent->d_name, pids, n, max);
  closedir(tasks);
}

size_t rlm_tree_pids(pid_t root, pid_t *pids, size_t max) {
  size_t n = 0;
  if (max == 0)
    return 0;
  pids[n++] = root;
  for (size_t i = 0; i < n; i++)
    add_children(pids[i], 0, pids, &n, max);
  return n;
}

/* The nanoseconds the one thread behind fd (its /proc/PID/schedstat) has
 * run on a CPU, or UINT64_MAX. */
static uint64_t ran_ns(int fd) {
  char buf[128];
  ssize_t n;
  do
    n = pread(fd, buf, sizeof(buf) - 1, 0);
  while (n < 0 && errno == EINTR);
  if (n <= 0)
    return UINT64_MAX; /* ESRCH: that process is gone */
  buf[n] = '\0';
  char *end;
  unsigned long long ns = strtoull(buf, &end, 10);
  return end == buf ? UINT64_MAX : (uint64_t)ns;
}

static int open_schedstat(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/schedstat", (int)pid);
  return open(path, O_RDONLY | O_CLOEXEC);
}

void rlm_tree_still_clear(rlm_tree_still *still) {
  for (size_t i = 0; i < still->n; i++)
    close(still->fds[i]);
  still->n = 0;
}

/* The tree walked as rlm_tree_pids does, each process's status read once
 * for its memory and its threads, and its run time read before it. */
uint64_t rlm_tree_rss(pid_t root, rlm_tree_still *still) {
  pid_t pids[MAX_PIDS];
  size_t n = 1, kept = 0;
  uint64_t total = 0;
  int comparable = still != NULL;
  if (still != NULL)
    rlm_tree_still_clear(still);
  pids[0] = root;
  for (size_t i = 0; i < n; i++) {
    int fd =
        comparable && i < RLM_TREE_STILL_MAX ? open_schedstat(pids[i]) : -1;
    uint64_t ran = fd >= 0 ? ran_ns(fd) : UINT64_MAX;
    long threads;
    total += process_rss(pids[i], &threads);
    /* threads 0 (status unread): its tasks listed, as rlm_tree_pids does */
    add_children(pids[i], threads, pids, &n, MAX_PIDS);
    if (fd >= 0 && comparable && threads == 1 && ran != UINT64_MAX) {
      still->fds[kept] = fd;
      still->ran_ns[kept++] = ran;
    } else {
      if (fd >= 0)
        close(fd);
      comparable = 0;
    }
  }
  if (still != NULL) {
    still->n = kept;
    if (!comparable)
      rlm_tree_still_clear(still);
  }
  return total;
}

int rlm_tree_ran(const rlm_tree_still *still) {
  if (still->n == 0)
    return 1;
  for (size_t i = 0; i < still->n; i++)
    if (ran_ns(still->fds[i]) != still->ran_ns[i])
      return 1;
  return 0;
}
