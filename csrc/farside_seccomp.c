/* farside_seccomp.c: which sandbox rlm-keeper can make here (the probe of
 * bubblewrap's namespaces, its verdict kept, choose_mode), and what its
 * fallback needs where bubblewrap cannot run (a container without user
 * namespaces, a masked /proc, gVisor): the REPL's directory, made and
 * removed by the keeper, and the interpreter's start in it (seccomp_plan).
 * docs/security.md says what each mode promises. */
#define _GNU_SOURCE
#include "farside.h"
#include "smallfile.h"
#include "workdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char *far_mode_name(far_mode m) {
  return m == FAR_BUBBLEWRAP ? "bubblewrap"
         : m == FAR_SECCOMP  ? "seccomp"
                             : "none";
}

/* The probe's child and grandchild: a failure is written to fd as one
 * line, "what: why", and ends it. */
__attribute__((noreturn)) static void probe_fail(int fd, const char *what) {
  char msg[160];
  int n = snprintf(msg, sizeof(msg), "%s: %s", what, strerror(errno));
  if (n > 0)
    (void)!write(fd, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg));
  _exit(1);
}

int far_namespaces_work(char *why, size_t len) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    snprintf(why, len, "pipe2: %s", strerror(errno));
    return 0;
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    /* What bubblewrap does first: namespaces of its own, then, as the new
     * pid namespace's first process, a private mount tree, a /proc of its
     * own over the one there, a hostname. */
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET |
                CLONE_NEWIPC | CLONE_NEWUTS) != 0)
      probe_fail(p[1], "unshare");
    pid_t init = fork();
    if (init < 0)
      probe_fail(p[1], "fork");
    if (init == 0) {
      if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        probe_fail(p[1], "making the mount tree private");
      if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                NULL) != 0)
        probe_fail(p[1], "mounting a /proc");
      if (sethostname("rlm", 3) != 0)
        probe_fail(p[1], "sethostname");
      _exit(0);
    }
    int status = 0;
    while (waitpid(init, &status, 0) < 0 && errno == EINTR)
      ;
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
  }
  close(p[1]);
  if (pid < 0) {
    snprintf(why, len, "fork: %s", strerror(errno));
    close(p[0]);
    return 0;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
    ;
  ssize_t n;
  while ((n = read(p[0], why, len - 1)) < 0 && errno == EINTR)
    ;
  close(p[0]);
  why[n > 0 ? n : 0] = '\0';
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
    return 1;
  if (why[0] == '\0')
    snprintf(why, len, "the namespaces' probe ended with status %d", status);
  return 0;
}

/* What the namespaces' verdict depends on, as one line: this boot, the
 * namespaces this keeper runs in (the same container: the same verdict),
 * the kernel's count of user namespaces allowed, and bubblewrap's file. */
static int namespaces_key(char *key, size_t len, const char *bwrap) {
  char boot[64] = "", max_ns[32] = "";
  size_t at = 0;
  if (rlm_read_small("/proc/sys/kernel/random/boot_id", boot, sizeof(boot)) <=
      0)
    return -1;
  (void)rlm_read_small("/proc/sys/user/max_user_namespaces", max_ns,
                       sizeof(max_ns));
  boot[strcspn(boot, "\n")] = '\0';
  max_ns[strcspn(max_ns, "\n")] = '\0';
  if (key_add(key, &at, "rlm-keeper namespaces 1\t%s\t%s", boot, max_ns) != 0 ||
      key_stat(key, &at, bwrap) != 0)
    return -1;
  static const char *const kinds[] = {"user", "mnt", "pid",   "net",
                                      "uts",  "ipc", "cgroup"};
  for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
    char path[64];
    struct stat st;
    snprintf(path, sizeof(path), "/proc/self/ns/%s", kinds[i]);
    if (stat(path, &st) != 0 || key_add(key, &at, "\t%s:%llu", kinds[i],
                                        (unsigned long long)st.st_ino) != 0)
      return -1;
  }
  (void)len;
  return strchr(key, '\n') != NULL ? -1 : 0;
}

