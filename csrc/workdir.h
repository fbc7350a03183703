/* workdir.h: the session's private directory on the host (mode 0700), the
 * files the host hands the driver through it, and its removal. */
#ifndef RLM_WORKDIR_H
#define RLM_WORKDIR_H

#include <stddef.h>

/* Creates <base>/rlm-XXXXXX. Returns 0, or -1 with errno set. */
int rlm_workdir_create(const char *base, char *out, size_t outlen);

/* Writes a new file `name` (no slashes) in dir; fails if it exists. Returns
 * 0, or -1 with errno set. */
int rlm_workdir_write(const char *dir, const char *name, const char *data,
                      size_t len);

/* Removes dir and everything in it without following symlinks, however deep
 * the driver nested it. Returns 0, or -1 with errno set. */
int rlm_workdir_remove(const char *dir);

#endif
