/* smallfile.h: whole reads and writes of small files (/proc, cgroupfs). */
#ifndef RLM_SMALLFILE_H
#define RLM_SMALLFILE_H

#include "unit.h"

#include <stddef.h>
#include <sys/types.h>

/* Reads up to len - 1 bytes of path into buf, NUL-terminated. Returns the
 * bytes read, or -1 with errno set. */
RLM_FN ssize_t rlm_read_small(const char *path, char *buf, size_t len);

/* Writes value to path in one write (as sysfs and cgroupfs want). Returns
 * 0, or -1 with errno set. */
RLM_FN int rlm_write_small(const char *path, const char *value);

#endif
