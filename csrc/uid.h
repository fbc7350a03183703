/* uid.h: the host uid a sandbox runs as when the host is root. Never uid 0:
 * the kernel exempts it from RLIMIT_NPROC, and host-global files owned by
 * root would be its own. Each session claims a uid of its own from a range
 * with flock() on /run/rlm/uid-<n>, held while the session lives, so a dead
 * host frees it; RLIMIT_NPROC then counts that sandbox's tasks alone. */
#ifndef RLM_UID_H
#define RLM_UID_H

#include "unit.h"

#include <stddef.h>
#include <stdint.h>

#define RLM_RUN_DIR "/run/rlm"

/* Claims a free uid in [first, first + count). Returns the lock's
 * descriptor (close-on-exec; closing it frees the uid) with the uid in
 * *uid, or -1 with a message in err. */
RLM_FN int rlm_uid_claim(uint32_t first, uint32_t count, uint32_t *uid,
                         char *err, size_t errlen);

#endif
