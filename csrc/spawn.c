/* spawn.c: the sandbox's process, started from the keeper thread: the
 * child of a fork (or posix_spawn) that stages what its uid cannot reach,
 * drops to the sandbox's uid, sets its descriptors and execs bubblewrap. */
#define _GNU_SOURCE
#include "driver_impl.h"
#include "seccomp.h"

#include <linux/capability.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>

/* A pipe whose two ends are close-on-exec and numbered FD_BASE or more. */
static int make_pipe(int fds[2]) {
  int raw[2];
  if (pipe2(raw, O_CLOEXEC) != 0)
    return -1;
  for (int i = 0; i < 2; i++) {
    fds[i] = fcntl(raw[i], F_DUPFD_CLOEXEC, FD_BASE);
    close(raw[i]);
  }
  if (fds[0] < 0 || fds[1] < 0) {
    int saved = errno;
    if (fds[0] >= 0)
      close(fds[0]);
    if (fds[1] >= 0)
      close(fds[1]);
    errno = saved;
    return -1;
  }
  return 0;
}

static void close_pair(int fds[2]) {
  for (int i = 0; i < 2; i++)
    if (fds[i] >= 0) {
      close(fds[i]);
      fds[i] = -1;
    }
}

/* What the child of a fork does, in order, with only system calls: mount
 * what its uid could not reach (see sandbox.h), drop to the uid, reset its
 * signals, leave the host's process group, set its descriptors, exec. A failure
 * writes errno to `report` (close-on-exec: EOF means the exec happened).
 * A seccomp-only child (driver.h) confines itself on the way. */
typedef struct child_plan {
  const rlm_driver *o;
  int fds[3 + MAX_INHERIT]; /* the child's 0, 1, 2, 3... from these */
  int nfds, report;
  char (*stage_dst)[64];
  unsigned char *stage_dir;        /* whether each staged path is a directory */
  const struct sock_fprog *filter; /* seccomp_only's */
  pid_t parent;                    /* seccomp_only: who it dies with */
} child_plan;

/* The child runs on a stack of its own in the host's memory: AddressSanitizer
 * (make check) cannot follow it there, and must not instrument it. */
#define CHILD_CODE __attribute__((no_sanitize_address))

CHILD_CODE __attribute__((noreturn)) static void
child_fail(const child_plan *p) {
  int e = errno;
  while (write(p->report, &e, sizeof(e)) < 0 && errno == EINTR)
    ;
  _exit(127);
}

CHILD_CODE __attribute__((noreturn)) static void
child_run(const child_plan *p) {
  const rlm_driver *o = p->o;
  if (o->n_stage > 0) {
    /* A mount namespace of this child's alone, where none of this
     * propagates back to the host's. */
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0 ||
        mount("rlm-stage", RLM_STAGE_DIR, "tmpfs", MS_NOSUID | MS_NODEV,
              "mode=0755,size=64k") != 0)
      child_fail(p);
    for (size_t i = 0; i < o->n_stage; i++) {
      if (p->stage_dir[i]) {
        if (mkdir(p->stage_dst[i], 0755) != 0)
          child_fail(p);
      } else {
        int fd = open(p->stage_dst[i], O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
          child_fail(p);
        close(fd);
      }
      if (mount(o->stage[i], p->stage_dst[i], NULL, MS_BIND | MS_REC, NULL) !=
          0)
        child_fail(p);
    }
  }
  if (o->seccomp_only) {
    /* No capability can come back, whatever it execs (no_new_privs, at the
     * end, keeps setuid files from giving any): the bounding set goes while
     * this child still may drop it. Its directory becomes the uid's. */
    for (int cap = 0; cap <= CAP_LAST_CAP; cap++)
      if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0)
        child_fail(p);
    if (chown(o->workdir, o->run_as, o->run_as) != 0 ||
        chmod(o->workdir, 0700) != 0)
      child_fail(p);
  }
  /* The raw system calls: libc's wrappers would set the ids of every
   * thread of the host, whose memory this child shares. */
  if (o->run_as != 0 &&
      (syscall(SYS_setgroups, 0, NULL) != 0 ||
       syscall(SYS_setresgid, o->run_as, o->run_as, o->run_as) != 0 ||
       syscall(SYS_setresuid, o->run_as, o->run_as, o->run_as) != 0))
    child_fail(p);
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; sig++)
    if (sig != SIGKILL && sig != SIGSTOP)
      (void)sigaction(sig, &dfl, NULL); /* fails only for libc's own */
  sigset_t none;
  sigemptyset(&none);
  /* A process group of its own (as in posix_spawn_child, below); without
   * bubblewrap, the session of its own that its --new-session gives (no
   * controlling terminal), and its --die-with-parent: the parent-death
   * signal, set after the uid's change (which clears it), and the parent
   * checked after it (one that died before it was set did not send it). */
  if (sigprocmask(SIG_SETMASK, &none, NULL) != 0)
    child_fail(p);
  if (o->seccomp_only
          ? setsid() < 0 || prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 ||
                getppid() != p->parent || chdir(o->workdir) != 0
          : setpgid(0, 0) != 0)
    child_fail(p);
  for (int i = 0; i < p->nfds; i++)
    if (dup2(p->fds[i], i) < 0)
      child_fail(p);
  /* Everything else goes, leaked host descriptors included; the report
   * pipe closes at the exec. */
  if (syscall(SYS_close_range, (unsigned)p->nfds, (unsigned)p->report - 1, 0) !=
          0 ||
      syscall(SYS_close_range, (unsigned)p->report + 1, ~0u, 0) != 0)
    child_fail(p);
  /* Last, the filter: from here on only what it allows (execve is). */
  if (o->seccomp_only &&
      (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
       syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, p->filter) != 0))
    child_fail(p);
  execve(o->argv[0], o->argv, o->env ? o->env : environ);
  child_fail(p);
}

