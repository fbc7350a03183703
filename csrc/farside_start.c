/* farside_start.c: the host's start message (docs/protocol.md, "The
 * stream"): its fields read and checked, the sandboxes it accepts, the
 * probe asked for the modules it names, the driver's configure and
 * self_test made from them, the canaries planted, the sandbox planned
 * (bubblewrap's here, by rlm.core's plan.c; the fallback's in
 * farside_seccomp.c) and the driver started, with those two lines waiting
 * in its pipe. The field readers serve the host's later messages too
 * (farside_relay.c). */
#define _GNU_SOURCE
#include "canary.h"
#include "farside.h"
#include "jsonread.h"
#include "plan.h"
#include "sandbox.h"
#include "workdir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_MODULES 256
#define MAX_RO 8192

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
                           uint64_t wd_bytes, uint32_t hash_seed,
                           rlm_driver_opts *o, char **env, char *err,
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
  spec.hash_seed = hash_seed;
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
  rlm_sandbox_env(hash_seed, f->seed_env, env);
  o->env = env;
  return 1;
}

static void start(far *f, const start_msg *m) {
  int64_t protocol, max_bytes, max_rss, interval, wd_bytes, wd_files, uid_first,
      uid_count, hash_seed = 0;
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
      field_bool(m, "bind_pth_paths", &bind_pth) ||
      (rlm_json_get(m->s, m->t, m->root, "hash_seed") >= 0 &&
       field_int(m, "hash_seed", 1, UINT32_MAX, &hash_seed) != 0) ||
      mods < 0 || m->t[mods].type != RLM_JT_ARRAY ||
      m->t[mods].count > MAX_MODULES || allowed < 0 ||
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
  long linger = rlm_json_get(m->s, m->t, m->root, "linger");
  char err[768];
  if (linger >= 0 && linger_read(f, m, linger, err, sizeof(err)) != 0) {
    fail(f, "%s", err);
    return;
  }
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
  char *env[RLM_SANDBOX_ENV_MAX] = {NULL};
  int ok =
      f->mode == FAR_SECCOMP
          ? seccomp_plan(f, &probe, &o, inherit, argv, env, (uint32_t)hash_seed,
                         err, sizeof(err))
          : bubblewrap_plan(f, &probe, ro, n_ro, (uint64_t)wd_bytes,
                            (uint32_t)hash_seed, &o, env, err, sizeof(err));
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
