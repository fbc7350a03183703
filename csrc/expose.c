/* expose.c: the binds that make a host path resolve inside the sandbox
 * as it does on the host (every symlink on the way, every directory that
 * holds it), with what one build has asked the filesystem remembered, and
 * the binds of an installation (the interpreter and the ro paths) kept
 * for the next spawn that asks for the same. */
#define _GNU_SOURCE
#include "expose.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
