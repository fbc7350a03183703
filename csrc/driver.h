/* driver.h: one sandboxed driver process on a private libuv loop: its pipes,
 * line framing, step deadline, memory watchdog and kill. Nothing here calls
 * Lua: the caller polls for events and decides. */
#ifndef RLM_DRIVER_H
#define RLM_DRIVER_H

#include "sandbox.h"
#include "unit.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef enum rlm_event_kind {
  RLM_EV_LINE,     /* a complete line from the driver's stdout: a view,
                      valid until the next poll (do not free its data) */
  RLM_EV_EXIT,     /* the sandbox exited; data holds the tail of its stderr */
  RLM_EV_TIMEOUT,  /* the deadline passed; the sandbox was killed */
  RLM_EV_MEMORY,   /* the memory limit was passed; the sandbox was killed */
  RLM_EV_OVERFLOW, /* a line longer than the cap; the sandbox was killed */
  RLM_EV_FILES,    /* /session held more than max_files files; killed */
  RLM_EV_FAILED,   /* the process could not be started; data says why */
  RLM_EV_SILENT,   /* a stream's far side left a ping unanswered past its
                      heartbeat's lost_ms; the stream was killed */
} rlm_event_kind;

typedef struct rlm_event {
  struct rlm_event *next;
  rlm_event_kind kind;
  char *data; /* owned; NUL-terminated; may be NULL */
  size_t len;
  int64_t exit_status;
  int term_signal;
  uint64_t peak_bytes; /* RLM_EV_MEMORY: the peak seen; RLM_EV_FILES: the
                          files seen */
  int borrowed;        /* the driver's own (a line): rlm_event_free skips it */
} rlm_event;

typedef struct rlm_driver rlm_driver;

/* A start whose command line and descriptors are made on the keeper, off
 * the caller's thread: prepare fills `out` (argv, stage and fds), or
 * returns -1 with a message in err, which becomes the RLM_EV_FAILED
 * event. The keeper closes the fds and frees the lists after it. */
#define RLM_PREPARED_FDS 16
typedef struct rlm_prepared {
  rlm_argv argv;             /* in place of rlm_driver_opts.argv */
  rlm_argv stage;            /* in place of rlm_driver_opts.stage */
  int fds[RLM_PREPARED_FDS]; /* in place of inherit_fds; -1: none (the
                                entry at context_at is not read) */
  size_t n_fds;              /* in place of n_inherit */
} rlm_prepared;
typedef int (*rlm_prepare_fn)(void *arg, rlm_prepared *out, char *err,
                              size_t errlen);

typedef struct rlm_driver_opts {
  char *const *argv;      /* argv[0] is an absolute path; NULL with prepare */
  rlm_prepare_fn prepare; /* NULL, or what makes argv, stage and the
                             inherited fds on the keeper (see above) */
  void *prepare_arg;      /* owned by the driver from the start, even one
                             that fails: prepare_free(prepare_arg) */
  void (*prepare_free)(void *arg);
  char *const *env;       /* NULL: the host's */
  const int *inherit_fds; /* become 3, 4, ... in the child */
  size_t n_inherit;
  int claim_uid; /* (a root host) claim a uid of the range below (see
                    uid.h), and the child drops to it and its gid, with
                    no supplementary groups, before its exec */
  uint32_t uid_first, uid_count;
  const char *context; /* NULL, or bytes handed over as a sealed memfd ... */
  size_t context_len;
  int context_at;     /* ... at this index of inherit_fds (whose entry is not
                         read); the caller keeps the bytes until
                         rlm_driver_context_done or rlm_driver_close */
  char *const *stage; /* host paths the child mounts at RLM_STAGE_DIR/<i>,
                         in a mount namespace of its own, before it drops to
                         run_as (see sandbox.h) */
  size_t n_stage;
  size_t max_line;    /* bytes, without the newline */
  uint64_t max_rss;   /* bytes over the whole sandbox, /session's tmpfs
                         included; 0: no watchdog (else a thread polls every
                         rss_interval_ms) */
  uint64_t max_files; /* files in /session; 0: not counted */
  int cgroup;         /* put the sandbox in a cgroup where one can be made */
  unsigned rss_interval_ms;
  int seccomp_only;    /* no bubblewrap (rlm-keeper's fallback,
                          docs/security.md): argv runs the interpreter
                          itself, and the child, before its exec, drops its
                          capabilities' bounding set and then to run_as
                          (claim_uid: required), leaves for a session of its
                          own, dies with its parent, changes to `workdir`
                          (given to the uid) and installs the seccomp filter
                          on itself with no_new_privs; the kill is its
                          process group's, and the watchdog counts
                          `workdir`'s files and bytes by walking it */
  const char *workdir; /* with seccomp_only: the REPL's directory */
  char channel;        /* nonzero: a stream of channels (docs/protocol.md, "The
                          stream"): every line sent goes with this byte first,
                          and the process is ended by the end of its input, then
                          SIGKILL to its process group (no sandbox of its own) */
} rlm_driver_opts;

/* How many descriptors this process can still open, counted up to `need`
 * (by opening them and closing them again). */
