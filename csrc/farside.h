/* farside.h: rlm-keeper, the program that runs a session's sandbox on the
 * far side of a byte stream (docs/protocol.md, "The stream"). What its
 * files share: farside.c (main: the arguments, the hello, the loop),
 * farside_relay.c (the stream both ways, and the end), farside_start.c
 * (the host's start, and the driver's), farside_probe.c (the interpreter's
 * report, cached), farside_checks.c (the /proc checks it reports),
 * farside_seccomp.c (which sandbox it makes, and the fallback's),
 * farside_linger.c (a keeper that outlives its stream), farside_attach.c
 * (--attach, the client of a lingering keeper's socket), farside_listen.c
 * (--listen: the stream on a TCP connection claimed with a token), and
 * farside_token.c (the form and the compare of those secrets).
 * Built as one unit, csrc/rlm_keeper.c. */
#ifndef RLM_FARSIDE_H
#define RLM_FARSIDE_H

#include "canary.h"
#include "driver.h"
#include "jsonread.h"
#include "unit.h"

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define RLM_KEEPER_VERSION "1"
#define RLM_KEEPER_PROTOCOL 1

/* An rlimit the driver must have set: a name of the RLIMIT_* family that
 * far_rlimit_known knows, and its value (-1: unlimited). */
typedef struct far_rlimit {
  char name[24];
  int64_t value;
} far_rlimit;
#define FAR_MAX_RLIMITS 16

/* The row of name in /proc/<pid>/limits' table, or -1 when unknown. */
RLM_FN int far_rlimit_known(const char *name);

/* Each check: 1 (it holds) or 0, and detail (NUL-terminated, cut to len)
 * says what was seen. */
RLM_FN int far_check_rlimits(int pid, const far_rlimit *want, size_t n,
                             char *detail, size_t len);
RLM_FN int far_check_uids(const int *pids, size_t n, unsigned want,
                          char *detail, size_t len);
RLM_FN int far_check_descriptors(const rlm_driver *d, char *detail, size_t len);

/* What the kernel shows of the interpreter's confinement: a seccomp
 * filter, no_new_privs, and no capability, effective, permitted or in its
 * bounding set. */
RLM_FN int far_check_confinement(int pid, char *detail, size_t len);

/* What the interpreter reported (python/probe.py), decoded. The strings
 * and lists point into `text`, which the report owns. */
typedef struct far_probe {
  char *text; /* the probe's line, its strings decoded in place */
  const char *executable, *version, *interpreter;
  const char **sys_path, **pth_paths, **files;
  size_t n_sys_path, n_pth_paths, n_files;
  char *zip, *pyc; /* the driver's package and entry, base64-decoded */
  size_t zip_len, pyc_len;
} far_probe;

/* The report of python for these modules and the driver's directory: read
 * from cache_dir when one is there for the same interpreter (its path,
 * size and time), modules and driver files, else asked of the interpreter
 * (and written there, when cache_dir is given). 0, or -1 with a message. */
RLM_FN int far_probe_get(far_probe *p, const char *python,
                         const char *driver_dir, const char *const *modules,
                         size_t n_modules, const char *cache_dir, char *err,
                         size_t errlen);
RLM_FN void far_probe_free(far_probe *p);

/* The sandbox a keeper makes (its hello's "sandbox"): bubblewrap, or where
 * that cannot run, the fallback: the interpreter confined by the seccomp
 * filter it installs on itself, a uid of its own and rlimits, inside the
 * container's own boundary (docs/security.md). */
typedef enum far_mode { FAR_NONE, FAR_BUBBLEWRAP, FAR_SECCOMP } far_mode;
RLM_FN const char *far_mode_name(far_mode m);

/* Whether bubblewrap can make its namespaces here: a child makes a user,
 * mount, pid, network, IPC and UTS namespace, mounts a /proc and sets a
 * hostname in them, as bubblewrap does (what a container's seccomp profile
 * or its masked /proc refuses). 1, or 0 with why. Before any thread. */
RLM_FN int far_namespaces_work(char *why, size_t len);
/* The same, kept in cache_dir (when given) for as long as this boot, these
 * namespaces, the kernel's user-namespace count and bubblewrap's file are
 * the same: a keeper that runs again where one ran asks no child. Only a
 * yes or a refusal (EPERM, EACCES) is kept, never a failure that may pass. */
