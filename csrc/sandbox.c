/* sandbox.c: the bubblewrap policy. The driver sees an empty root holding
 * only the Python installation (read-only), itself (read-only), /session (a
 * size-limited tmpfs of its own), a read-only /proc with the host-global
 * files that leak kernel state hidden, and a minimal read-only /dev; every
 * namespace is new, so it has no network, no view of host processes and no
 * SysV IPC. */
#define _GNU_SOURCE
#include "sandbox.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int rlm_argv_push(rlm_argv *a, const char *s) {
  if (a->n + 2 > a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 64;
    char **v = realloc(a->v, cap * sizeof(*v));
    if (v == NULL)
      return -1;
    a->v = v;
    a->cap = cap;
  }
  if ((a->v[a->n] = strdup(s)) == NULL)
    return -1;
  a->v[++a->n] = NULL;
  return 0;
}

void rlm_argv_free(rlm_argv *a) {
  for (size_t i = 0; i < a->n; i++)
    free(a->v[i]);
  free(a->v);
  a->v = NULL;
  a->n = a->cap = 0;
}

/* What has been exposed so far, so that a path inside an exposed directory or
 * a symlink seen twice is not emitted again. */
/* What one build has asked the filesystem, by path: the ro paths share
 * their directories, and each would otherwise be stat'ed again for every
 * path below it (hundreds of system calls a spawn). */
#define STAT_MEMO_SLOTS 1024
typedef struct stat_memo {
  char *path;
  int lstat_rc, stat_rc; /* 0, -1 (failed) or 1 (not asked yet) */
  mode_t lmode, mode;
} stat_memo;

typedef struct exposer {
  rlm_argv *argv;
  rlm_argv seen;
  rlm_argv *stage;
  int failed;
  stat_memo *memo; /* STAT_MEMO_SLOTS, or NULL: ask every time */
} exposer;

/* The memo's slot for path, made on first use; NULL when it is full. */
static stat_memo *memo_slot(exposer *e, const char *path) {
  if (e->memo == NULL)
    return NULL;
  uint32_t h = 2166136261u;
  for (const char *p = path; *p; p++)
    h = (h ^ (unsigned char)*p) * 16777619u;
  for (uint32_t k = 0; k < STAT_MEMO_SLOTS; k++) {
    stat_memo *m = &e->memo[(h + k) % STAT_MEMO_SLOTS];
    if (m->path == NULL) {
      if (k > STAT_MEMO_SLOTS / 2 || (m->path = strdup(path)) == NULL)
        return NULL;
      m->lstat_rc = m->stat_rc = 1;
      return m;
    }
    if (strcmp(m->path, path) == 0)
      return m;
  }
  return NULL;
}

/* lstat (follow = 0) or stat, remembered: 0 and the mode, or -1. */
static int memo_stat(exposer *e, const char *path, int follow, mode_t *mode) {
  stat_memo *m = memo_slot(e, path);
  int *rc = m == NULL ? NULL : follow ? &m->stat_rc : &m->lstat_rc;
  mode_t *mm = m == NULL ? NULL : follow ? &m->mode : &m->lmode;
  if (rc != NULL && *rc != 1) {
    *mode = *mm;
    return *rc;
  }
  struct stat st;
  int r = (follow ? stat(path, &st) : lstat(path, &st)) == 0 ? 0 : -1;
  *mode = r == 0 ? st.st_mode : 0;
  if (rc != NULL) {
    *rc = r;
    *mm = *mode;
  }
  return r;
}

static void memo_free(exposer *e) {
  if (e->memo == NULL)
    return;
  for (size_t i = 0; i < STAT_MEMO_SLOTS; i++)
    free(e->memo[i].path);
  free(e->memo);
  e->memo = NULL;
}

/* Whether a process with no privilege and none of the owners' ids can
 * resolve path: every directory above it searchable by others. */
