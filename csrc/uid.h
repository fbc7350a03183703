/* uid.h: the host uid a sandbox runs as when the host is root. Never uid 0:
 * the kernel exempts it from RLIMIT_NPROC, and host-global files owned by
 * root would be its own. Each session claims a uid of its own from a range
 * with flock() on /run/rlm/uid-<n>, held while the session lives, so a dead
 * host frees it; RLIMIT_NPROC then counts that sandbox's tasks alone. The
 * release removes the file (a killed host leaves its files; the next claim
 * and release of those uids removes them). */
#ifndef RLM_UID_H
#define RLM_UID_H

#include "unit.h"

#include <stddef.h>
#include <stdint.h>

#define RLM_RUN_DIR "/run/rlm"

/* Every uid of the range stays below this: the kernel refuses a uid map
 * (bubblewrap's "setting up uid map: Invalid argument") from 2^31 up. */
#define RLM_UID_LIMIT 0x80000000ull

/* Claims a free uid in [first, first + count). Returns the lock's
 * descriptor (close-on-exec; closing it frees the uid) with the uid in
 * *uid, or -1 with a message in err. */
RLM_FN int rlm_uid_claim(uint32_t first, uint32_t count, uint32_t *uid,
                         char *err, size_t errlen);

/* Lets go of a claim: unlinks /run/rlm/uid-<uid> while the lock is still
 * held (if the path is still the file locked), then closes fd. */
RLM_FN void rlm_uid_release(int fd, uint32_t uid);

#endif
