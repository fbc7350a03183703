/* seccomp.h: the seccomp-bpf filter bubblewrap installs on the driver (or
 * the driver's child itself, where there is no bubblewrap). */
#ifndef RLM_SECCOMP_H
#define RLM_SECCOMP_H

#include "unit.h"

#include <linux/filter.h>
#include <stddef.h>

/* Returns a sealed, close-on-exec memfd holding the filter (a raw array of
 * struct sock_filter, as bwrap --seccomp reads it), positioned at 0; or -1
 * with a message in err. */
RLM_FN int rlm_seccomp_fd(char *err, size_t errlen);

/* A descriptor of its own (positioned at 0, read-only, close-on-exec) on
 * the process's one sealed memfd of the filter, made at the first call and
 * kept open; or -1 with a message in err. Thread-safe. */
RLM_FN int rlm_seccomp_open(char *err, size_t errlen);

/* The filter itself, for a process that installs it on itself (rlm-keeper's
 * fallback, where no bubblewrap runs: spawn.c's seccomp_only child). */
RLM_FN const struct sock_fprog *rlm_seccomp_program(void);

#endif