static int reachable_by_others(exposer *e, const char *path) {
  char dir[PATH_MAX];
  size_t len = strlen(path);
  if (len >= sizeof(dir))
    return 0;
  memcpy(dir, path, len + 1);
  for (char *slash = strrchr(dir, '/'); slash != NULL;
       slash = strrchr(dir, '/')) {
    if (slash == dir)
      slash[1] = '\0';
    else
      *slash = '\0';
    mode_t mode;
    if (memo_stat(e, dir, 1, &mode) != 0 || !(mode & S_IXOTH))
      return 0;
    if (slash == dir)
      break;
  }
  return 1;
}

static int path_within(const char *path, const char *dir) {
  size_t n = strlen(dir);
  if (strcmp(dir, "/") == 0)
    return 1;
  return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static int already_exposed(exposer *e, const char *path) {
  for (size_t i = 0; i < e->seen.n; i++)
    if (path_within(path, e->seen.v[i]))
      return 1;
  return 0;
}

static void emit(exposer *e, const char *a, const char *b, const char *c) {
  if (rlm_argv_push(e->argv, a) || rlm_argv_push(e->argv, b) ||
      (c && rlm_argv_push(e->argv, c)))
    e->failed = 1;
}

/* A file copied in from the child's descriptor fd at dest: a file of the
 * sandbox's root tmpfs, read-only once the root is remounted so (the
 * argv's last mounts), with no mount of its own. --ro-bind-data would add
 * one, a remount, and a read of mountinfo to find it, for each file. */
static void copy_in(exposer *e, int fd, const char *dest) {
  char num[16];
  snprintf(num, sizeof(num), "%d", fd);
  emit(e, "--perms", "0444", NULL);
  emit(e, "--file", num, dest);
}

static void remember(exposer *e, const char *path) {
  if (rlm_argv_push(&e->seen, path))
    e->failed = 1;
}

/* Makes `path` resolve inside the sandbox as it does on the host: every
 * symlink met on the way is recreated (its parent made with --dir) and the
 * final file or directory is bound read-only at its real path. A path that
 * does not exist is skipped. */
static void expose(exposer *e, const char *path, int hops) {
  char cur[PATH_MAX] = "";
  char rest[PATH_MAX];
  size_t curlen = 0;

  if (hops > 40 || path[0] != '/' || strlen(path) >= sizeof(rest))
    return;
  strcpy(rest, path);
  for (char *comp = rest, *next; comp != NULL; comp = next) {
    next = strchr(comp, '/');
    if (next != NULL)
      *next++ = '\0';
    if (comp[0] == '\0' || strcmp(comp, ".") == 0)
      continue;
    if (strcmp(comp, "..") == 0) {
      char *slash = strrchr(cur, '/');
      curlen = slash ? (size_t)(slash - cur) : 0;
      cur[curlen] = '\0';
      continue;
    }
    if (curlen + 1 + strlen(comp) >= sizeof(cur))
      return;
    cur[curlen++] = '/';
    strcpy(cur + curlen, comp);
    curlen += strlen(comp);
    if (already_exposed(e, cur))
      return;

    mode_t mode;
    if (memo_stat(e, cur, 0, &mode) != 0)
      return;
    if (!S_ISLNK(mode))
      continue;

    char target[PATH_MAX];
    ssize_t len = readlink(cur, target, sizeof(target) - 1);
    if (len < 0)
      return;
    target[len] = '\0';
    char parent[PATH_MAX];
    memcpy(parent, cur, curlen + 1);
    char *slash = strrchr(parent, '/');
    if (slash == parent)
      parent[1] = '\0';
    else
      *slash = '\0';
    if (strcmp(parent, "/") != 0)
      emit(e, "--dir", parent, NULL);
    emit(e, "--symlink", target, cur);
    remember(e, cur);

    /* Continue from where the link points, with what is left of the path. */
    char resolved[PATH_MAX];
    int w;
    if (target[0] == '/')
      w = snprintf(resolved, sizeof(resolved), "%s%s%s", target,
                   next ? "/" : "", next ? next : "");
    else
      w = snprintf(resolved, sizeof(resolved), "%s/%s%s%s",
                   strcmp(parent, "/") == 0 ? "" : parent, target,
                   next ? "/" : "", next ? next : "");
    if (w > 0 && (size_t)w < sizeof(resolved))
      expose(e, resolved, hops + 1);
    return;
  }
  if (curlen == 0)
    return;
  if (e->stage != NULL && !reachable_by_others(e, cur)) {
    char staged[64];
    snprintf(staged, sizeof(staged), RLM_STAGE_DIR "/%zu", e->stage->n);
    if (rlm_argv_push(e->stage, cur))
      e->failed = 1;
    emit(e, "--ro-bind", staged, cur);
  } else {
    emit(e, "--ro-bind", cur, cur);
  }
  remember(e, cur);
}

/* Host-global files and directories of /proc that leak kernel state (or
 * would let a process with privilege change it): each file is covered with
 * /dev/null (on /proc, which is nodev, it cannot even be opened), each
 * directory with an empty read-only tmpfs. What the interpreter reads
 * (/proc/self, meminfo, stat, cpuinfo) stays. */
static const char *const proc_files[] = {
    "slabinfo",      "kpageflags",    "kpagecount", "kpagecgroup",
    "timer_list",    "timer_stats",   "keys",       "key-users",
    "sched_debug",   "sysrq-trigger", "kallsyms",   "modules",
    "vmallocinfo",   "pagetypeinfo",  "zoneinfo",   "buddyinfo",
    "iomem",         "ioports",       "kcore",      "kmsg",
    "latency_stats", "lock_stat",     "mtrr",       "dma",
    "config.gz",     "interrupts",    "softirqs",   "locks",
    "partitions",    "diskstats",     "swaps",      "devices",
    "misc",          "consoles",      "mdstat",     "allocinfo",
    "version",       "cmdline",       "crypto",     "execdomains",
    "vmstat",        "cgroups",       "fb",         NULL,
};
static const char *const proc_dirs[] = {
    "irq",           "bus", "acpi", "scsi",     "driver",  "asound",
    "dynamic_debug", "fs",  "tty",  "pressure", "sysvipc", NULL,
};

static void hide_proc(exposer *e) {
  char host[64], inside[64];
  struct stat st;
  for (const char *const *p = proc_files; *p != NULL; p++) {
    snprintf(host, sizeof(host), "/proc/%s", *p);
    if (lstat(host, &st) == 0 && S_ISREG(st.st_mode))
      emit(e, "--ro-bind", "/dev/null", host);
  }
  for (const char *const *p = proc_dirs; *p != NULL; p++) {
    snprintf(inside, sizeof(inside), "/proc/%s", *p);
    if (lstat(inside, &st) == 0 && S_ISDIR(st.st_mode)) {
      emit(e, "--tmpfs", inside, NULL);
      emit(e, "--remount-ro", inside, NULL);
    }
  }
  /* /proc/sys and everything else left: read-only. */
  emit(e, "--remount-ro", "/proc", NULL);
}

int rlm_sandbox_module_ok(const char *rel) {
  size_t n = strlen(rel);
  if (n < 4 || n > 128 || strcmp(rel + n - 3, ".py") != 0 || rel[0] == '/')
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = rel[i];
    int word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               (c >= '0' && c <= '9') || c == '_';
    if (!word && !(c == '/' && rel[i + 1] != '/' && rel[i + 1] != '\0') &&
        !(c == '.' && i == n - 3))
      return 0;
  }
  return 1;
}

