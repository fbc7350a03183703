/* driver.c: the driver process on its own libuv loop (driver.h), and here
 * its start: the loop, its handles and the pipes made on the caller's
 * thread, the keeper thread started (keeper.c), and on the keeper's report
 * the exit's watch and the reads begun (on_started); then what the driver
 * tells of its process. The read side and its events are driver_read.c's,
 * the write side (lines, raw bytes, a stream's heartbeat) driver_write.c's,
 * the process's end (kill, exit, deadline, close) driver_end.c's.
 *
 * The process is started with posix_spawn (or, when it must drop to another
 * uid, fork and exec), not uv_spawn, and watched through a pidfd: the child
 * closes every descriptor but its three pipes and the ones it is handed
 * (the seccomp filter, the context, the driver's text) before its first
 * exec, whatever the host leaked, and libuv never installs its process-wide
 * SIGCHLD handler, which would otherwise change how the host's own children
 * (Neovim's, nginx's) are reaped. */
#define _GNU_SOURCE
#include "driver_impl.h"

static void init_timer(rlm_driver *d, uv_timer_t *t) {
  uv_timer_init(&d->loop, t); /* cannot fail on an initialised loop */
  t->data = d;
  d->handles++;
}

static int init_pipe(rlm_driver *d, uv_pipe_t *p) {
  int rc = uv_pipe_init(&d->loop, p, 0);
  if (rc == 0) {
    p->data = d;
    d->handles++;
  }
  return rc;
}

/* The keeper's report, on the host's loop: the process runs (watch it, read
 * it), or it could not start (an event says why). */
static void on_started(uv_async_t *a) {
  rlm_driver *d = a->data;
  int state = atomic_load(&d->start_state);
  if (state == START_PENDING || d->start_seen)
    return;
  d->start_seen = 1;
  uv_unref((uv_handle_t *)a);
  if (state == START_FAILED) {
    d->start_failed = 1;
    uv_timer_stop(&d->deadline);
    if (!d->terminal_queued) {
      rlm_event *ev = event_new(RLM_EV_FAILED);
      if (ev != NULL && (ev->data = strdup(d->start_err)) != NULL)
        ev->len = strlen(ev->data);
      queue_event(d, ev);
      d->terminal_queued = 1;
    }
    return;
  }
  d->spawned = 1;
  int e = uv_poll_init(&d->loop, &d->exit_watch, d->pidfd);
  if (e == 0) {
    d->exit_watch.data = d;
    d->handles++;
    e = uv_poll_start(&d->exit_watch, UV_READABLE, on_process_exit);
  }
  if (e != 0) {
    /* Unwatched, it must not run: killed now, reaped by the keeper. */
    kill_launcher(d);
    d->killed = 1;
    snprintf(d->start_err, sizeof(d->start_err), "watching the driver: %s",
             uv_strerror(e));
    terminate(d, RLM_EV_FAILED);
    if (d->tail != NULL && d->tail->kind == RLM_EV_FAILED &&
        (d->tail->data = strdup(d->start_err)) != NULL)
      d->tail->len = strlen(d->tail->data);
    return;
  }
  if (!d->terminal_queued) {
    uv_read_start((uv_stream_t *)&d->out, alloc_out, on_read_out);
    d->reading = 1;
  }
  if (uv_read_start((uv_stream_t *)&d->err, alloc_err, on_read_err) != 0)
    d->err_eof = 1; /* unread: its end is not waited for */
  if (d->kill_pending) {
    d->kill_pending = 0;
    kill_sandbox(d);
  }
}

/* A copy of a NULL-terminated list of strings (n: how many, when it is not
 * terminated), in one block. */
static char **copy_strings(char *const *v, size_t n) {
  if (v == NULL)
    return NULL;
  if (n == (size_t)-1)
    for (n = 0; v[n] != NULL; n++)
      ;
  size_t bytes = (n + 1) * sizeof(char *);
  for (size_t i = 0; i < n; i++)
    bytes += strlen(v[i]) + 1;
  char **out = malloc(bytes);
  if (out == NULL)
    return NULL;
  char *p = (char *)(out + n + 1);
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(v[i]) + 1;
    out[i] = memcpy(p, v[i], len);
    p += len;
  }
  out[n] = NULL;
  return out;
}

/* Keeps this library loaded for the life of the process: the keeper may
 * outlive the Lua state, which unloads it on close. A program (rlm-keeper,
 * RLM_PROGRAM) is never unloaded. */
static int pin_library(void) {
#ifdef RLM_PROGRAM
  return 0;
#endif
  Dl_info self;
  return dladdr((void *)keeper_main, &self) != 0 && self.dli_fname != NULL &&
                 dlopen(self.dli_fname,
                        RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) != NULL
             ? 0
             : -1;
}

