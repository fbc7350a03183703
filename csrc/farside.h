/* farside.h: rlm-keeper, the program that runs a session's sandbox on the
 * far side of a byte stream (docs/protocol.md, "The stream"). What its
 * files share: farside.c (the stream and the messages), farside_probe.c
 * (the interpreter's report, cached), farside_checks.c (the /proc checks
 * it reports). Built as one unit, csrc/rlm_keeper.c. */
#ifndef RLM_FARSIDE_H
#define RLM_FARSIDE_H

#include "driver.h"
#include "unit.h"

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

#endif