/* The driver's package beside it, at /rlm/<path>: copied in from the
 * descriptors after the driver's, or bound from the driver's directory. */
static int bind_modules(exposer *e, const rlm_sandbox_spec *spec, char *err,
                        size_t errlen) {
  if (spec->n_modules > RLM_MAX_DRIVER_MODULES) {
    snprintf(err, errlen, "more than %d driver modules",
             RLM_MAX_DRIVER_MODULES);
    return -1;
  }
  const char *slash = strrchr(spec->driver, '/');
  int dirlen = slash ? (int)(slash - spec->driver) : 0;
  for (size_t i = 0; i < spec->n_modules; i++) {
    const char *rel = spec->modules[i];
    char dest[256], src[PATH_MAX];
    if (!rlm_sandbox_module_ok(rel)) {
      snprintf(err, errlen, "driver module %.64s: not a path to bind", rel);
      return -1;
    }
    snprintf(dest, sizeof(dest), "%s/%s", RLM_SANDBOX_DRIVER_DIR, rel);
    if (spec->driver_fd >= 0) {
      copy_in(e, spec->driver_fd + 1 + (int)i, dest);
    } else if (snprintf(src, sizeof(src), "%.*s/%s", dirlen, spec->driver,
                        rel) >= (int)sizeof(src)) {
      snprintf(err, errlen, "driver module %.64s: path too long", rel);
      return -1;
    } else {
      emit(e, "--ro-bind", src, dest);
    }
  }
  return 0;
}

