/* farside_probe.c: what of its installation the far side's interpreter
 * needs inside the sandbox (python/probe.py, as rlm.sandbox.bwrap asks it
 * on the host), and the driver's package it packs; kept in a cache
 * directory so that a keeper's cold start does not pay a probe (an image
 * makes it at build time: rlm-keeper --probe). */
#define _GNU_SOURCE
#include "base64.h"
#include "farside.h"
#include "jsonread.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

#define PROBE_MAX (64u << 20) /* the report's line */
#define PROBE_TIMEOUT_MS 20000
#define PROBE_TOKENS 65536

/* Appends to a bounded key; -1 when it does not fit. */
static int key_add(char *key, size_t *at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(key + *at, KEY_MAX - *at, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= KEY_MAX - *at)
    return -1;
  *at += (size_t)n;
  return 0;
}

static int key_stat(char *key, size_t *at, const char *path) {
  struct stat st;
  if (stat(path, &st) != 0)
    return key_add(key, at, "\t%s -", path);
  return key_add(key, at, "\t%s %lld %lld.%09ld", path, (long long)st.st_size,
                 (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

/* What the cached report depends on, as one line: the interpreter (as
 * named: a wrapper that changes what it runs is not seen), the modules,
 * and every file of the driver's. */
static int probe_key(char *key, const char *python, const char *driver_dir,
                     const char *const *modules, size_t n_modules) {
  size_t at = 0;
  char real[PATH_MAX];
  if (realpath(python, real) == NULL)
    return -1;
  if (key_add(key, &at, "rlm-keeper probe %s", RLM_KEEPER_VERSION) != 0 ||
      key_stat(key, &at, real) != 0)
    return -1;
  for (size_t i = 0; i < n_modules; i++)
    if (key_add(key, &at, "%s%s", i ? "," : "\tmodules ", modules[i]) != 0)
      return -1;
  char path[2 * PATH_MAX];
  if (strlen(driver_dir) >= PATH_MAX)
    return -1;
  snprintf(path, sizeof(path), "%s/repl_driver.py", driver_dir);
  if (key_stat(key, &at, path) != 0)
    return -1;
  snprintf(path, sizeof(path), "%s/_rlm_driver", driver_dir);
  DIR *dir = opendir(path);
  if (dir == NULL)
    return -1;
  /* In name order, so that the key does not depend on readdir's. */
  char names[64][NAME_MAX + 1];
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL && n < 64) {
    size_t len = strlen(e->d_name);
    if (len > 3 && strcmp(e->d_name + len - 3, ".py") == 0)
      memcpy(names[n++], e->d_name, len + 1);
  }
  closedir(dir);
  qsort(names, n, sizeof(names[0]),
        (int (*)(const void *, const void *))strcmp);
  for (size_t i = 0; i < n; i++) {
    if (snprintf(path, sizeof(path), "%s/_rlm_driver/%s", driver_dir,
                 names[i]) >= (int)sizeof(path))
      return -1;
    if (key_stat(key, &at, path) != 0)
      return -1;
  }
  return strchr(key, '\n') != NULL ? -1 : 0;
}

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* The whole of a file, up to max bytes; NULL (errno) when it is larger. */
static char *read_whole(const char *path, size_t max, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  while (buf != NULL) {
    if (n == cap) {
      if (cap >= max) {
        free(buf);
        buf = NULL;
        errno = EFBIG;
        break;
      }
      cap = cap * 2 > max ? max : cap * 2;
      char *more = realloc(buf, cap + 1);
      if (more == NULL) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = more;
    }
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      free(buf);
      buf = NULL;
      break;
    }
    if (r == 0) {
      buf[n] = '\0';
      *len = n;
      break;
    }
    n += (size_t)r;
  }
  int e = errno;
  close(fd);
  errno = e;
  return buf;
}

/* The cached report for key, or NULL. */
static char *cache_read(const char *file, const char *key) {
  size_t len;
  char *text = read_whole(file, PROBE_MAX + KEY_MAX, &len);
  if (text == NULL)
    return NULL;
  size_t klen = strlen(key);
  if (len <= klen + 1 || memcmp(text, key, klen) != 0 || text[klen] != '\n') {
    free(text);
    return NULL;
  }
  memmove(text, text + klen + 1, len - klen); /* the NUL too */
  return text;
}

/* Written beside, then renamed over: a reader never sees half of it. */
static void cache_write(const char *file, const char *key, const char *line) {
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof(tmp), "%s.%d", file, (int)getpid()) >=
      (int)sizeof(tmp))
    return;
  FILE *f = fopen(tmp, "we");
  if (f == NULL)
    return;
  int ok = fprintf(f, "%s\n%s\n", key, line) > 0;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, file) != 0)
    (void)unlink(tmp);
}