int far_namespaces_cached(const char *cache_dir, const char *bwrap, char *why,
                          size_t len) {
  char *key = cache_dir != NULL ? malloc(KEY_MAX) : NULL;
  char file[PATH_MAX];
  int keyed = key != NULL && namespaces_key(key, KEY_MAX, bwrap) == 0 &&
              snprintf(file, sizeof(file), "%s/namespaces-%016llx", cache_dir,
                       (unsigned long long)fnv1a(key)) < (int)sizeof(file);
  char *seen = keyed ? cache_read(file, key) : NULL;
  int ok;
  if (seen != NULL && (seen[0] == '1' || seen[0] == '0')) {
    ok = seen[0] == '1';
    snprintf(why, len, "%s", seen[1] == ' ' ? seen + 2 : "");
    why[strcspn(why, "\n")] = '\0';
  } else {
    ok = far_namespaces_work(why, len);
    /* A refusal is kept; a failure that may pass (a fork's EAGAIN, the
     * count of user namespaces reached) is not. */
    if (keyed && (ok || strstr(why, strerror(EPERM)) != NULL ||
                  strstr(why, strerror(EACCES)) != NULL)) {
      char line[320];
      snprintf(line, sizeof(line), "%d %s", ok, why);
      cache_write(file, key, line);
    }
  }
  free(seen);
  free(key);
  return ok;
}

/* Writes data[0..n) to a new file at dir/name, mode 0444. */
static int write_at(int dir, const char *name, const char *data, size_t n) {
  int fd = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
  if (fd < 0)
    return -1;
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      int e = errno;
      close(fd);
      errno = e ? e : EIO;
      return -1;
    }
    data += w;
    n -= (size_t)w;
  }
  return close(fd);
}

