/* sandbox.c: the bubblewrap policy. The driver sees an empty root holding
 * only the Python installation (read-only), itself (read-only), /session (a
 * size-limited tmpfs of its own), a read-only /proc with the host-global
 * files that leak kernel state hidden, and a minimal read-only /dev; every
 * namespace is new, so it has no network, no view of host processes and no
 * SysV IPC. */
#define _GNU_SOURCE
#include "sandbox.h"
#include "expose.h"

#include <limits.h>
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
