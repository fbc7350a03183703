/* inspect.c: the sandbox's processes as the host reads them from /proc:
 * its tree (the launcher first), its interpreter, and the descriptors they
 * hold that are not the session's. Part of the driver (driver_impl.h): it
 * reads the driver's pid and pipes, and changes nothing. */
#include "driver_impl.h"
#include "smallfile.h"

#ifdef __linux__
#include <linux/magic.h>
#include <sys/vfs.h>
#endif

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

/* Whether a descriptor of a bubblewrap process is its own hold on procfs:
 * /proc (what it opens first, to close the rest through) or its own
 * /proc/<pid>/fd (its walk over them), a directory on a procfs. */
static int bwrap_proc_dir(int pid, const char *link, const char *target) {
#ifdef __linux__
  char own[32];
  snprintf(own, sizeof(own), "/proc/%d/fd", pid);
  struct statfs fs;
  return (strcmp(target, "/proc") == 0 || strcmp(target, own) == 0) &&
         statfs(link, &fs) == 0 && fs.f_type == PROC_SUPER_MAGIC;
#else
  (void)pid, (void)link, (void)target;
  return 0;
#endif
}

/* Whether a descriptor's /proc link names something the sandbox may hold:
 * one of the session's pipes, or a kernel object bubblewrap made for itself
 * (signalfd, eventfd); in bubblewrap's own processes also a file the spawn
 * handed to it (link: its /proc path), the same file and no other: its
 * launcher lets the sandbox's setup go on before it closes them, and its
 * init forks the interpreter before it does, so either may hold them still
 * when the interpreter's first line comes (1 start in about 1,600 here). */
static int fd_is_ours(const rlm_driver *d, int pid, const char *link,
                      const char *target, int in_bwrap) {
  unsigned long ino;
  if (strncmp(target, "anon_inode:", 11) == 0)
    return 1;
  if (sscanf(target, "pipe:[%lu]", &ino) == 1)
    for (int i = 0; i < 3; i++)
      if (ino == d->pipe_ino[i])
        return 1;
  struct stat st;
  if (!in_bwrap || stat(link, &st) != 0)
    return 0;
  for (int i = 0; i < d->n_handed; i++)
    if (st.st_dev == d->handed_dev[i] && st.st_ino == d->handed_ino[i])
      return 1;
  return bwrap_proc_dir(pid, link, target);
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
#ifdef __linux__
  int in_bwrap = is_bwrap(pid) == 1;
#else
  int in_bwrap = 0;
#endif
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
    if (!fd_is_ours(d, pid, link, target, in_bwrap)) {
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
