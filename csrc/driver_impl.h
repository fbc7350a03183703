/* driver_impl.h: what the parts of the driver share (the loop side:
 * driver.c, its start, driver_read.c, driver_write.c and driver_end.c;
 * keeper.c, the keeper thread, and keeper_watchdog.c, its memory watchdog;
 * spawn.c, the child before its exec; inspect.c, its processes as /proc
 * shows them): the driver's struct, its limits and the functions one part
 * calls in another. Included by those eight alone, in the one unit
 * (csrc/rlm.c). */
#ifndef RLM_DRIVER_IMPL_H
#define RLM_DRIVER_IMPL_H

#include "driver.h"

#include "cgroup.h"
#include "framing.h"
#include "interrupt.h"
#include "uid.h"
#include "watchdog.h"
#include "workdir.h"

#include "sandbox.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

extern char **environ;

#define READ_CHUNK 65536
#define KEEPER_STACK (256u << 10)
#define CHILD_STACK (64u << 10) /* the launcher's, until its exec */
#define STDERR_TAIL 4096
#define EXIT_GRACE_MS 200     /* after the process exits, wait this for EOF */
#define CLOSE_WAIT_MS 5000    /* bound on reaping a killed sandbox */
#define LAUNCHER_GRACE_MS 500 /* after its namespace's init was killed */
#define SANDBOX_TASKS 128     /* the cgroup's pids.max: threads, mostly */
#define MAX_WRITE_QUEUE (256u << 20)
#define MAX_INHERIT 16     /* descriptors handed to the child beyond 0..2 */
#define STREAM_END_MS 2000 /* a stream's end of input, then SIGKILL */

/* What the watchdog thread ended the sandbox for. */
enum { BREACH_NONE, BREACH_MEMORY, BREACH_FILES };

/* SIGPIPE held on the loop's thread while libuv may write to a socket
 * (driver_write.c): */
typedef struct sigpipe_hold {
  int held; /* the mask was changed: give old back */
  int had;  /* SIGPIPE was pending before: not ours to take */
  sigset_t old;
} sigpipe_hold;

struct rlm_driver {
  uint64_t exec_ns;   /* uv_hrtime() when the spawn returned: bubblewrap runs */
  uint64_t stamps[8]; /* uv_hrtime() at the keeper's steps, for bench/ */
  uv_loop_t loop;
  uv_poll_t exit_watch; /* the pidfd turns readable when the process exits */
  int pidfd;
  int in_reader; /* a read end of the driver's stdin pipe, held so that a
                  * write there never meets a pipe without a reader: no
                  * SIGPIPE, without touching the host's signal mask */
  int in_hold;   /* after close(): the driver's stdin, open until the keeper
                  * has killed the namespace's init (keeper_teardown) */
  pid_t pid;
  unsigned long pipe_ino[3]; /* the session's pipes, as /proc shows them */
  uv_pipe_t in, out, err;
  uv_timer_t deadline, wait, grace, launcher_grace, heartbeat;
  int handles; /* initialised handles not yet closed */

  unsigned spawned : 1, exited : 1, killed : 1, out_eof : 1, err_eof : 1,
      reading : 1, in_closed : 1, terminal_queued : 1, exit_queued : 1,
      wait_expired : 1, deadline_hit : 1, paused : 1, grace_due : 1,
      interrupted : 1;
  int64_t exit_status;
  int term_signal;

  rlm_framer framer;
  unsigned read_ahead_skip; /* waits left before read_ahead tries again */
  rlm_event line;           /* the line last handed out: a view into framer */
  rlm_event *head, *tail;   /* terminal events: a handful at most */

  char err_tail[STDERR_TAIL + 1];
  size_t err_len;

  uint64_t max_rss, max_files;
  unsigned rss_interval_ms;
  rlm_cgroup cg;
  int uid_lock; /* held while the sandbox's uid is ours; -1: none */

  /* The keeper thread (keeper_main): it starts the process, watches its
   * memory, and after close() kills, reaps and frees it all. It writes pid,
   * pidfd, cg, uid and uid_lock before it publishes start_state, and the
   * host reads them only after it has seen that (on_started). */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  atomic_int closing;     /* the host has called close(): stop, tear down */
  int wake_fd;            /* an eventfd close() writes: the watchdog's wait */
  int handed;             /* under mu: the host will not touch d again */
  int ctx_busy;           /* under mu: the keeper reads the caller's context */
  atomic_int ctx_done;    /* the keeper is done with the caller's context */
  atomic_int start_state; /* START_ values */
  uv_async_t started;     /* the keeper's word that the start is over */
  uv_async_t sigint;      /* SIGINT came during a wait (csrc/interrupt.h) */
  unsigned start_seen : 1, start_failed : 1, kill_pending : 1;
  char start_err[512];

  /* What the keeper starts, its own copies. */
  rlm_prepare_fn prepare; /* makes argv, stage and child_fds 3... first */
  void *prepare_arg;      /* owned; NULL once prepare has run */
  void (*prepare_free)(void *arg);
  char **argv, **env, **stage;
  size_t n_stage;
  int child_fds[3 + MAX_INHERIT]; /* the child's 0, 1, 2, 3...; owned */
  int nfds;
  /* The files behind child_fds 3... at the spawn (device, inode): what
   * bubblewrap's own processes may still hold a while after it (its
   * launcher and init close them only once the sandbox runs). */
  dev_t handed_dev[MAX_INHERIT];
  ino_t handed_ino[MAX_INHERIT];
  int n_handed;
  const char *context; /* the caller's, until ctx_done */
  size_t context_len;
  int context_at; /* the context memfd's place among child_fds; -1: none */
  int claim_uid, want_cgroup;
  uint32_t uid_first, uid_count, uid;
  unsigned run_as; /* nonzero: the child drops to this uid before exec */

