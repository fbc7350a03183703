/* farside.c: rlm-keeper's main: the stream (docs/protocol.md, "The
 * stream"). It says hello, takes the host's start, probes its interpreter
 * (or reads the probe's cache), plants its canaries, starts the driver
 * under bubblewrap through the same driver code rlm.core uses (driver.c,
 * keeper.c, spawn.c: its memory watchdog, cgroup, uid, deadline, kill),
 * sends the driver its configure and self_test, relays lines both ways
 * with a channel byte before each, writes the context into a sealed memfd,
 * checks the sandbox from outside after the driver's ready, and kills
 * everything it started when its stdin ends.
 *
 * One thread of its own (a poll over stdin, stdout and the driver's loop);
 * the driver's keeper and watchdog threads are driver.c's. Every line it
 * holds is bounded: the host's by max_message_bytes (64 KiB before the
 * start says it), the driver's by the same through the driver's framer,
 * and what waits for stdout by one relayed line and a few messages. */
#define _GNU_SOURCE
#include "farside.h"
#include "canary.h"
#include "jsonread.h"
#include "jsonscan.h"
#include "plan.h"
#include "sandbox.h"
#include "workdir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#define IN_CHUNK 65536
#define FIRST_LINE_MAX 65536 /* a line before the start sets the cap */
#define MSG_TOKENS 4096
#define OUT_HIGH 65536 /* take no driver event while more waits for stdout */
#define MAX_MODULES 256
#define MAX_RO 8192

static char *const sandbox_env[] = RLM_SANDBOX_ENV;

typedef struct far {
  /* where things are */
  const char *python_name, *bwrap_name, *cache_dir;
  char driver_dir[PATH_MAX], python[PATH_MAX], bwrap[PATH_MAX];
  int have_bwrap;
  far_mode mode;                 /* the sandbox it makes (its hello says) */
  char mode_why[PATH_MAX + 512]; /* why that one */
  char session_dir[PATH_MAX];    /* the fallback's (far_session_dir); "" */
  char home_env[PATH_MAX + 64];
  /* the host's input */
  char chunk[IN_CHUNK];
  size_t chunk_at, chunk_end;
  int in_eof;
  char *line;
  size_t line_len, line_cap, line_max;
  uint64_t raw_left; /* context bytes still to come */
  int ctx_fd;        /* the context memfd's writable end, until sealed */
  int ctx_state;     /* 0 none yet, 1 coming, 2 sealed, -1 failed */
  char ctx_err[160];
  /* what waits for stdout */
  char *out;
  size_t out_len, out_off, out_cap;
  int out_broken;
  /* the driver */
  rlm_driver *d;
  int started, ended;
  unsigned long lines_seen; /* the driver's lines so far */
  int load_seen;            /* the host's load_context went to the driver */
  far_rlimit want[FAR_MAX_RLIMITS];
  size_t n_want;
  rlm_canaries canaries;
  int planted;
  int cgroup_ok;
  char cgroup_detail[200];
  size_t max_line;
} far;

/* --- what goes to the host ---------------------------------------------- */

static int out_room(far *f, size_t n) {
  if (f->out_off > 0 && f->out_off == f->out_len)
    f->out_off = f->out_len = 0;
  if (f->out_len + n <= f->out_cap)
    return 0;
  if (f->out_off > 0) {
    memmove(f->out, f->out + f->out_off, f->out_len - f->out_off);
    f->out_len -= f->out_off;
    f->out_off = 0;
  }
  if (f->out_len + n <= f->out_cap)
    return 0;
  size_t cap = f->out_cap ? f->out_cap : 4096;
  while (cap < f->out_len + n)
    cap *= 2;
  char *more = realloc(f->out, cap);
  if (more == NULL)
    return -1;
  f->out = more;
  f->out_cap = cap;
  return 0;
}

static void out_bytes(far *f, const char *s, size_t n) {
  if (out_room(f, n) == 0) {
    memcpy(f->out + f->out_len, s, n);
    f->out_len += n;
  } else {
    f->out_broken = 1; /* no memory: the host cannot be told more */
  }
}

static void out_str(far *f, const char *s) { out_bytes(f, s, strlen(s)); }

