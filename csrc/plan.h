/* plan.h: a sandbox's spawn plan, what the keeper needs to make its command
 * line and its descriptors (core.spawn makes it on the Lua thread, the
 * keeper consumes it), and the sealed memfd of the driver's zip that every
 * spawn of a probe shares. */
#ifndef RLM_PLAN_H
#define RLM_PLAN_H

#include "unit.h"

#include "driver.h"
#include "sandbox.h"

#include <stdatomic.h>
#include <stddef.h>

/* Where the child finds what it is handed: the filter (bwrap reads it), the
 * context (the driver maps it) and the driver's text, then its package's
 * files (bwrap copies them). */
#define CHILD_SECCOMP_FD 3
#define CHILD_CONTEXT_FD 4
#define CHILD_DRIVER_FD 5
#define CHILD_ZIP_FD 6 /* the package's zip, in place of its files */

/* A sealed memfd shared by every spawn that hands it over (the driver's
 * zip and its entry's bytecode, made once per probe): each spawn's keeper
 * opens a description of its own (bwrap read()s it), and the last holder
 * closes it. */
typedef struct sealed_blob {
  atomic_int refs;
  int fd;
} sealed_blob;

/* What the keeper needs to make the command line and the descriptors: the
 * spec with its own copies of the strings (in the same allocation), the
 * zip and the entry's bytecode. */
typedef struct spawn_plan {
  rlm_sandbox_spec spec;
  sealed_blob *zip;   /* NULL: the modules' files */
  sealed_blob *entry; /* NULL: the entry's text, from spec.driver */
  int as_root;
  int late_ro; /* late_context: the child's read-only open of the empty
                  context memfd, handed over at CHILD_CONTEXT_FD; -1 */
} spawn_plan;

/* A sealed memfd holding data[0..len), with `refs` references; NULL with
 * errno set. blob_unref drops one, and the last closes it. */
RLM_FN sealed_blob *blob_new(const char *data, size_t len, int refs);
RLM_FN void blob_unref(sealed_blob *b);
/* A copy of spec (bwrap, python, driver, ro, modules) in one allocation;
 * NULL when out of memory. */
RLM_FN spawn_plan *plan_new(const rlm_sandbox_spec *spec);
RLM_FN void plan_free(void *arg);
/* On the keeper: the filter's, the driver's and its package's descriptors
 * and the command line (an rlm_prepare_fn). */
RLM_FN int plan_prepare(void *arg, rlm_prepared *p, char *err, size_t errlen);

#endif