/* The binds of the ro paths and the interpreter, by the list they were
 * made from: the installation's layout is read at the first spawn of the
 * process that exposes it, as the probe that lists it runs once per Lua
 * state. What a bind names is still resolved by bubblewrap at each spawn,
 * and a rebuild would expose the same names' targets: a later change to
 * the installation shows the same files either way (or fails the bind).
 * /proc's entries are looked at every time (hide_proc). */
#define EXPOSE_CACHE_SLOTS 4
typedef struct expose_entry {
  char *key; /* staged?, python, ro..., each NUL-terminated */
  size_t key_len;
  rlm_argv args, stage;
} expose_entry;
static pthread_mutex_t expose_mu = PTHREAD_MUTEX_INITIALIZER;
static expose_entry expose_cache[EXPOSE_CACHE_SLOTS];
static unsigned expose_next; /* the slot the next miss replaces */

static char *expose_key(const rlm_sandbox_spec *spec, size_t *len) {
  size_t n = 2 + strlen(spec->python) + 1;
  for (size_t i = 0; i < spec->n_ro; i++)
    n += strlen(spec->ro[i]) + 1;
  char *key = malloc(n), *p = key;
  if (key == NULL)
    return NULL;
  *p++ = spec->stage != NULL ? 's' : '-';
  *p++ = '\0';
  p = stpcpy(p, spec->python) + 1;
  for (size_t i = 0; i < spec->n_ro; i++)
    p = stpcpy(p, spec->ro[i]) + 1;
  *len = n;
  return key;
}

static int append_all(rlm_argv *to, const rlm_argv *from) {
  for (size_t i = 0; i < from->n; i++)
    if (rlm_argv_push(to, from->v[i]))
      return -1;
  return 0;
}

/* Appends the cached binds for key to e (and its stage): 1, or 0 when
 * there are none (or -1 out of memory). */
static int expose_cached(exposer *e, const char *key, size_t len) {
  int found = 0;
  pthread_mutex_lock(&expose_mu);
  for (size_t i = 0; i < EXPOSE_CACHE_SLOTS && !found; i++) {
    expose_entry *c = &expose_cache[i];
    if (c->key != NULL && c->key_len == len && memcmp(c->key, key, len) == 0)
      found = append_all(e->argv, &c->args) != 0 ||
                      (e->stage != NULL && append_all(e->stage, &c->stage))
                  ? -1
                  : 1;
  }
  pthread_mutex_unlock(&expose_mu);
  return found;
}

