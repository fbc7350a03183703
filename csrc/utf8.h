/* utf8.h: counting UTF-8 characters in bytes, for truncation and the
 * context's description (lua/rlm/text.lua, prompt.lua through it). A lead
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

#endif
