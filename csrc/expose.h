/* expose.h: a bubblewrap command line's binds that make host paths
 * resolve inside the sandbox as they do on the host (expose.c), for the
 * policy that builds the rest of it (sandbox.c). Both are parts of one
 * unit (csrc/rlm.c, csrc/rlm_keeper.c): what they share is static. */
#ifndef RLM_EXPOSE_H
#define RLM_EXPOSE_H

#include "sandbox.h"

#include <sys/types.h>

/* What one build has asked the filesystem, by path: the ro paths share
 * their directories, and each would otherwise be stat'ed again for every
 * path below it (hundreds of system calls a spawn). */
#define STAT_MEMO_SLOTS 1024
typedef struct stat_memo {
  char *path;
  int lstat_rc, stat_rc; /* 0, -1 (failed) or 1 (not asked yet) */
  mode_t lmode, mode;
} stat_memo;

/* What has been exposed so far, so that a path inside an exposed directory or
 * a symlink seen twice is not emitted again. */
typedef struct exposer {
  rlm_argv *argv;
  rlm_argv seen;
  rlm_argv *stage;
  int failed;
  stat_memo *memo; /* STAT_MEMO_SLOTS, or NULL: ask every time */
} exposer;

/* Appends an option and its one or two arguments (b, c: NULL for none). */
static void emit(exposer *e, const char *a, const char *b, const char *c);
/* A file copied in from the child's descriptor fd at dest. */
static void copy_in(exposer *e, int fd, const char *dest);
static void memo_free(exposer *e);
/* The binds of spec's ro paths and interpreter, appended to e's argv. */
static int expose_installation(exposer *e, const rlm_sandbox_spec *spec,
                               char *err, size_t errlen);

#endif