RLM_FN int rlm_fd_headroom(int need);

/* How many descriptors this process can still open in all: RLIMIT_NOFILE's
 * soft limit (in *limit) less those open (counted in /proc/self/fd, or by
 * fcntl below the limit when /proc is not there). -1 with errno set and the
 * call named in err when it cannot tell. */
RLM_FN long rlm_fd_free(long *limit, char *err, size_t errlen);

/* What rlm_driver_start needs free: its loop (an epoll descriptor, libuv's
 * signal pipes), three pipes while they are dup'd above the inherited ones,
 * the report pipe of a fork, the pidfd and the inherited descriptors'
 * copies. */
#define RLM_DRIVER_FDS 32

/* Starts the process on a thread of the driver's own (the keeper): the
 * context's memfd, the uid's claim, the fork or posix_spawn, the cgroup,
 * then the memory watchdog; so this returns at once. The driver's fd turns
 * readable when the start is over; a start that failed is an RLM_EV_FAILED
 * event. Input sent meanwhile waits in the pipe. Returns NULL with a
 * message in err when not even the thread could be had. */
RLM_FN rlm_driver *rlm_driver_start(const rlm_driver_opts *o, char *err,
                                    size_t errlen);

/* host (an IPv4 or IPv6 literal) and port as a socket address: 0, or -1. */
RLM_FN int rlm_socket_address(const char *host, unsigned port,
                              struct sockaddr_storage *ss, socklen_t *len);

/* A stream of channels over a TCP connection to a listening rlm-keeper
 * (docs/protocol.md, "The claim"), with no process: the connect is begun
 * here and never blocks (the loop finishes it); `claim` goes first, on the
 * keeper's channel, and what is sent meanwhile waits in the write queue.
 * The stream works as a process's does (its lines, its heartbeat, its
 * deadline); its end is the socket's, an RLM_EV_EXIT (status 0) whose data
 * says why (the far side closed it, a refused connect, a reset), and its
 * kill and close shut the socket down. No bytes from the far side within
 * claim_ms of the connect is RLM_EV_FAILED. NULL with err when the address
 * is no IPv4 or IPv6 literal or the connect fails at once. */
typedef struct rlm_connect_opts {
  const char *host;  /* an IPv4 or IPv6 literal, never a name to look up */
  unsigned port;     /* 1 to 65535 */
  const char *claim; /* the first line, without channel byte or newline */
  size_t claim_len;
  size_t max_line;   /* bytes, without the newline */
  unsigned claim_ms; /* the connect and the first bytes back, in ms */
} rlm_connect_opts;
RLM_FN rlm_driver *rlm_driver_connect(const rlm_connect_opts *o, char *err,
                                      size_t errlen);

/* Queues `len` bytes plus a newline for the driver's stdin. Returns 0, or -1
 * when the driver is gone or the data holds a newline. */
RLM_FN int rlm_driver_send(rlm_driver *d, const char *data, size_t len);

/* A stream's line on another channel than its own (the keeper's, 'K'). */
RLM_FN int rlm_driver_send_on(rlm_driver *d, char channel, const char *data,
                              size_t len);

/* A stream's line on the keeper's channel and then one on its own, in one
 * write: a message that goes with a line (a deadline with its exec) costs
 * the far side one wake-up, not two. 0, or -1 as rlm_driver_send. */
RLM_FN int rlm_driver_send_pair(rlm_driver *d, const char *keeper, size_t klen,
                                const char *data, size_t len);

/* A stream's raw bytes (the context after its message), written as they
 * are from the caller's memory, which must stay until
 * rlm_driver_raw_done says they are written: no copy, whatever their
 * size. Returns 0, or -1 when the process is gone. */
RLM_FN int rlm_driver_send_raw(rlm_driver *d, const char *data, size_t len);
RLM_FN int rlm_driver_raw_done(const rlm_driver *d);

/* Runs the driver's loop until it has an event for rlm_driver_take, or
 * timeout_ms pass (-1: no limit; 0: one look), without taking the event.
 * With `interruptible`, a SIGINT that the armed handler sees ends the wait
 * too (csrc/interrupt.h), and so does one it saw since rlm_interrupt_count()
 * was `seen`: returns 1 then, else 0. */
RLM_FN int rlm_driver_wait(rlm_driver *d, int timeout_ms, int interruptible,
                           unsigned seen);

/* The event the driver holds already (a line read, a terminal event),
 * without looking at the pipes: free it with rlm_event_free. NULL when none
 * is held. A line is a view into the driver's framing buffer, good until
 * the next call. */
RLM_FN rlm_event *rlm_driver_take(rlm_driver *d);
RLM_FN void rlm_event_free(rlm_event *ev);

/* The caller has copied the line last polled: a large framing buffer that
 * holds nothing more is freed now, not at the next read. */
RLM_FN void rlm_driver_line_taken(rlm_driver *d);

