/* plan.c: see plan.h. */
#define _GNU_SOURCE
#include "plan.h"

#include "sandbox.h"
#include "seccomp.h"
#include "workdir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Opens the package's files beside the driver into fds[]; 0, or -1 with a
 * message. */
static int open_modules(const rlm_sandbox_spec *spec, int *fds, char *err,
                        size_t errlen) {
  const char *slash = strrchr(spec->driver, '/');
  int dirlen = slash ? (int)(slash - spec->driver) : 0;
  for (size_t i = 0; i < spec->n_modules; i++) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%.*s/%s", dirlen, spec->driver,
                 spec->modules[i]) >= (int)sizeof(path)) {
      snprintf(err, errlen, "driver module %.64s: path too long",
               spec->modules[i]);
      return -1;
    }
    while ((fds[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0 && errno == EINTR)
      ;
    if (fds[i] < 0) {
      snprintf(err, errlen, "opening %.256s: %s", path, strerror(errno));
      return -1;
    }
  }
  return 0;
}

void blob_unref(sealed_blob *b) {
  if (b != NULL && atomic_fetch_sub(&b->refs, 1) == 1) {
    close(b->fd);
    free(b);
  }
}

sealed_blob *blob_new(const char *data, size_t len, int refs) {
  sealed_blob *b = malloc(sizeof(*b));
  if (b == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  /* Named apart from the context's: a report of descriptors tells them
   * apart. */
  int fd = (int)syscall(SYS_memfd_create, "rlm-driver",
                        MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || rlm_context_append(fd, data, len) != 0 ||
      rlm_context_seal(fd) != 0) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    free(b);
    errno = e;
    return NULL;
  }
  atomic_init(&b->refs, refs);
  b->fd = fd;
  return b;
}

void plan_free(void *arg) {
  spawn_plan *plan = arg;
  blob_unref(plan->zip);
  blob_unref(plan->entry);
  if (plan->late_ro >= 0)
    close(plan->late_ro);
  free(plan);
}

spawn_plan *plan_new(const rlm_sandbox_spec *spec) {
  size_t n = spec->n_ro + spec->n_modules + 3;
  size_t bytes =
      sizeof(spawn_plan) + (spec->n_ro + spec->n_modules + 2) * sizeof(char *);
  const char *src[3] = {spec->bwrap, spec->python, spec->driver};
  for (size_t i = 0; i < n; i++) {
    const char *x = i < 3                ? src[i]
                    : i < 3 + spec->n_ro ? spec->ro[i - 3]
                                         : spec->modules[i - 3 - spec->n_ro];
    bytes += strlen(x) + 1;
  }
  spawn_plan *plan = malloc(bytes);
  if (plan == NULL)
    return NULL;
  plan->spec = *spec;
  plan->zip = plan->entry = NULL;
  plan->as_root = 0;
  plan->late_ro = -1;
  const char **ro = (const char **)(plan + 1);
  const char **mods = ro + spec->n_ro + 1;
  char *p = (char *)(mods + spec->n_modules + 1);
  for (size_t i = 0; i < n; i++) {
    const char *x = i < 3                ? src[i]
                    : i < 3 + spec->n_ro ? spec->ro[i - 3]
                                         : spec->modules[i - 3 - spec->n_ro];
    size_t len = strlen(x) + 1;
    const char *copy = memcpy(p, x, len);
    p += len;
    if (i == 0)
      plan->spec.bwrap = copy;
    else if (i == 1)
      plan->spec.python = copy;
    else if (i == 2)
      plan->spec.driver = copy;
    else if (i < 3 + spec->n_ro)
      ro[i - 3] = copy;
    else
      mods[i - 3 - spec->n_ro] = copy;
  }
  ro[spec->n_ro] = NULL;
  mods[spec->n_modules] = NULL;
  plan->spec.ro = ro;
  plan->spec.modules = spec->n_modules > 0 ? mods : NULL;
  plan->spec.stage = NULL;
  return plan;
}

int plan_prepare(void *arg, rlm_prepared *p, char *err, size_t errlen) {
  spawn_plan *plan = arg;
  rlm_sandbox_spec *spec = &plan->spec;
  if (plan->as_root)
    spec->stage = &p->stage;
  p->n_fds = 3 + (plan->zip != NULL ? 1 : spec->n_modules);
  if ((p->fds[CHILD_SECCOMP_FD - 3] = rlm_seccomp_open(err, errlen)) < 0)
    return -1;
  int *drv = &p->fds[CHILD_DRIVER_FD - 3];
  if (plan->entry != NULL) {
    if ((*drv = rlm_sealed_reopen(plan->entry->fd)) < 0) {
      snprintf(err, errlen, "the driver's bytecode: %s", strerror(errno));
      return -1;
    }
  } else {
    while ((*drv = open(spec->driver, O_RDONLY | O_CLOEXEC)) < 0 &&
           errno == EINTR)
      ;
    if (*drv < 0) {
      snprintf(err, errlen, "opening %s: %s", spec->driver, strerror(errno));
      return -1;
    }
  }
  if (plan->zip != NULL) {
    if ((p->fds[CHILD_ZIP_FD - 3] = rlm_sealed_reopen(plan->zip->fd)) < 0) {
      snprintf(err, errlen, "the driver's zip: %s", strerror(errno));
      return -1;
    }
  } else if (open_modules(spec, p->fds + 3, err, errlen) != 0) {
    return -1;
  }
  if (plan->late_ro >= 0) { /* the keeper's from here */
    p->fds[CHILD_CONTEXT_FD - 3] = plan->late_ro;
    plan->late_ro = -1;
  }
  spec->seccomp_fd = CHILD_SECCOMP_FD;
  spec->driver_fd = CHILD_DRIVER_FD;
  return rlm_sandbox_argv(spec, &p->argv, err, errlen);
}