/* Runs the probe and returns its one line (malloc'd), or NULL and err. */
static char *run_probe(const char *python, const char *driver_dir,
                       const char *const *modules, size_t n_modules, char *err,
                       size_t errlen) {
  char script[PATH_MAX + 16];
  snprintf(script, sizeof(script), "%.*s/probe.py", PATH_MAX - 1, driver_dir);
  const char *argv[256 + 8];
  size_t n = 0;
  if (n_modules > 256) {
    snprintf(err, errlen, "too many modules to probe");
    return NULL;
  }
  argv[n++] = python;
  argv[n++] = "-I";
  argv[n++] = "-S";
  argv[n++] = script;
  argv[n++] = "--driver";
  argv[n++] = driver_dir;
  for (size_t i = 0; i < n_modules; i++)
    argv[n++] = modules[i];
  argv[n] = NULL;
  rlm_driver_opts o;
  memset(&o, 0, sizeof(o));
  o.argv = (char *const *)argv;
  o.max_line = PROBE_MAX;
  rlm_driver *d = rlm_driver_start(&o, err, errlen);
  if (d == NULL)
    return NULL;
  rlm_driver_set_deadline(d, PROBE_TIMEOUT_MS);
  char *line = NULL;
  int status = -2;
  err[0] = '\0';
  while (status == -2 && err[0] == '\0') {
    rlm_driver_wait(d, -1, 0, 0);
    rlm_event *ev;
    while ((ev = rlm_driver_take(d)) != NULL) {
      if (ev->kind == RLM_EV_LINE && line == NULL) {
        line = malloc(ev->len + 1);
        if (line != NULL)
          memcpy(line, ev->data, ev->len + 1);
      } else if (ev->kind == RLM_EV_EXIT) {
        status = ev->term_signal ? 128 + ev->term_signal : (int)ev->exit_status;
        if (status != 0)
          snprintf(err, errlen, "exit status %d: %.300s", status,
                   ev->data ? ev->data : "");
      } else if (ev->kind == RLM_EV_FAILED) {
        snprintf(err, errlen, "%.400s", ev->data ? ev->data : "");
      } else if (ev->kind == RLM_EV_TIMEOUT) {
        snprintf(err, errlen, "timed out");
      } else if (ev->kind != RLM_EV_LINE) {
        snprintf(err, errlen, "printed too much");
      }
      rlm_event_free(ev);
    }
  }
  rlm_driver_close(d);
  if (err[0] != '\0' || line == NULL) {
    if (err[0] == '\0')
      snprintf(err, errlen, "it printed nothing");
    free(line);
    return NULL;
  }
  return line;
}

/* A list of strings at t[i] into a new array of pointers; the strings are
 * decoded in place later (decode_all). */
static const char **string_list(const char *s, const rlm_jtok *t, long i,
                                size_t *n) {
  if (i < 0 || t[i].type != RLM_JT_ARRAY)
    return NULL;
  const char **v = calloc(t[i].count + 1, sizeof(*v));
  if (v == NULL)
    return NULL;
  long k = i + 1;
  for (size_t j = 0; j < t[i].count; j++) {
    if (t[k].type != RLM_JT_STRING) {
      free(v);
      return NULL;
    }
    v[j] = s + t[k].start;
    k = (long)t[k].next;
  }
  *n = t[i].count;
  return v;
}

/* Every string token's text decoded over its own bytes (never longer), NUL
 * where its closing quote was. */
static int decode_all(char *s, const rlm_jtok *t, long n) {
  for (long i = 0; i < n; i++)
    if (t[i].type == RLM_JT_STRING &&
        rlm_json_string(s, t, i, s + t[i].start, t[i].end - t[i].start + 1) < 0)
      return -1;
  return 0;
}

static int absolute_all(const char **v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (v[i][0] != '/')
      return 0;
  return 1;
}