static void out_fmt(far *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void out_fmt(far *f, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n > 0)
    out_bytes(f, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

/* A JSON string: the quotes and what is inside them. */
static void out_json(far *f, const char *s, size_t n) {
  size_t len = rlm_json_escaped_len(s, n);
  if (out_room(f, len + 2) != 0) {
    f->out_broken = 1;
    return;
  }
  f->out[f->out_len++] = '"';
  rlm_json_escape(s, n, f->out + f->out_len);
  f->out_len += len;
  f->out[f->out_len++] = '"';
}

static void out_jstr(far *f, const char *s) { out_json(f, s, strlen(s)); }

/* A message of the keeper's own that only says why: failed. */
static void say_failed(far *f, const char *message) {
  out_str(f, "K{\"type\":\"failed\",\"message\":");
  out_jstr(f, message);
  out_str(f, "}\n");
}

/* Writes what it can without blocking; -1 when the host is gone. */
static int flush_some(far *f) {
  while (f->out_off < f->out_len) {
    ssize_t n = write(1, f->out + f->out_off, f->out_len - f->out_off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN)
      return 0;
    if (n <= 0)
      return -1;
    f->out_off += (size_t)n;
  }
  return 0;
}

/* At the end: what is left, for at most ms. */
static void flush_all(far *f, int ms) {
  while (f->out_off < f->out_len && flush_some(f) == 0) {
    struct pollfd p = {.fd = 1, .events = POLLOUT};
    if (poll(&p, 1, ms) <= 0)
      return;
  }
}

/* --- the end ------------------------------------------------------------ */

static void end_driver(far *f) {
  if (f->d != NULL) {
    rlm_driver_close(f->d); /* its keeper thread kills and reaps it */
    f->d = NULL;
  }
  if (f->planted) {
    rlm_canaries_remove(&f->canaries);
    f->planted = 0;
  }
  if (f->ctx_fd >= 0) {
    close(f->ctx_fd);
    f->ctx_fd = -1;
  }
}

/* A failure that ends the keeper: said to the host, then everything goes. */
static void fail(far *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void fail(far *f, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (!f->ended)
    say_failed(f, msg);
  f->ended = 1;
  end_driver(f);
}

/* --- the start ---------------------------------------------------------- */

typedef struct start_msg {
  const char *s;
  rlm_jtok *t;
  long root;
} start_msg;

static int field_int(const start_msg *m, const char *key, int64_t min,
                     int64_t max, int64_t *out) {
  long i = rlm_json_get(m->s, m->t, m->root, key);
  return i >= 0 && rlm_json_int(m->s, m->t, i, out) == 0 && *out >= min &&
                 *out <= max
             ? 0
             : -1;
}

static int field_bool(const start_msg *m, const char *key, int *out) {
  long i = rlm_json_get(m->s, m->t, m->root, key);
  if (i < 0 || (m->t[i].type != RLM_JT_TRUE && m->t[i].type != RLM_JT_FALSE))
    return -1;
  *out = m->t[i].type == RLM_JT_TRUE;
  return 0;
}

/* The raw JSON of a field's value (the parse checked it), for configure. */
static void out_span(far *f, const start_msg *m, long i) {
  out_bytes(f, m->s + m->t[i].start - (m->t[i].type == RLM_JT_STRING),
            m->t[i].end - m->t[i].start + 2 * (m->t[i].type == RLM_JT_STRING));
}

/* The rlimits object at t[i] into f->want (merging: a name given again
 * takes the new value). */
static int read_rlimits(far *f, const start_msg *m, long i) {
  if (i < 0 || m->t[i].type != RLM_JT_OBJECT)
    return -1;
  long k = i + 1;
  for (size_t j = 0; j < m->t[i].count; j++) {
    char name[24];
    int64_t v;
    long vi = k + 1;
    if (rlm_json_string(m->s, m->t, k, name, sizeof(name)) < 0 ||
        far_rlimit_known(name) < 0 || rlm_json_int(m->s, m->t, vi, &v) != 0 ||
        v < -1)
      return -1;
    size_t at = 0;
    while (at < f->n_want && strcmp(f->want[at].name, name) != 0)
      at++;
    if (at == FAR_MAX_RLIMITS)
      return -1;
    memcpy(f->want[at].name, name, sizeof(name));
    f->want[at].value = v;
    if (at == f->n_want)
      f->n_want++;
    k = (long)m->t[vi].next;
  }
  return 0;
}

/* Whether here (a directory of this machine) is shown by a bound path. */
static int shown(const char *here, const char *const *ro, size_t n) {
  size_t len = strlen(here);
  if (strcmp(here, "/") == 0)
    return 1;
  for (size_t i = 0; i < n; i++)
    if (strncmp(ro[i], here, len) == 0 && ro[i][len] == '/')
      return 1;
  return 0;
}

/* The self_test message: the paths of this machine the sandbox must not
 * show (the working directory, the driver's), and the canaries. */
static void self_test_line(far *f, const char *const *ro, size_t n_ro) {
  out_str(f, "{\"type\":\"self_test\",\"mode\":");
  out_jstr(f, far_mode_name(f->mode));
  out_str(f, ",\"absent\":[");
  char cwd[PATH_MAX];
  const char *places[2] = {getcwd(cwd, sizeof(cwd)), f->driver_dir};
  int first = 1;
  /* Without bubblewrap the whole filesystem shows: nothing is absent. */
  for (int i = 0; i < 2 && f->mode == FAR_BUBBLEWRAP; i++)
    if (places[i] != NULL && places[i][0] == '/' &&
        !shown(places[i], ro, n_ro)) {
      if (!first)
        out_str(f, ",");
      out_jstr(f, places[i]);
      first = 0;
    }
  out_str(f, "],\"canaries\":{");
  rlm_canaries *c = &f->canaries;
  out_str(f, "\"secret\":");
  out_jstr(f, c->secret);
  if (c->home_file[0]) {
    out_str(f, ",\"home_file\":");
    out_jstr(f, c->home_file);
  }
  if (c->unix_path[0]) {
    out_str(f, ",\"unix_path\":");
    out_jstr(f, c->unix_path);
  }
  if (c->abstract_name[0]) {
    out_str(f, ",\"abstract\":");
    out_jstr(f, c->abstract_name);
  }
  if (c->tcp_port >= 0)
    out_fmt(f, ",\"tcp_port\":%d", c->tcp_port);
  if (c->leaked_fd >= 0)
    out_fmt(f, ",\"leaked_fd\":%d", c->leaked_fd);
  out_fmt(f, ",\"host_pid\":%d}}", (int)getpid());
}

/* Whether the host's start lists the sandbox this keeper makes among the
 * ones it accepts ("sandboxes"): the host refuses a weaker one too, but
 * nothing of it must run meanwhile. */
static int host_allows(far *f, const start_msg *m) {
  long list = rlm_json_get(m->s, m->t, m->root, "sandboxes");
  if (list < 0 || m->t[list].type != RLM_JT_ARRAY)
    return 0;
  long k = list + 1;
  for (size_t i = 0; i < m->t[list].count; i++) {
    char name[32];
    if (rlm_json_string(m->s, m->t, k, name, sizeof(name)) > 0 &&
        strcmp(name, far_mode_name(f->mode)) == 0)
      return 1;
    k = (long)m->t[k].next;
  }
  return 0;
}

/* The bubblewrap sandbox: rlm.core's plan (plan.c), as the local backend
 * makes it. 1, or 0 with err. */
static int bubblewrap_plan(far *f, const far_probe *probe,
                           const char *const *ro, size_t n_ro,
                           uint64_t wd_bytes, rlm_driver_opts *o, char *err,
                           size_t errlen) {
  char driver_py[PATH_MAX + 32];
  snprintf(driver_py, sizeof(driver_py), "%s/repl_driver.py", f->driver_dir);
  rlm_sandbox_spec spec;
  memset(&spec, 0, sizeof(spec));
  spec.bwrap = f->bwrap;
  spec.python = probe->executable;
  spec.driver = driver_py;
  spec.driver_fd = -1;
  spec.zip_fd = CHILD_ZIP_FD;
  spec.ro = (const char *const *)ro;
  spec.n_ro = n_ro;
  spec.seccomp_fd = CHILD_SECCOMP_FD;
  spec.workdir_bytes = wd_bytes;
  spawn_plan *plan = plan_new(&spec);
  int ro_ctx = -1;
  char path[64];
  if (plan != NULL) {
    plan->as_root = geteuid() == 0;
    plan->spec.driver_compiled = 1;
    plan->zip = blob_new(probe->zip, probe->zip_len, 1);
    plan->entry = blob_new(probe->pyc, probe->pyc_len, 1);
    /* The context's memfd: empty now, written and sealed when the context
     * comes; the driver gets a read-only open of its own. */
    f->ctx_fd = rlm_context_open();
    if (f->ctx_fd >= 0) {
      snprintf(path, sizeof(path), "/proc/self/fd/%d", f->ctx_fd);
      do
        ro_ctx = open(path, O_RDONLY | O_CLOEXEC);
      while (ro_ctx < 0 && errno == EINTR);
    }
    plan->late_ro = ro_ctx;
  }
  int saved = errno;
  if (plan == NULL || plan->zip == NULL || plan->entry == NULL || ro_ctx < 0) {
    if (plan != NULL)
      plan_free(plan);
    snprintf(err, errlen, "%s", strerror(saved));
    return 0;
  }
  o->prepare = plan_prepare;
  o->prepare_arg = plan; /* the driver's from here, even on failure */
  o->prepare_free = plan_free;
  o->env = sandbox_env;
  return 1;
}

/* The fallback (seccomp_only, driver.h): the interpreter itself, run from
 * a directory of the keeper's (far_session_dir) with the driver's files,
 * the context's memfd at 4 (3: /dev/null, which the driver closes). The
 * keeper must be able to give it a uid of its own (root), which main
 * checked before it said "seccomp". 1, or 0 with err. */
static int seccomp_plan(far *f, const far_probe *probe, rlm_driver_opts *o,
                        int inherit[2], char **argv, char **env, char *err,
                        size_t errlen) {
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
  argv[1] = "-I";
  argv[2] = "-S";
  argv[3] = "-B";
  argv[4] = entry;
  argv[5] = NULL;
  env[0] = "PATH=/usr/bin:/bin";
  env[1] = "LANG=C.UTF-8";
  env[2] = "PYTHONUTF8=1";
  env[3] = f->home_env;
  env[4] = NULL;
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

static void start(far *f, const start_msg *m) {
  int64_t protocol, max_bytes, max_rss, interval, wd_bytes, wd_files, uid_first,
      uid_count;
  int cgroup, bind_pth;
  if (field_int(m, "protocol", 0, INT64_MAX, &protocol) != 0 ||
      protocol != RLM_KEEPER_PROTOCOL) {
    fail(f, "the host speaks keeper protocol %s, rlm-keeper %d",
         rlm_json_get(m->s, m->t, m->root, "protocol") >= 0 ? "another"
                                                            : "none",
         RLM_KEEPER_PROTOCOL);
    return;
  }
  long mods = rlm_json_get(m->s, m->t, m->root, "modules");
  long allowed = rlm_json_get(m->s, m->t, m->root, "allowed_modules");
  long guard = rlm_json_get(m->s, m->t, m->root, "guardrails");
  long int_bits = rlm_json_get(m->s, m->t, m->root, "int_bits");
  long values = rlm_json_get(m->s, m->t, m->root, "max_message_values");
  long rlimits = rlm_json_get(m->s, m->t, m->root, "rlimits");
  if (field_int(m, "max_message_bytes", 1024, (int64_t)1 << 40, &max_bytes) ||
      field_int(m, "max_rss_bytes", 0, INT64_MAX, &max_rss) ||
      field_int(m, "rss_poll_interval_ms", 1, 60000, &interval) ||
      field_int(m, "workdir_max_bytes", 0, INT64_MAX, &wd_bytes) ||
      field_int(m, "workdir_max_files", 0, INT64_MAX, &wd_files) ||
      field_int(m, "uid_first", 1, UINT32_MAX, &uid_first) ||
      field_int(m, "uid_count", 1, UINT32_MAX, &uid_count) ||
      field_bool(m, "memory_cgroup", &cgroup) ||
      field_bool(m, "bind_pth_paths", &bind_pth) || mods < 0 ||
      m->t[mods].type != RLM_JT_ARRAY || m->t[mods].count > MAX_MODULES ||
      allowed < 0 ||
      (m->t[allowed].type != RLM_JT_ARRAY &&
       !(m->t[allowed].type == RLM_JT_OBJECT && m->t[allowed].count == 0)) ||
      guard < 0 ||
      (m->t[guard].type != RLM_JT_TRUE && m->t[guard].type != RLM_JT_FALSE) ||
      int_bits < 0 || m->t[int_bits].type != RLM_JT_NUMBER || values < 0 ||
      m->t[values].type != RLM_JT_NUMBER || read_rlimits(f, m, rlimits) != 0) {
    fail(f, "the host's start message is missing a field or has a wrong one");
    return;
  }
  f->max_line = (size_t)max_bytes;
  f->line_max = (size_t)max_bytes + 1;
  if (f->mode == FAR_NONE) {
    fail(f,
         "rlm-keeper can make no sandbox here (%s), and the REPL never "
         "runs unsandboxed",
         f->mode_why);
    return;
  }
  if (!host_allows(f, m)) {
    fail(f, "the host allows the sandboxes %s; rlm-keeper here makes %s (%s)",
         "it lists in its start", far_mode_name(f->mode), f->mode_why);
    return;
  }
  /* The modules the probe imports, so that their libraries are bound. */
  static char names[MAX_MODULES][128];
  const char *modules[MAX_MODULES];
  long k = mods + 1;
  for (size_t i = 0; i < m->t[mods].count; i++) {
    if (rlm_json_string(m->s, m->t, k, names[i], sizeof(names[i])) <= 0 ||
        names[i][0] == '-') {
      fail(f, "the host's start message names a module that is not one");
      return;
    }
    modules[i] = names[i];
    k = (long)m->t[k].next;
  }
  far_probe probe;
  char err[768];
  if (far_probe_get(&probe, f->python, f->driver_dir, modules, m->t[mods].count,
                    f->cache_dir, err, sizeof(err)) != 0) {
    fail(f, "%s", err);
    return;
  }
  /* What the sandbox binds read-only: as rlm.sandbox.bwrap's readonly_paths. */
  size_t n_ro =
      probe.n_sys_path + (bind_pth ? probe.n_pth_paths : 0) + probe.n_files + 2;
  const char **ro = n_ro <= MAX_RO ? calloc(n_ro + 1, sizeof(*ro)) : NULL;
  if (ro == NULL) {
    far_probe_free(&probe);
    fail(f, "too many paths to bind");
    return;
  }
  size_t at = 0;
  for (size_t i = 0; i < probe.n_sys_path; i++)
    ro[at++] = probe.sys_path[i];
  for (size_t i = 0; bind_pth && i < probe.n_pth_paths; i++)
    ro[at++] = probe.pth_paths[i];
  for (size_t i = 0; i < probe.n_files; i++)
    ro[at++] = probe.files[i];
  if (probe.interpreter != NULL)
    ro[at++] = probe.interpreter;
  ro[at++] = "/etc/ld.so.cache";
  n_ro = at;

  /* configure and self_test, sent at once after the spawn: they wait in
   * the pipe while bubblewrap and the interpreter start (docs/protocol.md,
   * Start-up). Made here, while the probe's strings and the bound paths
   * are at hand, at the end of the output buffer (whose pending bytes
   * may move to its start meanwhile: out_room), then taken out of it. */
  size_t mark = f->out_len - f->out_off;
  out_str(f, "{\"type\":\"configure\",\"max_message_bytes\":");
  out_fmt(f, "%lld", (long long)max_bytes);
  out_str(f, ",\"max_message_values\":");
  out_span(f, m, values);
  out_str(f, ",\"guardrails\":");
  out_span(f, m, guard);
  out_str(f, ",\"int_bits\":");
  out_span(f, m, int_bits);
  if (m->t[allowed].count > 0) {
    out_str(f, ",\"allowed_modules\":");
    out_span(f, m, allowed);
  }
  out_str(f, ",\"sys_path\":[");
  for (size_t i = 0; i < probe.n_sys_path; i++) {
    if (i > 0)
      out_str(f, ",");
    out_jstr(f, probe.sys_path[i]);
  }
  for (size_t i = 0; bind_pth && i < probe.n_pth_paths; i++) {
    out_str(f, ",");
    out_jstr(f, probe.pth_paths[i]);
  }
  out_str(f, "],\"rlimits\":");
  out_span(f, m, rlimits);
  out_str(f, "}");
  size_t cfg_len = f->out_len - f->out_off - mark;
  /* The canaries: before the spawn, so that the leaked descriptor is there
   * to leak. */
  const char *tmp = getenv("TMPDIR");
  rlm_canaries_plant(&f->canaries, getenv("HOME"),
                     tmp != NULL && tmp[0] == '/' ? tmp : "/tmp");
  f->planted = 1;
  self_test_line(f, ro, n_ro);
  size_t from = f->out_off + mark, lines_len = f->out_len - from;
  char *lines = f->out_broken ? NULL : malloc(lines_len);
  if (lines != NULL)
    memcpy(lines, f->out + from, lines_len);
  f->out_len = from;

  rlm_driver_opts o;
  memset(&o, 0, sizeof(o));
  int inherit[2] = {-1, -1};
  char *argv[6] = {NULL};
  char *env[5] = {NULL};
  int ok =
      f->mode == FAR_SECCOMP
          ? seccomp_plan(f, &probe, &o, inherit, argv, env, err, sizeof(err))
          : bubblewrap_plan(f, &probe, ro, n_ro, (uint64_t)wd_bytes, &o, err,
                            sizeof(err));
  free(ro); /* the plan copied it */
  far_probe_free(&probe);
  if (!ok || lines == NULL) {
    if (o.prepare_arg != NULL)
      plan_free(o.prepare_arg);
    for (int i = 0; i < 2; i++)
      if (inherit[i] >= 0)
        close(inherit[i]);
    free(lines);
    fail(f, "preparing the sandbox: %s", ok ? "out of memory" : err);
    return;
  }
  o.claim_uid = geteuid() == 0;
  o.uid_first = (uint32_t)uid_first;
  o.uid_count = (uint32_t)uid_count;
  o.max_line = f->max_line;
  o.max_rss = (uint64_t)max_rss;
  o.max_files = (uint64_t)wd_files;
  o.rss_interval_ms = (unsigned)interval;
  o.cgroup = cgroup;
  f->d = rlm_driver_start(&o, err, sizeof(err));
  for (int i = 0; i < 2; i++)
    if (inherit[i] >= 0)
      close(inherit[i]); /* the driver has its copies */
  if (f->d == NULL) {
    free(lines);
    fail(f, "starting the sandbox: %s", err);
    return;
  }
  f->started = 1;
  int rc = rlm_driver_send(f->d, lines, cfg_len) != 0 ||
           rlm_driver_send(f->d, lines + cfg_len, lines_len - cfg_len) != 0;
  free(lines);
  if (rc != 0)
    fail(f, "the driver took no input");
}

/* --- the host's messages ------------------------------------------------ */

/* The context's bytes, as they come: into the memfd, sealed at the end. */
static void context_bytes(far *f, const char *p, size_t n) {
  if (f->ctx_state == 1 && f->ctx_fd >= 0 &&
      rlm_context_append(f->ctx_fd, p, n) != 0) {
    snprintf(f->ctx_err, sizeof(f->ctx_err), "write: %s", strerror(errno));
    f->ctx_state = -1;
  }
  f->raw_left -= n;
  if (f->raw_left == 0 && f->ctx_state == 1) {
    if (rlm_context_seal(f->ctx_fd) != 0) {
      snprintf(f->ctx_err, sizeof(f->ctx_err), "seal: %s", strerror(errno));
      f->ctx_state = -1;
    } else {
      f->ctx_state = 2;
    }
    close(f->ctx_fd); /* written once: the driver's read-only open remains */
    f->ctx_fd = -1;
  }
}

/* The host's load_context, on its way to the driver: the rlimits it asks
 * for are what the check after ready reads back. */
static void note_load(far *f, const char *line, size_t len) {
  rlm_jtok t[MSG_TOKENS];
  start_msg m = {.s = line, .t = t, .root = 0};
  long n = rlm_json_parse(line, len, t, MSG_TOKENS, 64);
  char type[32];
  if (n < 1 || t[0].type != RLM_JT_OBJECT ||
      rlm_json_string(line, t, rlm_json_get(line, t, 0, "type"), type,
                      sizeof(type)) < 0 ||
      strcmp(type, "load_context") != 0)
    return; /* not load_context: no check is armed, the host fails closed */
  if (read_rlimits(f, &m, rlm_json_get(line, t, 0, "rlimits")) == 0)
    f->load_seen = 1;
}

static void keeper_message(far *f, const char *s, size_t len) {
  rlm_jtok t[MSG_TOKENS];
  long n = rlm_json_parse(s, len, t, MSG_TOKENS, 16);
  char type[32];
  if (n < 1 || t[0].type != RLM_JT_OBJECT ||
      rlm_json_string(s, t, rlm_json_get(s, t, 0, "type"), type, sizeof(type)) <
          0) {
    fail(f, "the host sent a keeper message that is not a JSON object with "
            "a type");
    return;
  }
  start_msg m = {.s = s, .t = t, .root = 0};
  int64_t v;
  if (strcmp(type, "ping") == 0) {
    /* The host's heartbeat: any byte back will do, and one pong waiting
     * is enough (a host that is not reading has bytes to read already). */
    if (f->out_len - f->out_off < OUT_HIGH)
      out_str(f, "K{\"type\":\"pong\"}\n");
  } else if (strcmp(type, "start") == 0 && !f->started) {
    start(f, &m);
  } else if (strcmp(type, "context") == 0 && f->started && f->ctx_state == 0 &&
             field_int(&m, "bytes", 0, INT64_MAX, &v) == 0) {
    f->ctx_state = 1;
    f->raw_left = (uint64_t)v;
    if (v == 0)
      context_bytes(f, "", 0);
  } else if (strcmp(type, "interrupt") == 0 && f->d != NULL) {
    int pid = rlm_driver_interpreter_pid(f->d);
    if (pid > 0)
      (void)kill(pid, SIGINT);
  } else if (strcmp(type, "deadline") == 0 && f->d != NULL &&
             field_int(&m, "ms", 0, INT64_MAX, &v) == 0) {
    rlm_driver_set_deadline(f->d, (uint64_t)v);
  } else {
    fail(f,
         "the host sent a keeper message rlm-keeper does not take here "
         "(%s)",
         type);
  }
}

static void host_line(far *f, const char *s, size_t len) {
  if (len > 0 && s[0] == 'D' && f->d != NULL) {
    if (f->ctx_state != 0 && !f->load_seen)
      note_load(f, s + 1, len - 1);
    (void)rlm_driver_send(f->d, s + 1, len - 1); /* a driver gone says so */
  } else if (len > 0 && s[0] == 'D' && f->started) {
    /* the driver has ended: its end is on its way to the host */
  } else if (len > 0 && s[0] == 'K') {
    keeper_message(f, s + 1, len - 1);
  } else {
    fail(f, "the host sent a line with no channel rlm-keeper knows");
  }
}

/* Everything read from stdin so far, in order: lines, and the context's
 * raw bytes after its message. */
static void host_input(far *f) {
  while (f->chunk_at < f->chunk_end && !f->ended) {
    char *p = f->chunk + f->chunk_at;
    size_t avail = f->chunk_end - f->chunk_at;
    if (f->raw_left > 0) {
      size_t n = avail < f->raw_left ? avail : (size_t)f->raw_left;
      context_bytes(f, p, n);
      f->chunk_at += n;
      continue;
    }
    char *nl = memchr(p, '\n', avail);
    size_t take = nl ? (size_t)(nl - p) : avail;
    if (f->line_len + take > f->line_max) {
      fail(f, "the host sent a line longer than max_message_bytes + 1 (%zu)",
           f->line_max);
      return;
    }
    if (f->line_len + take > f->line_cap) {
      size_t cap = f->line_cap ? f->line_cap : 4096;
      while (cap < f->line_len + take)
        cap *= 2;
      char *more = realloc(f->line, cap);
      if (more == NULL) {
        fail(f, "out of memory");
        return;
      }
      f->line = more;
      f->line_cap = cap;
    }
    memcpy(f->line + f->line_len, p, take);
    f->line_len += take;
    f->chunk_at += take;
    if (nl != NULL) {
      f->chunk_at++;
      size_t len = f->line_len;
      f->line_len = 0;
      host_line(f, f->line, len);
      if (f->line_cap > (1u << 20) && f->line_len == 0) {
        free(f->line); /* a large line is not held on to */
        f->line = NULL;
        f->line_cap = 0;
      }
    }
  }
}

/* --- the driver's events ------------------------------------------------ */

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

static void driver_event(far *f, rlm_event *ev) {
  uint64_t peak = 0, kills;
  switch (ev->kind) {
  case RLM_EV_LINE:
    f->lines_seen++;
    if (f->lines_seen == 1) {
      adopt(f);
      rlm_canaries_close_leaked(&f->canaries);
    }
    /* The driver's fourth line answers load_context (hello, configured,
     * self_test_result, ready: no model code runs before it). */
    if (f->lines_seen == 4 && f->load_seen) {
      ready_checks(f);
      rlm_canaries_remove(&f->canaries);
      f->planted = 0;
    }
    out_bytes(f, "D", 1);
    out_bytes(f, ev->data, ev->len);
    out_bytes(f, "\n", 1);
    rlm_driver_line_taken(f->d);
    return;
  case RLM_EV_EXIT:
    kills = rlm_driver_oom_kills(f->d, &peak);
    out_fmt(f,
            "K{\"type\":\"exit\",\"status\":%lld,\"signal\":%d,"
            "\"oom_kills\":%llu,\"peak\":%llu,\"mechanism\":",
            (long long)ev->exit_status, ev->term_signal,
            (unsigned long long)kills, (unsigned long long)peak);
    out_jstr(f, rlm_driver_memory_mechanism(f->d));
    out_str(f, ",\"stderr\":");
    out_json(f, ev->data ? ev->data : "", ev->data ? ev->len : 0);
    out_str(f, "}\n");
    break;
  case RLM_EV_TIMEOUT:
    out_str(f, "K{\"type\":\"timeout\"}\n");
    break;
  case RLM_EV_MEMORY:
    out_fmt(f, "K{\"type\":\"memory\",\"peak\":%llu}\n",
            (unsigned long long)ev->peak_bytes);
    break;
  case RLM_EV_FILES:
    out_fmt(f, "K{\"type\":\"files\",\"files\":%llu,\"peak\":%llu}\n",
            (unsigned long long)ev->peak_bytes,
            (unsigned long long)rlm_driver_peak_rss(f->d));
    break;
  case RLM_EV_OVERFLOW:
    out_str(f, "K{\"type\":\"overflow\"}\n");
    break;
  case RLM_EV_FAILED:
  case RLM_EV_SILENT: /* a stream's alone: the driver here is not one */
    say_failed(f, ev->data ? ev->data : "the sandbox did not start");
    break;
  }
  /* Every other event ends the driver, and the keeper with it. */
  f->ended = 1;
  end_driver(f);
}

/* --- the loop ----------------------------------------------------------- */

/* Where the driver's files are: --driver-dir, RLM_DRIVER_DIR (each, when
 * given, the only place looked at), else beside the binary (a checkout's
 * python/, an install's share/rlm-keeper/), else where the build put them
 * (RLM_KEEPER_SHARE: the rock's, whose binary luarocks deploys apart). */
#ifdef RLM_KEEPER_SHARE
#define SHARE_DIR RLM_KEEPER_SHARE
#else
#define SHARE_DIR NULL
#endif
static int find_driver_dir(far *f, const char *given) {
  const char *candidates[3] = {given, getenv("RLM_DRIVER_DIR"), NULL};
  char exe[PATH_MAX], tries[2][PATH_MAX + 32];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash != NULL)
      *slash = '\0';
    /* A checkout (build/rlm-keeper, python/), or an install
     * (bin/rlm-keeper, share/rlm-keeper/). */
    snprintf(tries[0], sizeof(tries[0]), "%s/../python", exe);
    snprintf(tries[1], sizeof(tries[1]), "%s/../share/rlm-keeper", exe);
  }
  for (int i = 0; i < 5; i++) {
    const char *dir = i < 2   ? candidates[i]
                      : i < 4 ? (n > 0 ? tries[i - 2] : NULL)
                              : SHARE_DIR;
    char probe[PATH_MAX + 32];
    if (dir == NULL || dir[0] == '\0')
      continue;
    if (snprintf(probe, sizeof(probe), "%s/repl_driver.py", dir) <
            (int)sizeof(probe) &&
        access(probe, R_OK) == 0 && realpath(dir, f->driver_dir) != NULL)
      return 0;
    if (i < 2)
      return -1; /* named, and not there: no guessing past it */
  }
  return -1;
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

static void usage(void) {
  fputs("usage: rlm-keeper [--python PATH] [--bwrap PATH] [--driver-dir DIR] "
        "[--cache DIR]\n"
        "                  [--sandbox auto|bubblewrap|seccomp]\n"
        "       rlm-keeper --probe [--python PATH] [--driver-dir DIR] "
        "--cache DIR MODULE...\n"
        "Runs one rlm session's sandbox, speaking the stream protocol on "
        "stdin and stdout\n(docs/protocol.md); with --probe, writes the "
        "interpreter's report into the cache. --sandbox: auto (the default)\n"
        "makes bubblewrap's sandbox where it can run, else (as root) the "
        "seccomp\nfallback; the hello says which (docs/security.md).\n",
        stderr);
}

int main(int argc, char **argv) {
  static far f;
  memset(&f, 0, sizeof(f));
  f.ctx_fd = -1;
  f.python_name = "python3";
  f.bwrap_name = "bwrap";
  f.cache_dir = getenv("RLM_KEEPER_CACHE");
  f.line_max = FIRST_LINE_MAX;
  const char *driver_dir = NULL, *sandbox = "auto";
  int probe_only = 0, i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--probe") == 0)
      probe_only = 1;
    else if (i + 1 < argc && strcmp(a, "--python") == 0)
      f.python_name = argv[++i];
    else if (i + 1 < argc && strcmp(a, "--bwrap") == 0)
      f.bwrap_name = argv[++i];
    else if (i + 1 < argc && strcmp(a, "--driver-dir") == 0)
      driver_dir = argv[++i];
    else if (i + 1 < argc && strcmp(a, "--cache") == 0)
      f.cache_dir = argv[++i];
    else if (i + 1 < argc && strcmp(a, "--sandbox") == 0)
      sandbox = argv[++i];
    else if (strcmp(a, "--help") == 0) {
      usage();
      return 0;
    } else if (a[0] == '-' || !probe_only) {
      usage();
      return 2;
    } else
      break;
  }
  if (f.cache_dir != NULL && f.cache_dir[0] == '\0')
    f.cache_dir = NULL;
  if (strcmp(sandbox, "auto") != 0 && strcmp(sandbox, "bubblewrap") != 0 &&
      strcmp(sandbox, "seccomp") != 0) {
    usage();
    return 2;
  }
  (void)signal(SIGPIPE, SIG_IGN); /* a host gone is an EPIPE */
  int found_python =
      rlm_find_program(f.python_name, f.python, sizeof(f.python)) == 0;
  f.have_bwrap = rlm_find_program(f.bwrap_name, f.bwrap, sizeof(f.bwrap)) == 0;
  if (find_driver_dir(&f, driver_dir) != 0) {
    fprintf(stderr, "rlm-keeper: the driver (repl_driver.py) was not found: "
                    "give --driver-dir or RLM_DRIVER_DIR\n");
    return 2;
  }
  if (probe_only) {
    far_probe p;
    char err[768];
    if (f.cache_dir == NULL || !found_python) {
      fprintf(stderr, "rlm-keeper --probe: %s\n",
              f.cache_dir ? "the interpreter was not found" : "give --cache");
      return 2;
    }
    if (far_probe_get(&p, f.python, f.driver_dir, (const char *const *)argv + i,
                      (size_t)(argc - i), f.cache_dir, err, sizeof(err)) != 0) {
      fprintf(stderr, "rlm-keeper --probe: %s\n", err);
      return 1;
    }
    printf("%s %s\n", p.executable, p.version);
    far_probe_free(&p);
    return 0;
  }
  choose_mode(&f, sandbox, found_python);
  /* Nothing of this process's memory for a process of the same uid to read
   * through /proc (its mem, its environ): the REPL runs as another uid,
   * this closes what a slip there would open. */
  (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  (void)fcntl(1, F_SETFL, fcntl(1, F_GETFL) | O_NONBLOCK);
  /* The hello: who speaks, and which sandbox it will make, and why. */
  out_fmt(&f,
          "K{\"type\":\"hello\",\"keeper\":\"%s\",\"protocol\":%d,"
          "\"sandbox\":\"%s\",\"pid\":%d,\"detail\":",
          RLM_KEEPER_VERSION, RLM_KEEPER_PROTOCOL, far_mode_name(f.mode),
          (int)getpid());
  out_jstr(&f, f.mode_why);
  out_str(&f, "}\n");
  if (!found_python)
    fail(&f, "the interpreter %s was not found on the far side", f.python_name);
  while (!f.in_eof && !f.out_broken) {
    struct pollfd p[3];
    int np = 0, in_at = -1, out_at = -1, drv_at = -1;
    if (!f.ended) {
      in_at = np;
      p[np++] = (struct pollfd){.fd = 0, .events = POLLIN};
    }
    if (f.out_off < f.out_len) {
      out_at = np;
      p[np++] = (struct pollfd){.fd = 1, .events = POLLOUT};
    }
    int timeout = -1;
    if (f.d != NULL && f.out_len - f.out_off < OUT_HIGH) {
      drv_at = np;
      p[np++] =
          (struct pollfd){.fd = rlm_driver_backend_fd(f.d), .events = POLLIN};
      timeout = rlm_driver_backend_timeout(f.d);
    }
    if (f.ended && out_at < 0)
      break; /* said all it had to say */
    if (np == 0)
      break;
    int n = poll(p, (nfds_t)np, timeout);
    if (n < 0 && errno != EINTR)
      break;
    if (out_at >= 0 && (p[out_at].revents & (POLLOUT | POLLERR | POLLHUP)) &&
        flush_some(&f) != 0)
      break; /* the host is gone */
    if (in_at >= 0 && (p[in_at].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t r = read(0, f.chunk, sizeof(f.chunk));
      if (r > 0) {
        f.chunk_at = 0;
        f.chunk_end = (size_t)r;
        host_input(&f);
      } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
        f.in_eof = 1; /* the host is done: everything goes */
      }
    }
    if (f.d != NULL && drv_at >= 0) {
      rlm_driver_wait(f.d, 0, 0, 0);
      rlm_event *ev;
      while (f.d != NULL && f.out_len - f.out_off < OUT_HIGH &&
             (ev = rlm_driver_take(f.d)) != NULL) {
        driver_event(&f, ev);
        rlm_event_free(ev);
      }
    }
    if (f.out_off < f.out_len && flush_some(&f) != 0)
      break;
  }
  end_driver(&f);
  flush_all(&f, 1000);
  if (f.session_dir[0] != '\0') {
    /* The fallback's directory goes once the REPL is reaped (its teardown
     * on the driver's thread), whatever it left there. */
    for (int waited = 0; rlm_driver_teardowns() > 0 && waited < 5000; waited++)
      (void)poll(NULL, 0, 1);
    (void)far_remove_tree(f.session_dir);
  }
  free(f.line);
  free(f.out);
  return 0; /* driver.c's exit hook waits for the teardowns */
}
