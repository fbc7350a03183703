/* cgroup.c: see cgroup.h. Every failure to set the cgroup up leaves
 * version 0: the RSS poll then enforces the limit alone, as it does where
 * no cgroup can be made. */
#define _GNU_SOURCE
#include "cgroup.h"

#include "smallfile.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int write_file(const char *dir, const char *file, const char *value) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof(path), "%s/%s", dir, file);
  return rlm_write_small(path, value);
}

static int read_file(const char *dir, const char *file, char *buf, size_t len) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof(path), "%s/%s", dir, file);
  return rlm_read_small(path, buf, len) < 0 ? -1 : 0;
}

/* The host's own cgroup for a v1 controller ("memory") or v2 (""), from
 * /proc/self/cgroup, as a path below /sys/fs/cgroup. */
static int own_cgroup(const char *controller, char *out, size_t outlen) {
  char buf[4096];
  if (read_file("/proc/self", "cgroup", buf, sizeof(buf)) != 0)
    return -1;
  for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
    char *names = strchr(line, ':');
    char *path = names ? strchr(names + 1, ':') : NULL;
    if (path == NULL)
      continue;
    *path++ = '\0';
    names++;
    int match;
    if (controller[0] == '\0')
      match = strcmp(line, "0") == 0 && names[0] == '\0';
    else
      match = strcmp(names, controller) == 0;
    if (!match)
      continue;
    int w = controller[0]
                ? snprintf(out, outlen, "/sys/fs/cgroup/%s%s", controller, path)
                : snprintf(out, outlen, "/sys/fs/cgroup%s", path);
    return w > 0 && (size_t)w < outlen ? 0 : -1;
  }
  return -1;
}

/* Removes what dead hosts left in parent: cgroups named rlm-<host pid>-<n>
 * whose host is gone. A cgroup still holding a process does not go (rmdir
 * says EBUSY); --die-with-parent has killed those by then anyway. */
static void sweep(const char *parent) {
  DIR *dir = opendir(parent);
  if (dir == NULL)
    return;
  struct dirent *ent;
  while ((ent = readdir(dir)) != NULL) {
    int host, n, end = 0;
    if (sscanf(ent->d_name, "rlm-%d-%d%n", &host, &n, &end) != 2 ||
        ent->d_name[end] != '\0' || host <= 0 ||
        (kill(host, 0) == 0 || errno != ESRCH))
      continue;
    char path[PATH_MAX + 256];
    snprintf(path, sizeof(path), "%s/%s", parent, ent->d_name);
    (void)rmdir(path);
  }
  closedir(dir);
}

static int make_child(char *dir, size_t len, const char *parent,
                      const char *name) {
  sweep(parent);
  int w = snprintf(dir, len, "%s/%s", parent, name);
  if (w < 0 || (size_t)w >= len || mkdir(dir, 0700) != 0) {
    dir[0] = '\0';
    return -1;
  }
  return 0;
}

static int setup_v2(rlm_cgroup *cg, const char *name, const char *limit,
                    const char *pids_max) {
  char parent[PATH_MAX], controllers[256];
  if (own_cgroup("", parent, sizeof(parent)) != 0 ||
      read_file(parent, "cgroup.subtree_control", controllers,
                sizeof(controllers)) != 0 ||
      strstr(controllers, "memory") == NULL)
    return -1; /* not delegated to us */
  if (make_child(cg->mem, sizeof(cg->mem), parent, name) != 0)
    return -1;
  cg->version = 2;
  if (write_file(cg->mem, "memory.max", limit) != 0 ||
      (write_file(cg->mem, "memory.swap.max", "0") != 0 && errno != ENOENT))
    return -1;
  if (strstr(controllers, "pids") != NULL)
    (void)write_file(cg->mem, "pids.max", pids_max);
  return 0;
}