int far_session_dir(char *dir, size_t len, const char *tmp, const far_probe *p,
                    char *err, size_t errlen) {
  if (snprintf(dir, len, "%s/rlm-keeper.XXXXXX", tmp) >= (int)len) {
    snprintf(err, errlen, "the temporary directory's name is too long");
    return -1;
  }
  if (mkdtemp(dir) == NULL) {
    snprintf(err, errlen, "mkdtemp in %s: %s", tmp, strerror(errno));
    dir[0] = '\0';
    return -1;
  }
  /* Others may pass through, not list: the REPL's uid reaches rlm/ and
   * session/ by name. */
  int fd = -1, rlm = -1,
      ok = chmod(dir, 0711) == 0 &&
           (fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) >=
               0 &&
           mkdirat(fd, "rlm", 0755) == 0 &&
           (rlm = openat(fd, "rlm",
                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) >=
               0 &&
           write_at(rlm, "repl_driver.pyc", p->pyc, p->pyc_len) == 0 &&
           write_at(rlm, "driver.zip", p->zip, p->zip_len) == 0 &&
           mkdirat(fd, "session", 0700) == 0;
  int e = errno;
  if (rlm >= 0)
    close(rlm);
  if (fd >= 0)
    close(fd);
  if (!ok) {
    snprintf(err, errlen, "making the REPL's directory in %.512s: %s", dir,
             strerror(e));
    return -1;
  }
  return 0;
}

/* How deep the removal goes before it moves a directory up to the top
 * for a later pass (so that no depth runs it out of descriptors). */
#define REMOVE_DEPTH 64

/* Removes what the directory at fd holds (and closes fd), following no
 * symlink; a directory REMOVE_DEPTH down is moved up to `root` instead,
 * under a name of its own, and counted in *moved. */
static unsigned long moved_names;
static void remove_in(int root, int fd, int depth, unsigned long *moved) {
  DIR *dir = fdopendir(fd);
  if (dir == NULL) {
    close(fd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    struct stat st;
    if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
      continue;
    if (!S_ISDIR(st.st_mode)) {
      (void)unlinkat(dirfd(dir), e->d_name, 0);
      continue;
    }
    if (depth + 1 >= REMOVE_DEPTH) {
      char name[48];
      snprintf(name, sizeof(name), ".rlm-deep-%lu", moved_names++);
      if (renameat(dirfd(dir), e->d_name, root, name) == 0)
        (*moved)++;
      continue;
    }
    int sub = openat(dirfd(dir), e->d_name,
                     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub >= 0)
      remove_in(root, sub, depth + 1, moved);
    (void)unlinkat(dirfd(dir), e->d_name, AT_REMOVEDIR);
  }
  closedir(dir);
}

int far_remove_tree(const char *path) {
  int root = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (root < 0)
    return errno == ENOENT ? 0 : -1;
  for (int pass = 0; pass < 1024; pass++) {
    unsigned long moved = 0;
    int fd = fcntl(root, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
      break;
    remove_in(root, fd, 0, &moved);
    if (moved == 0)
      break;
  }
  close(root);
  return rmdir(path);
}

/* Which sandbox this keeper makes (docs/security.md): bubblewrap where it
 * can make its namespaces, else the seccomp fallback, which needs a uid of
 * the REPL's own (this keeper root); none without an interpreter. */
static void choose_mode(far *f, const char *want, int found_python) {
  char why[200] = "";
  int ns = 0;
  f->mode = FAR_NONE;
  if (!found_python) {
    snprintf(f->mode_why, sizeof(f->mode_why),
             "the interpreter %s was not found", f->python_name);
    return;
  }
  if (strcmp(want, "seccomp") != 0 && f->have_bwrap)
    ns = far_namespaces_cached(f->cache_dir, f->bwrap, why, sizeof(why));
  if (strcmp(want, "seccomp") != 0 && f->have_bwrap && ns) {
    f->mode = FAR_BUBBLEWRAP;
    snprintf(f->mode_why, sizeof(f->mode_why), "%s", f->bwrap);
    return;
  }
  char bwrap_why[400];
  if (strcmp(want, "seccomp") == 0)
    snprintf(bwrap_why, sizeof(bwrap_why), "--sandbox seccomp");
  else if (!f->have_bwrap)
    snprintf(bwrap_why, sizeof(bwrap_why), "bubblewrap (%s) was not found",
             f->bwrap_name);
  else
    snprintf(bwrap_why, sizeof(bwrap_why),
             "bubblewrap cannot make its namespaces here (%s)", why);
  if (strcmp(want, "bubblewrap") == 0) {
    snprintf(f->mode_why, sizeof(f->mode_why), "%s", bwrap_why);
  } else if (geteuid() != 0) {
    snprintf(f->mode_why, sizeof(f->mode_why),
             "%s, and the seccomp fallback needs rlm-keeper to run as root, "
             "to give the REPL a uid of its own",
             bwrap_why);
  } else {
    f->mode = FAR_SECCOMP;
    snprintf(f->mode_why, sizeof(f->mode_why), "%s", bwrap_why);
  }
}

/* The fallback (seccomp_only, driver.h): the interpreter itself, run from
 * a directory of the keeper's (far_session_dir) with the driver's files,
 * the context's memfd at 4 (3: /dev/null, which the driver closes). The
 * keeper must be able to give it a uid of its own (root), which main
 * checked before it said "seccomp". 1, or 0 with err. */
static int seccomp_plan(far *f, const far_probe *probe, rlm_driver_opts *o,
                        int inherit[2], char **argv, char **env,
                        uint32_t hash_seed, char *err, size_t errlen) {
  const char *tmp = getenv("TMPDIR");
  if (far_session_dir(f->session_dir, sizeof(f->session_dir),
                      tmp != NULL && tmp[0] == '/' ? tmp : "/tmp", probe, err,
                      errlen) != 0)
    return 0;
  static char entry[PATH_MAX + 32], workdir[PATH_MAX + 16];
  snprintf(entry, sizeof(entry), "%s/rlm/repl_driver.pyc", f->session_dir);
  snprintf(workdir, sizeof(workdir), "%s/session", f->session_dir);
  snprintf(f->home_env, sizeof(f->home_env), "HOME=%s", workdir);
  static char exe[PATH_MAX];
  snprintf(exe, sizeof(exe), "%s", probe->executable);
  argv[0] = exe;
  const char *const *flags = rlm_sandbox_flags(hash_seed);
  for (int i = 0; i < 3; i++)
    argv[1 + i] = (char *)flags[i];
  argv[4] = entry;
  argv[5] = NULL;
  env[0] = "PATH=/usr/bin:/bin";
  env[1] = "LANG=C.UTF-8";
  env[2] = "PYTHONUTF8=1";
  env[3] = f->home_env;
  env[4] = NULL;
  if (hash_seed > 0) {
    snprintf(f->seed_env, sizeof(f->seed_env), "PYTHONHASHSEED=%lu",
             (unsigned long)hash_seed);
    env[4] = f->seed_env;
    env[5] = NULL;
  }
  char path[64];
  f->ctx_fd = rlm_context_open();
  if (f->ctx_fd >= 0) {
    snprintf(path, sizeof(path), "/proc/self/fd/%d", f->ctx_fd);
    do
      inherit[1] = open(path, O_RDONLY | O_CLOEXEC);
    while (inherit[1] < 0 && errno == EINTR);
  }
  do
    inherit[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
  while (inherit[0] < 0 && errno == EINTR);
  if (inherit[0] < 0 || inherit[1] < 0) {
    snprintf(err, errlen, "the context's memfd: %s", strerror(errno));
    return 0;
  }
  o->argv = argv;
  o->env = env;
  o->inherit_fds = inherit;
  o->n_inherit = 2;
  o->seccomp_only = 1;
  o->workdir = workdir;
  return 1;
}
