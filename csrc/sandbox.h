/* sandbox.h: the bubblewrap command line that confines the driver, and the
 * helpers that resolve the programs it names. */
#ifndef RLM_SANDBOX_H
#define RLM_SANDBOX_H

#include <stddef.h>

typedef struct rlm_argv {
  char **v; /* NULL-terminated */
  size_t n, cap;
} rlm_argv;

typedef struct rlm_sandbox_spec {
  const char *bwrap;     /* absolute path of bubblewrap */
  const char *python;    /* absolute path of the interpreter (realpath) */
  const char *driver;    /* host path of repl_driver.py */
  const char *workdir;   /* host path of the session workdir */
  const char *const *ro; /* host paths to expose read-only, at the same path */
  size_t n_ro;
  int seccomp_fd; /* the filter's descriptor in the child; -1: none */
} rlm_sandbox_spec;

/* Paths inside the sandbox. */
#define RLM_SANDBOX_DRIVER "/rlm/repl_driver.py"
#define RLM_SANDBOX_WORKDIR "/session"

int rlm_argv_push(rlm_argv *a, const char *s);
void rlm_argv_free(rlm_argv *a);

/* Builds the full argv (bwrap ... -- python driver). Returns 0, or -1 with a
 * message in err. */
int rlm_sandbox_argv(const rlm_sandbox_spec *spec, rlm_argv *out, char *err,
                     size_t errlen);

/* The macOS command: sandbox-exec with the profile sandbox/macos.sb and its
 * parameters, then the interpreter and the driver. Untested on macOS (the
 * rest of the C core is Linux-only for now); built and checked everywhere. */
typedef struct rlm_macos_spec {
  const char *sandbox_exec; /* /usr/bin/sandbox-exec */
  const char *profile;      /* path of macos.sb */
  const char *python, *python_prefix, *driver, *workdir;
} rlm_macos_spec;

int rlm_macos_argv(const rlm_macos_spec *spec, rlm_argv *out, char *err,
                   size_t errlen);

/* Finds an executable: an absolute or relative path is checked as given, a
 * bare name is looked up on the host's PATH. Returns 0 and the absolute path
 * in out, or -1. */
int rlm_find_program(const char *name, char *out, size_t outlen);

#endif