CHILD_CODE static int child_entry(void *arg) { child_run(arg); }

/* child_run in a child that shares the host's memory until its exec (as
 * posix_spawn does): a fork would make every page of the host's
 * copy-on-write, and the host's thread would pay for it in page faults
 * while the sandboxes start. Returns 0, or an errno value. */
static int fork_child(rlm_driver *d, const rlm_driver *o, const int *fds,
                      int nfds) {
  child_plan p;
  memset(&p, 0, sizeof(p));
  p.o = o;
  p.nfds = nfds;
  p.filter = rlm_seccomp_program();
  p.parent = getpid();
  memcpy(p.fds, fds, (size_t)nfds * sizeof(int));
  int report[2] = {-1, -1}, rc = 0;
  if (o->n_stage > 0) {
    p.stage_dst = calloc(o->n_stage, sizeof(*p.stage_dst));
    p.stage_dir = calloc(o->n_stage, 1);
    if (p.stage_dst == NULL || p.stage_dir == NULL) {
      rc = ENOMEM;
      goto out;
    }
    for (size_t i = 0; i < o->n_stage; i++) {
      struct stat st;
      if (stat(o->stage[i], &st) != 0) {
        rc = errno;
        goto out;
      }
      p.stage_dir[i] = S_ISDIR(st.st_mode);
      snprintf(p.stage_dst[i], sizeof(p.stage_dst[i]), RLM_STAGE_DIR "/%zu", i);
    }
  }
  if (make_pipe(report) != 0) {
    rc = errno;
    goto out;
  }
  p.report = report[1];
  /* No handler of the host's may run in the child before it resets them. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  d->stamps[3] = uv_hrtime();
  char *stack = malloc(CHILD_STACK);
  pid_t pid = stack == NULL ? -1
                            : clone(child_entry, stack + CHILD_STACK,
                                    CLONE_VM | CLONE_VFORK | SIGCHLD, &p);
  int fork_errno = stack == NULL ? ENOMEM : errno;
  free(stack); /* the child has exec'd or exited */
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) {
    rc = fork_errno;
    goto out;
  }
  close(report[1]);
  report[1] = -1;
  int child_errno = 0;
  ssize_t n;
  while ((n = read(report[0], &child_errno, sizeof(child_errno))) < 0 &&
         errno == EINTR)
    ;
  if (n > 0) {
    rc = child_errno ? child_errno : EIO;
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
    goto out;
  }
  d->pid = pid;
out:
  close_pair(report);
  free(p.stage_dst);
  free(p.stage_dir);
  return rc;
}

/* posix_spawn with the same descriptors, signals and session. Returns 0, or
 * an errno value. */
