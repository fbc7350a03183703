/* inspect.c: the sandbox's processes as the host reads them from /proc:
 * its tree (the launcher first), its interpreter, and the descriptors they
 * hold that are not the session's. Part of the driver (driver_impl.h): it
 * reads the driver's pid and pipes, and changes nothing. */
#include "driver_impl.h"
#include "smallfile.h"

size_t rlm_driver_tree(const rlm_driver *d, int *pids, size_t max) {
  if (!d->spawned || d->exited)
    return 0;
  pid_t buf[256];
  size_t n = rlm_tree_pids(d->pid, buf, max < 256 ? max : 256);
  for (size_t i = 0; i < n; i++)
    pids[i] = buf[i];
  return n;
}

#ifdef __linux__
/* Whether /proc/<pid>/comm names bubblewrap (the launcher and the pid
 * namespace's init are bubblewrap; the first process that is not is the
 * driver's interpreter). */
static int is_bwrap(int pid) {
  char path[64], comm[32];
  snprintf(path, sizeof(path), "/proc/%d/comm", pid);
  if (rlm_read_small(path, comm, sizeof(comm)) <= 0)
    return -1;
  return strcmp(comm, "bwrap\n") == 0;
}
#endif

int rlm_driver_interpreter_pid(const rlm_driver *d) {
  int pids[8];
  size_t n = rlm_driver_tree(d, pids, 8);
#ifdef __linux__
  for (size_t i = 0; i < n; i++) {
    int b = is_bwrap(pids[i]);
    if (b < 0)
      return 0;
    if (b == 0)
      return pids[i];
  }
  return 0;
#else
  return n > 0 ? pids[0] : 0; /* sandbox-exec runs the interpreter itself */
#endif
}

/* Whether a descriptor's /proc link names something the sandbox may hold:
 * one of the session's pipes, or a kernel object bubblewrap made for itself
 * (signalfd, eventfd). */
static int fd_is_ours(const rlm_driver *d, const char *target) {
  unsigned long ino;
  if (strncmp(target, "anon_inode:", 11) == 0)
    return 1;
  if (sscanf(target, "pipe:[%lu]", &ino) == 1)
    for (int i = 0; i < 3; i++)
      if (ino == d->pipe_ino[i])
        return 1;
  return 0;
}

/* The foreign descriptors of one process; how many. */
static int pid_foreign_fds(const rlm_driver *d, int pid, rlm_fd_visitor visit,
                           void *ud) {
  char dir[64];
  snprintf(dir, sizeof(dir), "/proc/%d/fd", pid);
  DIR *fds = opendir(dir);
  if (fds == NULL)
    return 0; /* it exited meanwhile */
  int found = 0;
  struct dirent *ent;
  while ((ent = readdir(fds)) != NULL) {
    if (ent->d_name[0] < '0' || ent->d_name[0] > '9')
      continue;
    char link[352], target[256];
    snprintf(link, sizeof(link), "%s/%s", dir, ent->d_name);
    ssize_t len = readlink(link, target, sizeof(target) - 1);
    if (len < 0)
      continue; /* the opendir's own descriptor, closed by now */
    target[len] = '\0';
    if (!fd_is_ours(d, target)) {
      found++;
      visit(ud, pid, atoi(ent->d_name), target);
    }
  }
  closedir(fds);
  return found;
}

int rlm_driver_foreign_fds(const rlm_driver *d, rlm_fd_visitor visit,
                           void *ud) {
  int pids[256];
  size_t n = rlm_driver_tree(d, pids, 256);
  int found = 0;
  for (size_t i = 0; i < n; i++)
    found += pid_foreign_fds(d, pids[i], visit, ud);
  return found;
}

int rlm_driver_foreign_fds_of(const rlm_driver *d, int pid,
                              rlm_fd_visitor visit, void *ud) {
  if (!d->spawned || d->exited || pid <= 0)
    return 0;
  return pid_foreign_fds(d, pid, visit, ud);
}