static int decode_report(far_probe *p, char *err, size_t errlen) {
  char *s = p->text;
  size_t len = strlen(s);
  rlm_jtok *t = malloc(PROBE_TOKENS * sizeof(*t));
  if (t == NULL) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  long n = rlm_json_parse(s, len, t, PROBE_TOKENS, 8);
  int rc = -1;
  if (n < 1 || t[0].type != RLM_JT_OBJECT) {
    snprintf(err, errlen, "its report is not a JSON object");
    goto out;
  }
  long exe = rlm_json_get(s, t, 0, "executable");
  long ver = rlm_json_get(s, t, 0, "version");
  long interp = rlm_json_get(s, t, 0, "interpreter");
  long zip = rlm_json_get(s, t, 0, "driver_zip");
  long pyc = rlm_json_get(s, t, 0, "driver_pyc");
  p->sys_path =
      string_list(s, t, rlm_json_get(s, t, 0, "sys_path"), &p->n_sys_path);
  p->pth_paths =
      string_list(s, t, rlm_json_get(s, t, 0, "pth_paths"), &p->n_pth_paths);
  p->files = string_list(s, t, rlm_json_get(s, t, 0, "files"), &p->n_files);
  if (exe < 0 || t[exe].type != RLM_JT_STRING || ver < 0 ||
      t[ver].type != RLM_JT_STRING || zip < 0 || t[zip].type != RLM_JT_STRING ||
      pyc < 0 || t[pyc].type != RLM_JT_STRING || p->sys_path == NULL ||
      p->pth_paths == NULL || p->files == NULL ||
      (interp >= 0 && t[interp].type != RLM_JT_STRING &&
       t[interp].type != RLM_JT_NULL)) {
    snprintf(err, errlen, "its report lacks a field (or the driver's zip)");
    goto out;
  }
  if (decode_all(s, t, n) != 0) {
    snprintf(err, errlen, "its report holds a string with a NUL");
    goto out;
  }
  p->executable = s + t[exe].start;
  p->version = s + t[ver].start;
  p->interpreter = interp >= 0 && t[interp].type == RLM_JT_STRING
                       ? s + t[interp].start
                       : NULL;
  if (p->executable[0] != '/' || (p->interpreter && p->interpreter[0] != '/') ||
      !absolute_all(p->sys_path, p->n_sys_path) ||
      !absolute_all(p->pth_paths, p->n_pth_paths) ||
      !absolute_all(p->files, p->n_files)) {
    snprintf(err, errlen, "its report names a path that is not absolute");
    goto out;
  }
  const char *z = s + t[zip].start, *y = s + t[pyc].start;
  size_t zl = strlen(z), yl = strlen(y);
  p->zip = malloc(zl / 4 * 3 + 1);
  p->pyc = malloc(yl / 4 * 3 + 1);
  long zn = p->zip ? rlm_base64_decode(z, zl, p->zip) : -1;
  long yn = p->pyc ? rlm_base64_decode(y, yl, p->pyc) : -1;
  if (zn <= 0 || yn <= 0) {
    snprintf(err, errlen, "the driver's package is not base64");
    goto out;
  }
  p->zip_len = (size_t)zn;
  p->pyc_len = (size_t)yn;
  rc = 0;
out:
  free(t);
  return rc;
}

int far_probe_get(far_probe *p, const char *python, const char *driver_dir,
                  const char *const *modules, size_t n_modules,
                  const char *cache_dir, char *err, size_t errlen) {
  memset(p, 0, sizeof(*p));
  char *key = malloc(KEY_MAX), file[PATH_MAX];
  int cached = 0;
  if (key == NULL) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int keyed = cache_dir != NULL &&
              probe_key(key, python, driver_dir, modules, n_modules) == 0 &&
              snprintf(file, sizeof(file), "%s/probe-%016llx.json", cache_dir,
                       (unsigned long long)fnv1a(key)) < (int)sizeof(file);
  if (keyed && (p->text = cache_read(file, key)) != NULL) {
    cached = 1;
    if (decode_report(p, err, errlen) != 0) { /* a bad cache: ask again */
      far_probe_free(p);
      cached = 0;
    }
  }
  if (!cached) {
    char why[512];
    p->text =
        run_probe(python, driver_dir, modules, n_modules, why, sizeof(why));
    if (p->text == NULL) {
      snprintf(err, errlen, "asking %s about its installation: %s", python,
               why);
      free(key);
      return -1;
    }
    char *copy = keyed ? strdup(p->text) : NULL;
    if (decode_report(p, why, sizeof(why)) != 0) {
      snprintf(err, errlen, "%s did not describe its installation: %s", python,
               why);
      free(copy);
      free(key);
      far_probe_free(p);
      return -1;
    }
    if (copy != NULL)
      cache_write(file, key, copy);
    free(copy);
  }
  free(key);
  return 0;
}

void far_probe_free(far_probe *p) {
  free(p->text);
  free(p->sys_path);
  free(p->pth_paths);
  free(p->files);
  free(p->zip);
  free(p->pyc);
  memset(p, 0, sizeof(*p));
}