/* Keeps what was made for key (taking key). */
static void expose_keep(char *key, size_t len, const rlm_argv *args,
                        const rlm_argv *stage) {
  expose_entry c = {key, len, {0}, {0}};
  if (append_all(&c.args, args) != 0 ||
      (stage != NULL && append_all(&c.stage, stage) != 0)) {
    free(key);
    rlm_argv_free(&c.args);
    rlm_argv_free(&c.stage);
    return;
  }
  pthread_mutex_lock(&expose_mu);
  expose_entry old = expose_cache[expose_next];
  expose_cache[expose_next] = c;
  expose_next = (expose_next + 1) % EXPOSE_CACHE_SLOTS;
  pthread_mutex_unlock(&expose_mu);
  free(old.key);
  rlm_argv_free(&old.args);
  rlm_argv_free(&old.stage);
}

/* The binds of spec's ro paths and interpreter, appended to e's argv:
 * from the cache, or made. 0, or -1 with a message. */
static int expose_installation(exposer *e, const rlm_sandbox_spec *spec,
                               char *err, size_t errlen) {
  size_t len = 0;
  char *key = expose_key(spec, &len);
  int hit = key != NULL ? expose_cached(e, key, len) : 0;
  if (hit != 0) {
    free(key);
    if (hit < 0)
      e->failed = 1;
    return 0;
  }
  /* Made into lists of their own, then kept and appended; the memo may be
   * missing (out of memory): every path is then asked again. */
  e->memo = calloc(STAT_MEMO_SLOTS, sizeof(stat_memo));
  /* Made into lists of their own, then kept and appended. */
  rlm_argv *out = e->argv, *out_stage = e->stage;
  rlm_argv args = {0}, stage = {0};
  e->argv = &args;
  if (out_stage != NULL) {
    e->stage = &stage;
    /* The staged paths are numbered from the caller's count (0: the first
     * spawn's and every other's alike). */
    if (out_stage->n != 0)
      e->failed = 1;
  }
  for (size_t i = 0; i < spec->n_ro; i++)
    expose(e, spec->ro[i], 0);
  expose(e, spec->python, 0);
  int ok = already_exposed(e, spec->python);
  e->argv = out;
  e->stage = out_stage;
  if (!ok) {
    snprintf(err, errlen, "the interpreter %s cannot be exposed in the sandbox",
             spec->python);
    free(key);
  } else if (!e->failed) {
    if (append_all(out, &args) != 0 ||
        (out_stage != NULL && append_all(out_stage, &stage) != 0))
      e->failed = 1;
    else if (key != NULL)
      expose_keep(key, len, &args, out_stage != NULL ? &stage : NULL);
    else
      free(key);
  } else {
    free(key);
  }
  rlm_argv_free(&args);
  rlm_argv_free(&stage);
  return ok ? 0 : -1;
}

