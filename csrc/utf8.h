/* utf8.h: counting UTF-8 characters in bytes, for truncation and the
 * context's description, and finding where bytes stop being valid UTF-8
 * (the log's repair, core.utf8_clean; a context's check, core.utf8_valid).
 * lua/rlm/base/text.lua is the one Lua module over these. A lead
 * byte starts a character; stray continuation bytes count with the
 * character before them, so any bytes count, UTF-8 or not. Pure: no I/O. */
#ifndef RLM_UTF8_H
#define RLM_UTF8_H

#include "unit.h"

#include <stddef.h>
#include <stdint.h>

/* The byte length of the first n characters of s[0..len) (all of s when it
 * holds n or fewer; none for n <= 0), and in *chars how many characters
 * that length holds: n, or all of s's when it holds fewer. */
RLM_FN size_t rlm_utf8_prefix(const unsigned char *s, size_t len, int64_t n,
                              int64_t *chars);

/* The length of the valid UTF-8 sequence that starts at s[0] (1 for
 * ASCII), or 0 when it is not one: no overlong form, surrogate or code
 * point past U+10FFFF, and no sequence cut off by the end at s + len. */
RLM_FN size_t rlm_utf8_sequence(const unsigned char *s, size_t len);

/* The length of the longest prefix of s[0..len) that is valid UTF-8. */
RLM_FN size_t rlm_utf8_valid(const unsigned char *s, size_t len);

#endif