RLM_FN int far_namespaces_cached(const char *cache_dir, const char *bwrap,
                                 char *why, size_t len);

/* The fallback's directory for one REPL, made in tmp: <dir>/rlm/ holds the
 * driver's entry and package (repl_driver.pyc, driver.zip: read-only),
 * <dir>/session/ is the REPL's own (the spawn gives it to the REPL's uid);
 * others may pass through <dir>, not list it. 0, or -1 with err. */
RLM_FN int far_session_dir(char *dir, size_t len, const char *tmp,
                           const far_probe *p, char *err, size_t errlen);

/* Removes a directory and everything in it, following no symlink. */
RLM_FN int far_remove_tree(const char *path);

/* rlm-keeper --attach: hands its stdin and stdout to the keeper that
 * lingers as the id its first line names (docs/protocol.md, "Lingering"),
 * and waits while that stream lives. The exit status. */
RLM_FN int far_attach_main(const char *linger_dir);

/* rlm-keeper --listen ADDR:PORT --token-file PATH (docs/backends.md): the
 * token read from its file (a regular file no other uid may write, 32 of
 * [0-9a-f] and an optional newline), then a TCP listener on ADDR:PORT
 * (an IPv4 literal, or an IPv6 one in brackets; port 0: any, and the bound
 * one is said on stderr). far_listen_open: 0, or -1 with err (the keeper
 * does not start). far_listen_claim: waits for the first connection whose
 * first line is the claim with the right token, within CLAIM_WAIT_MS of its
 * connect (the others are refused and closed, the keeper goes on), closes
 * the listener and the rest, and returns that connection's descriptor
 * (-1: the wait itself failed, with err). */
typedef struct far_listener far_listener;
RLM_FN far_listener *far_listen_open(const char *addr, const char *token_file,
                                     char *err, size_t errlen);
RLM_FN int far_listen_claim(far_listener *l, char *err, size_t errlen);

/* SIGTERM (the kubelet's, at a pod's deletion) is the end of the keeper's
 * input, with no linger: far_term_init installs a handler that writes a
 * byte to a pipe of its own, whose read end (far_term_fd) every poll of
 * the keeper watches. A handler is also what lets the signal reach a
 * keeper that is PID 1 of its PID namespace (a pod's container without
 * shareProcessNamespace): the kernel drops a signal that such a process
 * has no handler for. 0, or -1 with errno. */
RLM_FN int far_term_init(void);
RLM_FN int far_term_fd(void);

/* --- the keeper's state, and what one of its files calls in another ---- */

#define IN_CHUNK 65536
#define OUT_HIGH 65536 /* take no driver event while more waits for stdout */

/* A keeper's whole state (main's): where things are, the host's input,
 * what waits for stdout, and the driver with what it was started with. */
typedef struct far {
  /* where things are */
  const char *python_name, *bwrap_name, *cache_dir;
  char driver_dir[PATH_MAX], python[PATH_MAX], bwrap[PATH_MAX];
  int have_bwrap;
  far_mode mode;                 /* the sandbox it makes (its hello says) */
  char mode_why[PATH_MAX + 512]; /* why that one */
  char session_dir[PATH_MAX];    /* the fallback's (far_session_dir); "" */
  char home_env[PATH_MAX + 64];
  char seed_env[RLM_SEED_VAR_BYTES]; /* PYTHONHASHSEED=, the start's */
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
  /* what waits for the host: out[out_off, out_len) is still to write; with
   * a linger, out[out_keep, out_off) are lines written already and kept for
   * a replay (keep_seq numbers the first of them, out_seq counts every
   * line queued), and pre[] is a line of the keeper's that goes first and
   * counts as none (attached) */
  char *out;
  size_t out_len, out_off, out_cap, out_keep, keep_max;
  uint64_t out_seq, keep_seq;
  char pre[512];
  size_t pre_len, pre_off;
  int out_broken;
  /* the stream: stdin and stdout, or an attached one's (farside_linger.c) */
  int in_fd, out_fd;
  int conn_fd; /* the attacher's connection, held while its stream lives */
  /* the linger the host asked for (start's "linger"), and its socket */
  uint64_t linger_ms; /* 0: none, or after the host's close */
  char linger_id[65], token[129];
  int64_t fence;
  const char *linger_dir; /* --linger-dir, or NULL: the default */
  char sock_dir[PATH_MAX], sock_path[PATH_MAX];
  int listen_fd;
  int detached;         /* no stream: waiting for an attach */
  uint64_t detached_ms; /* since when (monotonic) */
  /* the driver */
  rlm_driver *d;
  int started, ended;
  unsigned long lines_seen; /* the driver's lines so far */
  uint64_t host_lines;      /* the host's D lines taken, on any stream */
  int load_seen;            /* the host's load_context went to the driver */
  far_rlimit want[FAR_MAX_RLIMITS];
  size_t n_want;
  rlm_canaries canaries;
  int planted;
  int cgroup_ok;
  char cgroup_detail[200];
  size_t max_line;
  int termed; /* SIGTERM came: the end of the input (far_term_init) */
} far;