static rlm_driver *driver_start(const rlm_driver_opts *o, char *err,
                                size_t errlen, int *took);

rlm_driver *rlm_driver_start(const rlm_driver_opts *o, char *err,
                             size_t errlen) {
  int took = 0;
  rlm_driver *d = driver_start(o, err, errlen, &took);
  /* Once made, the driver owns prepare_arg (free_driver frees it). */
  if (d == NULL && !took && o->prepare_arg != NULL)
    o->prepare_free(o->prepare_arg);
  return d;
}

static rlm_driver *driver_start(const rlm_driver_opts *o, char *err,
                                size_t errlen, int *took) {
  /* libuv aborts the process when its loop cannot get its descriptors:
   * make sure they are there first. */
  int free_fds = rlm_fd_headroom(RLM_DRIVER_FDS);
  if (free_fds < RLM_DRIVER_FDS) {
    struct rlimit rl;
    long soft = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (long)rl.rlim_cur : -1;
    snprintf(err, errlen,
             "too few free file descriptors (EMFILE): %d free of the %d a "
             "driver needs (RLIMIT_NOFILE %ld)",
             free_fds, RLM_DRIVER_FDS, soft);
    errno = EMFILE;
    return NULL;
  }
  if (o->n_inherit > MAX_INHERIT) {
    snprintf(err, errlen, "too many descriptors for the child");
    errno = EINVAL;
    return NULL;
  }
  (void)pthread_once(&teardowns_once, register_exit_wait);
  if (pin_library() != 0) {
    snprintf(err, errlen, "keeping rlm.core loaded: %s", dlerror());
    return NULL;
  }
  rlm_driver *d = calloc(1, sizeof(*d));
  if (d == NULL) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  d->prepare = o->prepare;
  d->prepare_arg = o->prepare_arg;
  d->prepare_free = o->prepare_free;
  *took = 1;
  d->uid_lock = -1;
  d->pidfd = -1;
  d->wake_fd = -1;
  d->in_reader = -1;
  d->in_hold = -1;
  d->uid = (uint32_t)getuid();
  for (size_t i = 0; i < sizeof(d->child_fds) / sizeof(int); i++)
    d->child_fds[i] = -1;
  d->argv = copy_strings(o->argv, (size_t)-1);
  d->env = copy_strings(o->env, (size_t)-1);
  d->stage = copy_strings(o->stage, o->n_stage);
  d->n_stage = o->n_stage;
  if ((o->prepare == NULL && d->argv == NULL) ||
      (o->env != NULL && d->env == NULL) ||
      (o->n_stage > 0 && d->stage == NULL)) {
    snprintf(err, errlen, "out of memory");
    free_driver(d);
    return NULL;
  }
  d->context = o->context;
  d->context_len = o->context_len;
  d->context_at = o->context != NULL ? o->context_at : -1;
  if (d->context_at < 0)
    atomic_store(&d->ctx_done, 1);
  d->claim_uid = o->claim_uid;
  d->uid_first = o->uid_first;
  d->uid_count = o->uid_count;
  d->want_cgroup = o->cgroup;
  d->framer.max = o->max_line;
  d->max_rss = o->max_rss;
  d->max_files = o->max_files;
  d->rss_interval_ms = o->rss_interval_ms ? o->rss_interval_ms : 50;
  d->channel = o->channel;
  d->seccomp_only = o->seccomp_only;
  if (o->seccomp_only &&
      (!o->claim_uid || o->workdir == NULL || o->workdir[0] != '/' ||
       (d->workdir = strdup(o->workdir)) == NULL)) {
    snprintf(err, errlen,
             "a seccomp-only sandbox needs a uid of its own and "
             "an absolute workdir");
    free_driver(d);
    errno = EINVAL;
    return NULL;
  }

  int rc = uv_loop_init(&d->loop);
  if (rc != 0) {
    snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(rc));
    free_driver(d);
    return NULL;
  }
  init_timer(d, &d->deadline);
  init_timer(d, &d->wait);
  init_timer(d, &d->grace);
  init_timer(d, &d->launcher_grace);
  init_timer(d, &d->heartbeat);
  if ((rc = init_pipe(d, &d->in)) != 0 || (rc = init_pipe(d, &d->out)) != 0 ||
      (rc = init_pipe(d, &d->err)) != 0) {
    snprintf(err, errlen, "uv_pipe_init: %s", uv_strerror(rc));
    goto failed;
  }
  if ((rc = uv_async_init(&d->loop, &d->started, on_started)) != 0) {
    snprintf(err, errlen, "uv_async_init: %s", uv_strerror(rc));
    goto failed;
  }
  d->started.data = d;
  d->handles++;
  if ((rc = uv_async_init(&d->loop, &d->sigint, on_sigint_wake)) != 0) {
    snprintf(err, errlen, "uv_async_init: %s", uv_strerror(rc));
    goto failed;
  }
  d->sigint.data = d;
  d->handles++;
  uv_unref((uv_handle_t *)&d->sigint); /* keeps no loop alive */

  /* The pipes and the handed descriptors, here: the host writes to the
   * driver's stdin at once, and the child's ends wait for the keeper. */
  int p_in[2] = {-1, -1}, p_out[2] = {-1, -1}, p_err[2] = {-1, -1};
  if (make_pipe(p_in) || make_pipe(p_out) || make_pipe(p_err)) {
    snprintf(err, errlen, "pipe2: %s", strerror(errno));
    goto failed_pipes;
  }
  int ends[3] = {p_in[0], p_out[1], p_err[1]};
  for (int i = 0; i < 3; i++) {
    struct stat st;
    if (fstat(ends[i], &st) != 0) {
      snprintf(err, errlen, "fstat: %s", strerror(errno));
      goto failed_pipes;
    }
    d->pipe_ino[i] = (unsigned long)st.st_ino;
  }
  if ((d->in_reader = fcntl(p_in[0], F_DUPFD_CLOEXEC, FD_BASE)) < 0) {
    snprintf(err, errlen, "fcntl(F_DUPFD_CLOEXEC): %s", strerror(errno));
    goto failed_pipes;
  }
  if ((rc = uv_pipe_open(&d->in, p_in[1])) == 0)
    p_in[1] = -1;
  if (rc == 0 && (rc = uv_pipe_open(&d->out, p_out[0])) == 0)
    p_out[0] = -1;
  if (rc == 0 && (rc = uv_pipe_open(&d->err, p_err[0])) == 0)
    p_err[0] = -1;
  if (rc != 0) {
    snprintf(err, errlen, "watching the driver: %s", uv_strerror(rc));
    goto failed_pipes;
  }
  d->child_fds[0] = p_in[0];
  d->child_fds[1] = p_out[1];
  d->child_fds[2] = p_err[1];
  d->nfds = 3 + (int)o->n_inherit;
  for (size_t i = 0; i < o->n_inherit; i++) {
    if ((int)i == d->context_at)
      continue; /* the keeper makes it */
    if ((d->child_fds[3 + i] =
             fcntl(o->inherit_fds[i], F_DUPFD_CLOEXEC, FD_BASE)) < 0) {
      snprintf(err, errlen, "fcntl(F_DUPFD_CLOEXEC): %s", strerror(errno));
      goto failed;
    }
  }
  if ((rc = start_keeper(d)) != 0) {
    snprintf(err, errlen, "starting the sandbox's keeper thread: %s",
             strerror(rc));
    goto failed;
  }
  return d;