/* A stream's heartbeat (docs/protocol.md, "The stream"). A relay between
 * the host and the far side (sh -c 'cat | rlm-keeper | cat', a network
 * link) may outlive the far side and hold the host's pipe open: its end
 * then reaches the host only when the host writes, and a session that
 * waits on a step writes nothing. So while the loop runs, whenever the
 * stream has sent nothing and taken nothing of what waits for it for
 * every_ms, `ping` (at most 64 bytes, no newline) goes on the keeper's
 * channel; if nothing comes in lost_ms after it, the stream is killed and
 * the event is RLM_EV_SILENT. Bytes waiting in the pipe count as heard, so
 * a host that did not run the loop for a while (a long callback) never
 * mistakes its own absence for the far side's. Returns 0, or -1 (not a
 * stream, or no such ping). every_ms 0 stops it. */
RLM_FN int rlm_driver_heartbeat(rlm_driver *d, const char *ping, size_t len,
                                unsigned every_ms, unsigned lost_ms);

/* A stream whose far side lingers past its input's end (a keeper asked to
 * linger: docs/protocol.md, "Lingering"): its close waits for the process
 * to exit, with no bound, instead of killing its group STREAM_END_MS
 * after the input ends, so that it outlives its host's session as it
 * outlives its host's death (a kill still kills). Returns 0, or -1 (not
 * a stream). */
RLM_FN int rlm_driver_linger(rlm_driver *d);

/* Kills the whole sandbox now (SIGKILL). */
RLM_FN void rlm_driver_kill(rlm_driver *d);

/* Arms the step deadline ms from now (0 disarms it). */
RLM_FN void rlm_driver_set_deadline(rlm_driver *d, uint64_t ms);
RLM_FN int rlm_driver_deadline_passed(rlm_driver *d);

RLM_FN int rlm_driver_pid(const rlm_driver *d);
RLM_FN int rlm_driver_alive(const rlm_driver *d);

/* The sandbox's processes (host pids, launcher first). Returns how many. */
RLM_FN size_t rlm_driver_tree(const rlm_driver *d, int *pids, size_t max);
/* The driver's interpreter: the first process of the sandbox's tree,
 * launcher first, that is not bubblewrap; 0 when none runs (or one of the
 * tree is gone meanwhile). */
RLM_FN int rlm_driver_interpreter_pid(const rlm_driver *d);

/* Calls visit for every descriptor held in the sandbox that is neither one
 * of the session's pipes nor bubblewrap's own; returns how many. */
typedef void (*rlm_fd_visitor)(void *ud, int pid, int fd, const char *target);
RLM_FN int rlm_driver_foreign_fds(const rlm_driver *d, rlm_fd_visitor visit,
                                  void *ud);
/* The same for one process of the sandbox's tree (a pid rlm_driver_tree
 * gave): the host checks the interpreter again after it loaded its
 * context, bubblewrap's processes once. */
RLM_FN int rlm_driver_foreign_fds_of(const rlm_driver *d, int pid,
                                     rlm_fd_visitor visit, void *ud);
RLM_FN uint64_t rlm_driver_peak_rss(rlm_driver *d);
RLM_FN int rlm_driver_backend_fd(rlm_driver *d);
RLM_FN int rlm_driver_backend_timeout(rlm_driver *d);

/* The cgroup: moves every sandbox process into it (0, or -1 when one
 * would not move); how the memory limit is enforced ("cgroup v1",
 * "cgroup v2" or "poll"); and how often the kernel's OOM killer acted in it,
 * with the peak it charged. */
RLM_FN int rlm_driver_adopt(rlm_driver *d);
RLM_FN const char *rlm_driver_memory_mechanism(const rlm_driver *d);
RLM_FN uint64_t rlm_driver_oom_kills(const rlm_driver *d, uint64_t *peak);

/* The host uid the sandbox runs as (0 until it has started). */
RLM_FN unsigned rlm_driver_uid(const rlm_driver *d);
/* When bubblewrap was exec'd, on uv_hrtime()'s clock (CLOCK_MONOTONIC, ns);
 * 0 until it has started. For the start-up phases of bench/. */
RLM_FN uint64_t rlm_driver_exec_ns(const rlm_driver *d);
/* The keeper's steps, on the same clock: its start, the context written,
 * the uid claimed, the clone, the cgroup made (0: not reached); NULL until
 * it has started. For bench/. */
RLM_FN const uint64_t *rlm_driver_stamps(const rlm_driver *d);

/* Whether the keeper is done with opts.context: the caller may free it. */
RLM_FN int rlm_driver_context_done(rlm_driver *d);

/* Frees every handle of the host's side and returns without waiting: the
 * keeper kills the sandbox if it runs, reaps it, removes its cgroup, lets
 * go of its uid and frees the rest. There is nothing on the host's disk to
 * remove. */
RLM_FN void rlm_driver_close(rlm_driver *d);

/* How many drivers closed in this process are not yet torn down (their
 * keeper threads still kill, reap or free them). */
RLM_FN int rlm_driver_teardowns(void);

/* Gives the pages the process's allocator holds free back to the system
 * (glibc's malloc_trim; nothing elsewhere). */
RLM_FN void rlm_driver_trim_heap(void);

#endif