static int posix_spawn_child(rlm_driver *d, const rlm_driver *o, const int *fds,
                             int nfds) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  int e = posix_spawn_file_actions_init(&fa);
  if (e != 0)
    return e;
  for (int i = 0; i < nfds && e == 0; i++)
    e = posix_spawn_file_actions_adddup2(&fa, fds[i], i);
  /* Everything else goes, leaked host descriptors included. */
  if (e == 0)
    e = posix_spawn_file_actions_addclosefrom_np(&fa, nfds);
  int attr_ok = 0;
  if (e == 0)
    attr_ok = (e = posix_spawnattr_init(&attr)) == 0;
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  if (e == 0)
    e = posix_spawnattr_setsigmask(&attr, &none);
  if (e == 0)
    e = posix_spawnattr_setsigdefault(&attr, &all);
  /* A process group of its own: a ^C in the user's terminal reaches the
   * host's group alone, and the host decides. Not a session: setsid()
   * costs a scheduler autogroup (most of a millisecond a spawn where they
   * are on), and what runs inside gets a session of its own, with no
   * controlling terminal, from bubblewrap's --new-session. */
  if (e == 0)
    e = posix_spawnattr_setpgroup(&attr, 0);
  if (e == 0)
    e = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK |
                                            POSIX_SPAWN_SETSIGDEF |
                                            POSIX_SPAWN_SETPGROUP);
  if (e == 0)
    e = posix_spawn(&d->pid, o->argv[0], &fa, &attr, (char *const *)o->argv,
                    o->env ? (char *const *)o->env : environ);
  posix_spawn_file_actions_destroy(&fa);
  if (attr_ok)
    posix_spawnattr_destroy(&attr);
  return e;
}

/* Notes the files handed over at 3... (rlm_driver_foreign_fds reads them
 * back in bubblewrap's processes). */
static void note_handed(rlm_driver *d) {
  d->n_handed = 0;
  for (int i = 3; i < d->nfds; i++) {
    struct stat st;
    if (d->child_fds[i] >= 0 && fstat(d->child_fds[i], &st) == 0) {
      d->handed_dev[d->n_handed] = st.st_dev;
      d->handed_ino[d->n_handed] = st.st_ino;
      d->n_handed++;
    }
  }
}

static int spawn_process(rlm_driver *d, char *err, size_t errlen) {
  note_handed(d);
  int e = d->run_as != 0 || d->n_stage > 0 || d->seccomp_only
              ? fork_child(d, d, d->child_fds, d->nfds)
              : posix_spawn_child(d, d, d->child_fds, d->nfds);
  if (e != 0) {
    snprintf(err, errlen, "spawning %s%s: %s", d->argv[0],
             d->run_as ? " as the sandbox's uid" : "", strerror(e));
    return -1;
  }
  d->pidfd = (int)syscall(SYS_pidfd_open, d->pid, 0);
  if (d->pidfd < 0) {
    /* Kernels before 5.3: the process cannot be watched safely. */
    snprintf(err, errlen, "pidfd_open: %s", strerror(errno));
    (void)kill(d->pid, SIGKILL);
    while (waitpid(d->pid, NULL, 0) < 0 && errno == EINTR)
      ;
    return -1;
  }
  (void)fcntl(d->pidfd, F_SETFD, FD_CLOEXEC); /* pidfds are, but be sure */
  return 0;
}

long rlm_fd_free(long *limit, char *err, size_t errlen) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    int e = errno;
    snprintf(err, errlen, "getrlimit(RLIMIT_NOFILE): %s", strerror(e));
    errno = e;
    return -1;
  }
  long soft = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (rlim_t)LONG_MAX
                  ? LONG_MAX
                  : (long)rl.rlim_cur;
  *limit = soft;
  long open = 0;
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL) {
    int e = errno;
    if (e == EMFILE || e == ENFILE)
      return 0; /* none left for the count itself */
    if (e != ENOENT) {
      snprintf(err, errlen, "opendir /proc/self/fd: %s", strerror(e));
      errno = e;
      return -1;
    }
    /* No /proc: each descriptor below the limit (up to 65536) asked. */
    long top = soft < 65536 ? soft : 65536;
    for (long fd = 0; fd < top; fd++)
      if (fcntl((int)fd, F_GETFD) >= 0)
        open++;
  } else {
    struct dirent *ent;
    errno = 0;
    while ((ent = readdir(d)) != NULL)
      if (ent->d_name[0] != '.')
        open++;
    int e = errno;
    (void)closedir(d);
    if (e != 0) {
      snprintf(err, errlen, "readdir /proc/self/fd: %s", strerror(e));
      errno = e;
      return -1;
    }
    open--; /* the directory's own */
  }
  return soft > open ? soft - open : 0;
}

int rlm_fd_headroom(int need) {
  int fds[64], n = 0;
  if (need > 64)
    need = 64;
  while (n < need) {
    int fd =
        n == 0 ? eventfd(0, EFD_CLOEXEC) : fcntl(fds[0], F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
      break;
    fds[n++] = fd;
  }
  for (int i = 0; i < n; i++)
    close(fds[i]);
  return n;
}
