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

/* What CPython's str of s[0..len) decoded as UTF-8 with "surrogateescape"
 * holds (the driver's text context): its characters in *chars (each byte
 * that is not part of a valid sequence is one, U+DC80 to U+DCFF) and the
 * bytes each takes in *width (PEP 393: 1 when every code point is below
 * U+0100, 2 below U+10000, else 4). Returns *chars times *width, the
 * characters' storage without the object's header. */
RLM_FN uint64_t rlm_utf8_str_size(const unsigned char *s, size_t len,
                                  uint64_t *chars, int *width);

#endif
