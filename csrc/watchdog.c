/* watchdog.c: the memory the sandbox holds. The launcher (bubblewrap) is a
 * few MB; the interpreter sits two levels below it, and anything it forks
 * below that, so the whole tree is summed. */
#define _GNU_SOURCE
#include "watchdog.h"

#include "smallfile.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PIDS 1024

static uint64_t status_kb(const char *status, const char *key) {
  const char *p = strstr(status, key);
  return p ? strtoull(p + strlen(key), NULL, 10) : 0;
}

static uint64_t process_rss(pid_t pid) {
  char path[64], buf[4096];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  if (rlm_read_small(path, buf, sizeof(buf)) <= 0)
    return 0;
  return (status_kb(buf, "\nRssAnon:") + status_kb(buf, "\nRssShmem:")) * 1024;
}

/* Appends the children of every thread of pid to pids. */
static void add_children(pid_t pid, pid_t *pids, size_t *n, size_t max) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  DIR *tasks = opendir(path);
  if (tasks == NULL)
    return;
  struct dirent *ent;
  while ((ent = readdir(tasks)) != NULL && *n < max) {
    if (ent->d_name[0] < '0' || ent->d_name[0] > '9')
      continue;
    char cpath[320], buf[8192];
    snprintf(cpath, sizeof(cpath), "/proc/%d/task/%s/children", (int)pid,
             ent->d_name);
    if (rlm_read_small(cpath, buf, sizeof(buf)) <= 0)
      continue;
    for (char *p = buf, *end; *n < max; p = end) {
      long child = strtol(p, &end, 10);
      if (end == p)
        break;
      pids[(*n)++] = (pid_t)child;
    }
  }
  closedir(tasks);
}

size_t rlm_tree_pids(pid_t root, pid_t *pids, size_t max) {
  size_t n = 0;
  if (max == 0)
    return 0;
  pids[n++] = root;
  for (size_t i = 0; i < n; i++)
    add_children(pids[i], pids, &n, max);
  return n;
}

uint64_t rlm_tree_rss(pid_t root) {
  pid_t pids[MAX_PIDS];
  size_t n = rlm_tree_pids(root, pids, MAX_PIDS);
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++)
    total += process_rss(pids[i]);
  return total;
}
