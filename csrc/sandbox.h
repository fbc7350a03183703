/* sandbox.h: the bubblewrap command line that confines the driver, and the
 * helpers that resolve the programs it names. */
#ifndef RLM_SANDBOX_H
#define RLM_SANDBOX_H

#include "unit.h"

#include <stddef.h>
#include <stdint.h>

struct rlm_argv {
  char **v; /* NULL-terminated */
  size_t n, cap;
};

typedef struct rlm_argv rlm_argv;

typedef struct rlm_sandbox_spec {
  const char *bwrap;   /* absolute path of bubblewrap */
  const char *python;  /* absolute path of the interpreter (realpath) */
  const char *driver;  /* host path of repl_driver.py (when driver_fd < 0) */
  int driver_fd;       /* the child's descriptor on the driver's text, copied in
                          with --ro-bind-data so that no host path shows; -1: bind
                          `driver` */
  int driver_compiled; /* with driver_fd: that is the entry's bytecode (a .pyc),
                          at RLM_SANDBOX_DRIVER_PYC, run as it is */
  const char *const *modules; /* the driver's package: paths relative to the
                                 driver's directory, each at /rlm/<path>, from
                                 descriptors driver_fd + 1, + 2, ... (checked
                                 with rlm_sandbox_module_ok) */
  size_t n_modules;
  int zip_fd; /* >= 0: the child's descriptor on the package packed in one zip
                 (probe.py --driver), copied in at RLM_SANDBOX_DRIVER_ZIP in
                 place of the modules' files */
  const char *const *ro; /* host paths to expose read-only, at the same path */
  size_t n_ro;
  int seccomp_fd;         /* the filter's descriptor in the child; -1: none */
  uint64_t workdir_bytes; /* size of the /session tmpfs */
  rlm_argv *stage;    /* non-NULL (root host): a path the sandbox's uid cannot
                         reach is appended here and bound from
                         RLM_STAGE_DIR/<index>, where the spawn mounts it */
  uint32_t hash_seed; /* > 0: the driver's PYTHONHASHSEED (a journaled
                         session's, so that its replay hashes alike) */
} rlm_sandbox_spec;

/* Paths inside the sandbox. */
#define RLM_SANDBOX_DRIVER "/rlm/repl_driver.py"
#define RLM_SANDBOX_DRIVER_PYC "/rlm/repl_driver.pyc"
#define RLM_SANDBOX_DRIVER_DIR "/rlm"
/* The package in one archive (python/probe.py names its frames so). */
#define RLM_SANDBOX_DRIVER_ZIP "/rlm/driver.zip"
/* Files of the driver's package besides repl_driver.py, at most. */
#define RLM_MAX_DRIVER_MODULES 16
#define RLM_SANDBOX_WORKDIR "/session"
/* The driver's fixed environment (an initialiser): nothing of the host's. */
#define RLM_SANDBOX_ENV                                                        \
  {                                                                            \
    "PATH=/usr/bin:/bin", "LANG=C.UTF-8", "PYTHONUTF8=1",                      \
        "HOME=" RLM_SANDBOX_WORKDIR, NULL                                      \
  }
/* The host directory where a root host's spawn, in a mount namespace of its
 * own, mounts what the sandbox's unprivileged uid could not reach. */
#define RLM_STAGE_DIR "/run/rlm/stage"

/* The interpreter's flags before the driver's path: -I -S -B; with a hash
 * seed -s -S -B, since -I (its -E) would not read PYTHONHASHSEED. The
 * environment is the fixed list either way, so -E had nothing else to
 * ignore but PYTHONUTF8. */
RLM_FN const char *const *rlm_sandbox_flags(uint32_t hash_seed);

/* The driver's environment: RLM_SANDBOX_ENV, and PYTHONHASHSEED=hash_seed
 * (written into var, RLM_SEED_VAR_BYTES) when hash_seed > 0. env holds
 * RLM_SANDBOX_ENV_MAX pointers. */
#define RLM_SEED_VAR_BYTES 32
#define RLM_SANDBOX_ENV_MAX 8
RLM_FN void rlm_sandbox_env(uint32_t hash_seed, char *var, char **env);

RLM_FN int rlm_argv_push(rlm_argv *a, const char *s);

/* Whether a driver module's relative path is one to bind: a .py file below
 * the driver's directory, named with [A-Za-z0-9_] and single slashes, no
 * dot-dot. */
RLM_FN int rlm_sandbox_module_ok(const char *rel);
RLM_FN void rlm_argv_free(rlm_argv *a);

/* Builds the full argv (bwrap ... -- python driver). Returns 0, or -1 with a
 * message in err. */
RLM_FN int rlm_sandbox_argv(const rlm_sandbox_spec *spec, rlm_argv *out,
                            char *err, size_t errlen);

/* Finds an executable: an absolute or relative path is checked as given, a
 * bare name is looked up on the host's PATH. Returns 0 and the absolute path
 * in out, or -1. */
RLM_FN int rlm_find_program(const char *name, char *out, size_t outlen);

#endif