/* A message of the host's, parsed (jsonread.h): its text, its tokens, and
 * the index of its object among them. */
typedef struct start_msg {
  const char *s;
  rlm_jtok *t;
  long root;
} start_msg;

/* farside_relay.c's: what waits for stdout (out_*: what does not fit sets
 * out_broken), written without blocking (flush_some: -1 when the host is
 * gone) or at the end for at most ms (flush_all); the host's input read so
 * far, the driver's events; and the end (end_driver; fail says why first). */
static void out_bytes(far *f, const char *s, size_t n);
static void out_str(far *f, const char *s);
static void out_fmt(far *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void out_json(far *f, const char *s, size_t n);
static void out_jstr(far *f, const char *s);
static int flush_some(far *f);
static void flush_all(far *f, int ms);
static void host_input(far *f);
static void driver_event(far *f, rlm_event *ev);
static void end_driver(far *f);
static void fail(far *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* farside_start.c's: the host's start, and two of its field readers. */
static void start(far *f, const start_msg *m);
static int field_int(const start_msg *m, const char *key, int64_t min,
                     int64_t max, int64_t *out);
static int read_rlimits(far *f, const start_msg *m, long i);
/* farside_checks.c's: the checks after the driver's ready, and the memory
 * cgroup's (at its first line). */
static void ready_checks(far *f);
/* farside_linger.c's: the start's linger read and its socket made (0, or
 * -1 with err), a stream's end turned into a wait when the host asked for one
 * (nonzero when it did), an attach taken at the socket, the ms left of the
 * wait (-1: none), and the end (the socket gone). */
static int linger_read(far *f, const start_msg *m, long i, char *err,
                       size_t errlen);
static int linger_detach(far *f);
static void linger_accept(far *f);
static int linger_left_ms(far *f);
static void linger_end(far *f);
static void adopt(far *f);
/* farside_linger.c's, for farside_attach.c too: the socket's directory (its
 * path, the check that only this uid can open it), an id's form, and the
 * socket's address; the longest attach line, with its newline. */
#define ATTACH_LINE_MAX 4096
struct sockaddr_un;
static int linger_dir_path(const char *given, char *out, size_t len);
static int linger_dir_check(const char *dir, int make, char *err,
                            size_t errlen);
static int id_ok(const char *id);
static int sock_address(struct sockaddr_un *a, const char *dir, const char *id);
/* farside_token.c's: whether a token is min to max of [0-9a-f], and two
 * secrets' compare, in a time that depends on their lengths alone. */
static int token_form_ok(const char *t, size_t min, size_t max);
static int same_secret(const char *a, const char *b);
/* farside_probe.c's cache, which farside_seccomp.c keeps the namespaces'
 * verdict in too: a key of at most KEY_MAX bytes made of lines (key_add;
 * key_stat adds a file's size and time), the file named by its hash
 * (fnv1a), and the entry read back for the same key only (cache_read) or
 * written whole (cache_write). */
#define KEY_MAX 16384
static int key_add(char *key, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int key_stat(char *key, size_t *at, const char *path);
static uint64_t fnv1a(const char *s);
static char *cache_read(const char *file, const char *key);
static void cache_write(const char *file, const char *key, const char *line);
/* farside_seccomp.c's: which sandbox this keeper makes, and the fallback's
 * start. */
static void choose_mode(far *f, const char *want, int found_python);
static int seccomp_plan(far *f, const far_probe *probe, rlm_driver_opts *o,
                        int inherit[2], char **argv, char **env,
                        uint32_t hash_seed, char *err, size_t errlen);

#endif