int rlm_sandbox_argv(const rlm_sandbox_spec *spec, rlm_argv *out, char *err,
                     size_t errlen) {
  static const char *const head[] = {
      "--unshare-all",
      "--unshare-user",
      "--disable-userns",
      "--new-session",
      "--die-with-parent",
      "--cap-drop",
      "ALL",
      "--uid",
      "65534",
      "--gid",
      "65534",
      "--hostname",
      "rlm",
      "--proc",
      "/proc",
      "--dev",
      "/dev",
      NULL,
  };
  exposer e = {out, {0}, spec->stage, 0, NULL};

  if (rlm_argv_push(out, spec->bwrap))
    goto oom;
  for (const char *const *p = head; *p != NULL; p++)
    if (rlm_argv_push(out, *p))
      goto oom;

  if (expose_installation(&e, spec, err, errlen) != 0)
    goto fail;
  int compiled = spec->driver_fd >= 0 && spec->driver_compiled;
  const char *entry = compiled ? RLM_SANDBOX_DRIVER_PYC : RLM_SANDBOX_DRIVER;
  if (spec->driver_fd >= 0)
    copy_in(&e, spec->driver_fd, entry);
  else
    emit(&e, "--ro-bind", spec->driver, RLM_SANDBOX_DRIVER);
  if (spec->zip_fd >= 0)
    copy_in(&e, spec->zip_fd, RLM_SANDBOX_DRIVER_ZIP); /* the whole package */
  else if (bind_modules(&e, spec, err, errlen) != 0) {
    goto fail;
  }
  /* The workdir is the sandbox's own tmpfs: nothing it writes reaches the
   * host's disk, and it goes with the mount namespace. bwrap mounts it
   * nosuid and nodev. */
  char size[32];
  snprintf(size, sizeof(size), "%llu",
           (unsigned long long)(spec->workdir_bytes ? spec->workdir_bytes : 1));
  emit(&e, "--size", size, NULL);
  emit(&e, "--tmpfs", RLM_SANDBOX_WORKDIR, NULL);
  hide_proc(&e);
  emit(&e, "--remount-ro", "/", NULL);
  /* /dev is a tmpfs: writable, it would hold memory no RSS shows. */
  emit(&e, "--remount-ro", "/dev", NULL);
  if (spec->seccomp_fd >= 0) {
    char fd[16];
    snprintf(fd, sizeof(fd), "%d", spec->seccomp_fd);
    emit(&e, "--seccomp", fd, NULL);
  }
  emit(&e, "--chdir", RLM_SANDBOX_WORKDIR, NULL);
  if (e.failed)
    goto oom;

  if (rlm_argv_push(out, "--") || rlm_argv_push(out, spec->python))
    goto oom;
  for (const char *const *p = rlm_sandbox_flags(spec->hash_seed); *p != NULL;
       p++)
    if (rlm_argv_push(out, *p))
      goto oom;
  if (rlm_argv_push(out, entry))
    goto oom;
  rlm_argv_free(&e.seen);
  memo_free(&e);
  return 0;

oom:
  snprintf(err, errlen, "out of memory building the sandbox command line");
fail:
  rlm_argv_free(&e.seen);
  memo_free(&e);
  rlm_argv_free(out);
  return -1;
}

const char *const *rlm_sandbox_flags(uint32_t hash_seed) {
  static const char *const isolated[] = {"-I", "-S", "-B", NULL};
  static const char *const seeded[] = {"-s", "-S", "-B", NULL};
  return hash_seed > 0 ? seeded : isolated;
}

void rlm_sandbox_env(uint32_t hash_seed, char *var, char **env) {
  static char *const fixed[] = RLM_SANDBOX_ENV;
  size_t n = 0;
  for (; fixed[n] != NULL; n++)
    env[n] = fixed[n];
  if (hash_seed > 0) {
    snprintf(var, RLM_SEED_VAR_BYTES, "PYTHONHASHSEED=%lu",
             (unsigned long)hash_seed);
    env[n++] = var;
  }
  env[n] = NULL;
}

static int is_executable_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

int rlm_find_program(const char *name, char *out, size_t outlen) {
  if (name[0] == '\0')
    return -1;
  if (strchr(name, '/') != NULL) {
    if (!is_executable_file(name))
      return -1;
    char *real = realpath(name, NULL);
    int ok = real != NULL && strlen(real) < outlen;
    if (ok)
      strcpy(out, real);
    free(real);
    return ok ? 0 : -1;
  }
  const char *path = getenv("PATH");
  if (path == NULL)
    path = "/usr/local/bin:/usr/bin:/bin";
  while (*path != '\0') {
    const char *end = strchr(path, ':');
    size_t dirlen = end ? (size_t)(end - path) : strlen(path);
    char candidate[PATH_MAX];
    int w = snprintf(candidate, sizeof(candidate), "%.*s/%s", (int)dirlen,
                     dirlen ? path : ".", name);
    if (w > 0 && (size_t)w < sizeof(candidate) && candidate[0] == '/' &&
        is_executable_file(candidate) && (size_t)w < outlen) {
      strcpy(out, candidate);
      return 0;
    }
    path += dirlen + (end != NULL);
  }
  return -1;
}
