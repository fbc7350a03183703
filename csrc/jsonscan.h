/* jsonscan.h: what the host reads of a JSON line before it decodes it: a
 * bound on the values a line holds, so that a line that would build too
 * much is refused unread. Pure: no I/O, no Lua, so that it can be fuzzed on
 * its own beside the framer. */
#ifndef RLM_JSONSCAN_H
#define RLM_JSONSCAN_H

#include "unit.h"

#include <stddef.h>

/* An upper bound on the number of JSON values in s (1 + the commas,
 * brackets and braces outside strings): what decoding it can build. Stops
 * counting past limit. Whatever s holds, even what is not JSON. */
RLM_FN size_t rlm_json_values(const char *s, size_t n, size_t limit);

#endif
