/* farside_checks.c: what rlm-keeper checks of its sandbox from outside,
 * in /proc, and reports to the host as checks (the local backend's host
 * reads the same in lua/rlm/sandbox/selftest.lua and bwrap.lua): every
 * process's uids, the driver's rlimits, the descriptors that reach the
 * sandbox, the interpreter's confinement, and its memory cgroup; the
 * checks message sent after the driver's ready (ready_checks). */
#include "farside.h"
#include "smallfile.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
  const char *name, *row;
} limit_rows[] = {
    {"RLIMIT_AS", "Max address space"},
    {"RLIMIT_NPROC", "Max processes"},
    {"RLIMIT_FSIZE", "Max file size"},
    {"RLIMIT_NOFILE", "Max open files"},
    {"RLIMIT_CORE", "Max core file size"},
    {"RLIMIT_CPU", "Max cpu time"},
    {"RLIMIT_SIGPENDING", "Max pending signals"},
    {"RLIMIT_MSGQUEUE", "Max msgqueue size"},
    {"RLIMIT_MEMLOCK", "Max locked memory"},
};

int far_rlimit_known(const char *name) {
  for (size_t i = 0; i < sizeof(limit_rows) / sizeof(limit_rows[0]); i++)
    if (strcmp(limit_rows[i].name, name) == 0)
      return (int)i;
  return -1;
}

