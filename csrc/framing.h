/* framing.h: newline-delimited lines out of a byte stream, each at most
 * `max` bytes: what the host makes of the driver's stdout. Pure: no I/O,
 * so that it can be fuzzed on its own. */
#ifndef RLM_FRAMING_H
#define RLM_FRAMING_H

#include <stddef.h>

typedef struct rlm_framer {
  char *line; /* the partial line so far */
  size_t len, cap, max;
} rlm_framer;

/* Called for each complete line, without its newline, NUL-terminated; the
 * callee owns `line` (free it). Returns 0 to go on, nonzero to stop. */
typedef int (*rlm_line_fn)(void *ud, char *line, size_t len);

enum { RLM_FRAME_OK = 0, RLM_FRAME_STOPPED = 1, RLM_FRAME_OVERFLOW = -1 };

/* Feeds n bytes. Returns RLM_FRAME_OK, RLM_FRAME_STOPPED when a callback
 * asked to stop, or RLM_FRAME_OVERFLOW when a line passed max (or memory
 * ran out): the framer is then unusable but for rlm_framer_free. */
int rlm_framer_feed(rlm_framer *f, const char *p, size_t n, rlm_line_fn fn,
                    void *ud);
void rlm_framer_free(rlm_framer *f);

#endif