failed_pipes:
  close_pair(p_in);
  close_pair(p_out);
  close_pair(p_err);
failed:
  close_loop(d);
  free_driver(d);
  return NULL;
}

int rlm_driver_pid(const rlm_driver *d) {
  return d->spawned && !d->exited ? d->pid : 0;
}

int rlm_driver_adopt(rlm_driver *d) {
  if (!d->spawned || d->cg.version == 0)
    return 0;
  int pids[256];
  size_t n = rlm_driver_tree(d, pids, 256);
  for (size_t i = 0; i < n; i++)
    if (!rlm_cgroup_holds(&d->cg, pids[i]) &&
        (rlm_cgroup_add(&d->cg, pids[i]) != 0 ||
         !rlm_cgroup_holds(&d->cg, pids[i])))
      return -1;
  return 0;
}

const char *rlm_driver_memory_mechanism(const rlm_driver *d) {
  return !d->spawned          ? "poll"
         : d->cg.version == 2 ? "cgroup v2"
         : d->cg.version == 1 ? "cgroup v1"
                              : "poll";
}

uint64_t rlm_driver_oom_kills(const rlm_driver *d, uint64_t *peak) {
  *peak = 0;
  if (!d->spawned)
    return 0;
  *peak = rlm_cgroup_peak(&d->cg);
  return rlm_cgroup_oom_kills(&d->cg);
}

int rlm_driver_alive(const rlm_driver *d) {
  return !d->start_failed && !d->kill_pending && !d->exited && !d->killed;
}

uint64_t rlm_driver_peak_rss(rlm_driver *d) {
  return atomic_load(&d->peak_rss);
}

unsigned rlm_driver_uid(const rlm_driver *d) { return d->spawned ? d->uid : 0; }

const uint64_t *rlm_driver_stamps(const rlm_driver *d) {
  return d->spawned ? d->stamps : NULL;
}

uint64_t rlm_driver_exec_ns(const rlm_driver *d) {
  return d->spawned ? d->exec_ns : 0;
}

int rlm_driver_context_done(rlm_driver *d) { return atomic_load(&d->ctx_done); }
