/* workdir.h: the session's files. /session is a size-limited tmpfs inside
 * the sandbox, never a directory on the host's disk; the context reaches the
 * driver as a sealed memfd it inherits. */
#ifndef RLM_WORKDIR_H
#define RLM_WORKDIR_H

#include "unit.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The context's memfd, made in three calls so that it can be written in
 * slices: rlm_context_open gives a close-on-exec memfd that allows sealing
 * (or -1, errno); rlm_context_append writes len bytes to it (0, or -1 and
 * errno); rlm_context_seal seals it (no write, grow, shrink or further
 * seal), reads the seals back and puts it at 0 (0, or -1 and errno). */
RLM_FN int rlm_context_open(void);
RLM_FN int rlm_context_append(int fd, const char *data, size_t len);
RLM_FN int rlm_context_seal(int fd);
/* A description of its own (offset 0, read-only, close-on-exec) of the
 * sealed memfd fd, by /proc/self/fd: a reader that read()s it (bwrap's
 * --seccomp, --ro-bind-data) then does not move another's offset. Returns
 * the descriptor, or -1 with errno set. */
RLM_FN int rlm_sealed_reopen(int fd);

/* What the sandbox holds in /session: bytes of its tmpfs in use and files
 * (inodes, the directory itself not counted), seen through the root of the
 * pid namespace's init, the launcher's child. Returns 0, or -1 when the
 * sandbox is not there (yet, or any more). */
RLM_FN int rlm_workdir_usage(pid_t launcher, uint64_t *bytes, uint64_t *files);

/* An O_PATH descriptor on /session, taken while the sandbox lives; -1 when
 * it is gone. While it is open the tmpfs outlives the sandbox's mount
 * namespace, so the kernel's teardown of whatever the sandbox left there
 * (100k files: ~200 ms) happens when it is closed, not in the exit of the
 * sandbox's init the keeper waits for. */
RLM_FN int rlm_workdir_pin(pid_t launcher);

/* A workdir that is a plain directory (a seccomp-only sandbox, driver.h):
 * what it holds, walked without following a symlink (bytes: the blocks of
 * every entry; files: entries, the directory itself not counted). A walk
 * stops past max_files entries (0: no limit), and one that meets a
 * directory 64 levels down counts max_files + 1: a sandbox that nests so
 * deep is over its limit. Returns 0, or -1 when path is not a directory. */
RLM_FN int rlm_workdir_walk(const char *path, uint64_t max_files,
                            uint64_t *bytes, uint64_t *files);
#endif
