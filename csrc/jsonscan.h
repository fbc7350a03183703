/* jsonscan.h: what the host reads and writes of a JSON line without
 * decoding it: a bound on the values a line holds, the lone llm_query line
 * read in place, a string's escape. Pure: no I/O, no Lua, so that it can be
 * fuzzed on its own beside the framer. */
#ifndef RLM_JSONSCAN_H
#define RLM_JSONSCAN_H

#include "unit.h"

#include <stddef.h>

/* An upper bound on the number of JSON values in s (1 + the commas,
 * brackets and braces outside strings): what decoding it can build. Stops
 * counting past limit. Whatever s holds, even what is not JSON. */
RLM_FN size_t rlm_json_values(const char *s, size_t n, size_t limit);

/* A lone llm_query as the driver writes it, and nothing else:
 * {"type":"llm_query","prompt":"...","id":N} with no space, N a decimal
 * integer of at most 2^31 - 1 without leading zeros, the string's escapes
 * those of JSON (a surrogate only in a pair). For such a line, decodes the
 * prompt in place, over the line's own bytes (it never grows), and returns 1
 * with *prompt, *len and *id set; for any other line, returns 0 and leaves
 * the line as it was (the host's full decoder reads it then). What it
 * decodes is what lua-cjson decodes from the same line. */
RLM_FN int rlm_quick_query(char *line, size_t n, char **prompt, size_t *len,
                           unsigned long *id);

/* The bytes of s as the inside of a JSON string: `"`, `\` and the control
 * characters escaped, every other byte as it is. rlm_json_escaped_len says
 * how many that is (n when nothing needs an escape); rlm_json_escape writes
 * them to out, which holds that many. */
RLM_FN size_t rlm_json_escaped_len(const char *s, size_t n);
RLM_FN void rlm_json_escape(const char *s, size_t n, char *out);

/* The code point of the escape at s[0] == '\\' (s[1] == 'u'), with the
 * bytes it takes in *used: a \uXXXX, or a surrogate pair of them. 0 when
 * it is neither (a lone surrogate: lua-cjson refuses those). */
RLM_FN int rlm_json_unicode_escape(const char *s, size_t left, unsigned *cp,
                                   size_t *used);

/* Code point cp as UTF-8 at out (4 bytes of room); how many bytes. */
RLM_FN size_t rlm_utf8_put(char *out, unsigned cp);

#endif