static int setup_v1(rlm_cgroup *cg, const char *name, const char *limit,
                    const char *pids_max) {
  char parent[PATH_MAX];
  if (own_cgroup("memory", parent, sizeof(parent)) != 0 ||
      make_child(cg->mem, sizeof(cg->mem), parent, name) != 0)
    return -1;
  cg->version = 1;
  if (write_file(cg->mem, "memory.limit_in_bytes", limit) != 0)
    return -1;
  /* No swap: memsw is the limit on memory plus swap, where swap accounting
   * is on. */
  if (write_file(cg->mem, "memory.memsw.limit_in_bytes", limit) != 0 &&
      errno != ENOENT)
    return -1;
  (void)write_file(cg->mem, "memory.swappiness", "0");
  (void)write_file(cg->mem, "memory.move_charge_at_immigrate", "3");
  if (own_cgroup("pids", parent, sizeof(parent)) == 0 &&
      make_child(cg->pids, sizeof(cg->pids), parent, name) == 0 &&
      write_file(cg->pids, "pids.max", pids_max) != 0) {
    rmdir(cg->pids);
    cg->pids[0] = '\0';
  }
  return 0;
}

void rlm_cgroup_create(rlm_cgroup *cg, const char *name, uint64_t limit,
                       int pids_max) {
  memset(cg, 0, sizeof(*cg));
  char lim[32], pids[16];
  snprintf(lim, sizeof(lim), "%llu", (unsigned long long)limit);
  snprintf(pids, sizeof(pids), "%d", pids_max);
  if (setup_v2(cg, name, lim, pids) == 0)
    return;
  rlm_cgroup_remove(cg); /* what v2 made of it, if anything */
  if (setup_v1(cg, name, lim, pids) == 0)
    return;
  rlm_cgroup_remove(cg);
}

int rlm_cgroup_add(const rlm_cgroup *cg, pid_t pid) {
  char value[24];
  if (cg->version == 0)
    return -1;
  snprintf(value, sizeof(value), "%d", (int)pid);
  if (write_file(cg->mem, "cgroup.procs", value) != 0)
    return -1;
  if (cg->pids[0] != '\0')
    (void)write_file(cg->pids, "cgroup.procs", value);
  return 0;
}

int rlm_cgroup_holds(const rlm_cgroup *cg, pid_t pid) {
  char dir[64], buf[4096], mine[PATH_MAX];
  if (cg->version == 0)
    return 0;
  snprintf(dir, sizeof(dir), "/proc/%d", (int)pid);
  if (read_file(dir, "cgroup", buf, sizeof(buf)) != 0)
    return 0;
  /* The cgroup's path as /proc shows it: below the mount point. */
  const char *rel = cg->mem + strlen("/sys/fs/cgroup");
  if (cg->version == 1)
    rel = strchr(rel + 1, '/');
  snprintf(mine, sizeof(mine), ":%s\n", rel ? rel : "");
  return strstr(buf, mine) != NULL;
}

static uint64_t read_number(const char *dir, const char *file,
                            const char *key) {
  char buf[4096];
  if (dir[0] == '\0' || read_file(dir, file, buf, sizeof(buf)) != 0)
    return 0;
  const char *p = buf;
  if (key != NULL) {
    p = strstr(buf, key);
    if (p == NULL)
      return 0;
    p += strlen(key);
  }
  return strtoull(p, NULL, 10);
}

uint64_t rlm_cgroup_peak(const rlm_cgroup *cg) {
  if (cg->version == 1)
    return read_number(cg->mem, "memory.max_usage_in_bytes", NULL);
  if (cg->version == 2)
    return read_number(cg->mem, "memory.peak", NULL);
  return 0;
}

uint64_t rlm_cgroup_oom_kills(const rlm_cgroup *cg) {
  if (cg->version == 1)
    return read_number(cg->mem, "memory.oom_control", "oom_kill ");
  if (cg->version == 2)
    return read_number(cg->mem, "memory.events", "oom_kill ");
  return 0;
}

static void remove_dir(char *dir) {
  if (dir[0] == '\0')
    return;
  /* Processes just killed may take a moment to leave it. */
  for (int i = 0; i < 200 && rmdir(dir) != 0 && errno == EBUSY; i++) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  dir[0] = '\0';
}

void rlm_cgroup_remove(rlm_cgroup *cg) {
  if (cg->version == 2)
    (void)write_file(cg->mem, "cgroup.kill", "1");
  remove_dir(cg->mem);
  remove_dir(cg->pids);
  cg->version = 0;
}
