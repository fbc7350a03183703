/* sha256.h: SHA-256 (FIPS 180-4) of a byte string, for the sub-call
 * cache's keys (lua/rlm/engine/cache.lua): a key of fixed length whatever
 * the prompt's, which a host's store (ngx.shared: 65,535 bytes a key) can
 * hold. Pure: no I/O. */
#ifndef RLM_SHA256_H
#define RLM_SHA256_H

#include "unit.h"

#include <stddef.h>
#include <stdint.h>

/* The digest of s[0..len) into out. */
RLM_FN void rlm_sha256(const void *s, size_t len, uint8_t out[32]);

#endif