/* Appends to detail (bounded, always NUL-terminated). */
static void add(char *detail, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add(char *detail, size_t len, const char *fmt, ...) {
  size_t at = strlen(detail);
  if (at + 1 >= len)
    return;
  va_list ap;
  va_start(ap, fmt);
  (void)vsnprintf(detail + at, len - at, fmt, ap);
  va_end(ap);
}

/* A value of /proc/<pid>/limits: -1 for unlimited; -2 when unreadable. */
static int64_t limit_value(const char *s) {
  if (strncmp(s, "unlimited", 9) == 0)
    return -1;
  char *end;
  long long v = strtoll(s, &end, 10);
  return end == s || v < 0 ? -2 : (int64_t)v;
}

int far_check_rlimits(int pid, const far_rlimit *want, size_t n, char *detail,
                      size_t len) {
  char path[64], text[4096];
  detail[0] = '\0';
  snprintf(path, sizeof(path), "/proc/%d/limits", pid);
  if (pid <= 0 || rlm_read_small(path, text, sizeof(text)) <= 0) {
    add(detail, len, "cannot read /proc/%d/limits", pid);
    return 0;
  }
  int ok = 1;
  for (size_t i = 0; i < n; i++) {
    int row = far_rlimit_known(want[i].name);
    const char *at = row < 0 ? NULL : strstr(text, limit_rows[row].row);
    int64_t soft = -2, hard = -2;
    if (at != NULL) {
      at += strlen(limit_rows[row].row);
      while (*at == ' ')
        at++;
      soft = limit_value(at);
      while (*at != ' ' && *at != '\0')
        at++;
      while (*at == ' ')
        at++;
      hard = limit_value(at);
    }
    int64_t w = want[i].value;
    int fine = soft != -2 && soft == hard &&
               ((w < 0 && soft == -1) || (w >= 0 && soft >= 0 && soft <= w));
    if (!fine) {
      ok = 0;
      add(detail, len, "%s%s is %lld/%lld, wanted %lld", detail[0] ? "; " : "",
          want[i].name, (long long)soft, (long long)hard, (long long)w);
    }
  }
  if (ok)
    add(detail, len, "%zu limits as set", n);
  return ok;
}

/* The four ids of a "Uid:" or "Gid:" line of a status file; how many. */
static int ids_of(const char *text, const char *key, long ids[4]) {
  const char *at = strstr(text, key);
  int n = 0;
  if (at == NULL)
    return 0;
  at += strlen(key);
  while (n < 4) {
    char *end;
    long v = strtol(at, &end, 10);
    if (end == at)
      break;
    ids[n++] = v;
    at = end;
  }
  return n;
}

int far_check_uids(const int *pids, size_t n, unsigned want, char *detail,
                   size_t len) {
  int ok = n > 0;
  detail[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    char path[64], text[4096];
    snprintf(path, sizeof(path), "/proc/%d/status", pids[i]);
    if (rlm_read_small(path, text, sizeof(text)) <= 0)
      continue; /* it exited meanwhile */
    static const char *const keys[] = {"\nUid:", "\nGid:"};
    for (int k = 0; k < 2; k++) {
      long ids[4];
      int got = ids_of(text, keys[k], ids);
      int fine = got == 4;
      for (int j = 0; j < got; j++)
        fine = fine && ids[j] == (long)want && ids[j] != 0;
      if (!fine) {
        ok = 0;
        add(detail, len, "%spid %d %s not all %u", detail[0] ? "; " : "",
            pids[i], keys[k] + 1, want);
      }
    }
  }
  if (n == 0)
    add(detail, len, "the sandbox has no processes");
  else if (ok)
    add(detail, len, "%zu processes as uid %u", n, want);
  return ok;
}

typedef struct fd_list {
  char *detail;
  size_t len;
  int found;
} fd_list;

static void note_fd(void *ud, int pid, int fd, const char *target) {
  fd_list *l = ud;
  l->found++;
  add(l->detail, l->len, "%spid %d fd %d: %s", l->found > 1 ? "; " : "", pid,
      fd, target);
}

int far_check_descriptors(const rlm_driver *d, char *detail, size_t len) {
  fd_list l = {.detail = detail, .len = len, .found = 0};
  detail[0] = '\0';
  (void)rlm_driver_foreign_fds(d, note_fd, &l);
  if (l.found == 0)
    add(detail, len, "only the session's pipes");
  return l.found == 0;
}

/* The hex value of a /proc/<pid>/status field; -1 when it is not there. */
static long long status_field(const char *status, const char *key, int base) {
  const char *p = strstr(status, key);
  if (p == NULL)
    return -1;
  char *end;
  long long v = strtoll(p + strlen(key), &end, base);
  return end == p + strlen(key) ? -1 : v;
}

int far_check_confinement(int pid, char *detail, size_t len) {
  char path[64], status[8192];
  detail[0] = '\0';
  snprintf(path, sizeof(path), "/proc/%d/status", pid);
  if (pid <= 0 || rlm_read_small(path, status, sizeof(status)) <= 0) {
    add(detail, len, "%s: not readable", path);
    return 0;
  }
  long long seccomp = status_field(status, "\nSeccomp:", 10);
  long long nnp = status_field(status, "\nNoNewPrivs:", 10);
  long long eff = status_field(status, "\nCapEff:", 16);
  long long prm = status_field(status, "\nCapPrm:", 16);
  long long bnd = status_field(status, "\nCapBnd:", 16);
  add(detail, len,
      "the interpreter (pid %d): Seccomp=%lld NoNewPrivs=%lld CapEff=%llx "
      "CapPrm=%llx CapBnd=%llx",
      pid, seccomp, nnp, eff, prm, bnd);
  return seccomp == 2 && nnp == 1 && eff == 0 && prm == 0 && bnd == 0;
}

/* --- the checks after ready, reported ---------------------------------- */

static void out_check(far *f, const char *name, int ok, const char *detail,
                      int *first) {
  out_str(f, *first ? "\"" : ",\"");
  out_str(f, name);
  out_str(f,
          ok ? "\":{\"ok\":true,\"detail\":" : "\":{\"ok\":false,\"detail\":");
  out_jstr(f, detail);
  out_str(f, "}");
  *first = 0;
}

/* After the driver's ready: what only this side can see, as checks. */
static void ready_checks(far *f) {
  char detail[1024];
  int pids[256], first = 1;
  size_t n = rlm_driver_tree(f->d, pids, 256);
  out_str(f, "K{\"type\":\"checks\",\"checks\":{");
  out_check(f, "memory_cgroup", f->cgroup_ok, f->cgroup_detail, &first);
  int ok =
      far_check_uids(pids, n, rlm_driver_uid(f->d), detail, sizeof(detail));
  out_check(f, "uids", ok, detail, &first);
  ok = far_check_rlimits(rlm_driver_interpreter_pid(f->d), f->want, f->n_want,
                         detail, sizeof(detail));
  out_check(f, "rlimits", ok, detail, &first);
  ok = far_check_descriptors(f->d, detail, sizeof(detail));
  out_check(f, "descriptors", ok, detail, &first);
  ok = far_check_confinement(rlm_driver_interpreter_pid(f->d), detail,
                             sizeof(detail));
  out_check(f, "confinement", ok, detail, &first);
  snprintf(detail, sizeof(detail), "%s",
           f->ctx_state == 2 ? "written and sealed" : f->ctx_err);
  out_check(f, "context_sealed", f->ctx_state == 2, detail, &first);
  out_str(f, "}}\n");
}

/* Whether the driver's processes are in their memory cgroup (the hello is
 * when they all run). */
static void adopt(far *f) {
  const char *how = rlm_driver_memory_mechanism(f->d);
  f->cgroup_ok = rlm_driver_adopt(f->d) == 0;
  snprintf(f->cgroup_detail, sizeof(f->cgroup_detail), "%s%s", how,
           f->cgroup_ok ? "" : ": a process could not be moved into it");
}