  atomic_int wd_breach; /* the keeper killed the sandbox: a BREACH_ value */
  _Atomic uint64_t peak_rss;
  _Atomic uint64_t files_seen; /* in /session, at the last poll */
  char err_buf[4096];
  char channel;     /* a stream's: the byte before each line sent; 0: none */
  int lingers;      /* a stream's far side outlives its input (linger) */
  int seccomp_only; /* rlm_driver_opts' */
  char *workdir;    /* with seccomp_only: owned */
  int raw_pending;  /* raw writes (rlm_driver_send_raw) not yet done */
  size_t raw_bytes; /* their bytes, in the write queue */
  /* A stream's heartbeat (rlm_driver_heartbeat), on the loop's clock (ms). */
  char hb_ping[64];
  size_t hb_ping_len;
  unsigned hb_every, hb_lost;
  uint64_t hb_heard;   /* when the stream last sent or took bytes */
  uint64_t hb_ping_at; /* when the unanswered ping went */
  size_t hb_queued;    /* the write queue's size at the last tick */
  int hb_waiting;      /* a ping went and nothing came since */
  /* A stream over a TCP connection (rlm_driver_connect, driver_connect.c):
   * no process; out and in are the socket and a dup of it, and the
   * stream's end is the socket's. */
  int sock;                /* nonzero: such a stream */
  unsigned sock_heard : 1; /* the far side has sent bytes (its hello) */
  int sock_err;            /* the first error the socket gave (UV_E*) */
  unsigned claim_ms;       /* the claim's deadline, from the connect */
  uv_timer_t claim_timer;
  char peer[80]; /* "10.0.0.1:7070", "[fd00::1]:7070" */
  /* From a write that libuv queued (it writes with write(), which raises
   * SIGPIPE at a peer's reset) to the end of that run of the loop. */
  sigpipe_hold sock_guard;
  unsigned in_run : 1; /* within run_loop's uv_run */
};

enum { START_PENDING, START_OK, START_FAILED };

/* Descriptors the child moves into 0..2 + MAX_INHERIT are first numbered
 * above that, so that its dup2s cannot clobber one another. */
#define FD_BASE (3 + MAX_INHERIT + 1)

/* What one part calls in another (csrc/rlm.c includes them in any order).
 * The loop side's, for the keeper and for one another: the start's
 * (driver.c), */
static char **copy_strings(char *const *v, size_t n);
/* the read side's (driver_read.c): the loop run, the queue of terminal
 * events, the reads' callbacks and their stop, */
static void run_loop(rlm_driver *d, uv_run_mode mode);
static rlm_event *event_new(rlm_event_kind kind);
static void queue_event(rlm_driver *d, rlm_event *ev);
static void drop_lines(rlm_driver *d);
static void stop_reading(rlm_driver *d);
static void alloc_out(uv_handle_t *h, size_t hint, uv_buf_t *buf);
static void alloc_err(uv_handle_t *h, size_t hint, uv_buf_t *buf);
static void on_read_out(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void on_read_err(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void on_sigint_wake(uv_async_t *a);
/* the end's (driver_end.c): a handle closed, the kills, a terminal event,
 * the watchdog's breach, the exit's report and its grace, the free: */
static void close_handle(rlm_driver *d, void *h);
static void kill_launcher(rlm_driver *d);
static void kill_sandbox(rlm_driver *d);
static void terminate(rlm_driver *d, rlm_event_kind kind);
static void check_breach(rlm_driver *d);
static void maybe_queue_exit(rlm_driver *d);
static void on_grace(uv_timer_t *t);
static void on_process_exit(uv_poll_t *w, int status, int events);
static void free_driver(rlm_driver *d);
static void close_loop(rlm_driver *d);
/* a TCP stream's (driver_connect.c): its kill (the socket shut down, the
 * end reported on the next turn of the loop), its end with the first error
 * it gave (status: a UV_E* or UV_EOF), an error seen on a read or a write,
 * and its first bytes: */
static void sock_shutdown(rlm_driver *d);
static void sock_ended(rlm_driver *d, int status);
static void sock_note(rlm_driver *d, int status);
static void sock_heard(rlm_driver *d);
static void sigpipe_block(const rlm_driver *d, sigpipe_hold *h);
static void sigpipe_unblock(sigpipe_hold *h);
static void sock_guard(rlm_driver *d);
static void sock_unguard(rlm_driver *d);
/* The keeper's (keeper.c), for the loop side: */
static int start_keeper(rlm_driver *d);
static void *keeper_main(void *arg);
static void register_exit_wait(void);
static void teardowns_add(int n);
static pthread_once_t teardowns_once;
/* The keeper's watchdog (keeper_watchdog.c), for the keeper: its loop, and
 * the clock it and the teardowns read: */
static void watchdog_run(rlm_driver *d);
static uint64_t monotonic_ms(void);
/* The child's (spawn.c), for both: */
static int make_pipe(int fds[2]);
static void close_pair(int fds[2]);
static int spawn_process(rlm_driver *d, char *err, size_t errlen);

#endif
