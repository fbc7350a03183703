/* framing.h: newline-delimited lines out of a byte stream, each at most
 * `max` bytes: what the host makes of the driver's stdout. One buffer per
 * stream, never larger than max + 1 bytes: the caller reads into its free
 * end and takes complete lines out of it as views, so a flood of short
 * lines costs no allocation per line, and bytes not yet taken stay bounded
 * by the buffer (the caller stops reading while a complete line waits).
 * Pure: no I/O, so that it can be fuzzed on its own. */
#ifndef RLM_FRAMING_H
#define RLM_FRAMING_H

#include "unit.h"

#include <stddef.h>

typedef struct rlm_framer {
  char *buf;
  size_t cap;   /* allocated; at most max + 1 */
  size_t max;   /* the longest line, without its newline */
  size_t start; /* the first byte not yet taken */
  size_t end;   /* one past the last byte read */
  size_t scan;  /* bytes from start known to hold no newline */
} rlm_framer;

/* Where the next read may write: at least 1 byte, at most `want`, at the
 * free end of the buffer (compacted and grown as needed, never past
 * max + 1 bytes in all). Returns NULL with *len 0 when there is no room: the
 * partial line has reached max + 1 bytes without a newline (an overflow), or
 * memory ran out. */
RLM_FN char *rlm_framer_space(rlm_framer *f, size_t want, size_t *len);

/* The caller wrote n bytes at the pointer rlm_framer_space returned. */
RLM_FN void rlm_framer_commit(rlm_framer *f, size_t n);

/* Takes the next complete line: *line points into the buffer (its newline
 * replaced by a NUL) and stays valid until the next space/commit/free.
 * Returns 1, or 0 when no complete line is held. */
RLM_FN int rlm_framer_next(rlm_framer *f, const char **line, size_t *len);

/* Whether a complete line is held (it does not take it). */
RLM_FN int rlm_framer_ready(rlm_framer *f);

/* Whether the partial line has passed max: the stream is broken. */
RLM_FN int rlm_framer_overflowed(const rlm_framer *f);

/* Gives a large buffer back when it holds little (after a long line was
 * taken and copied), moving what it holds to a small one. Invalidates the
 * last line's view. */
RLM_FN void rlm_framer_trim(rlm_framer *f);

/* Forgets every byte held and frees the buffer; the framer may be used
 * again. */
RLM_FN void rlm_framer_reset(rlm_framer *f);
RLM_FN void rlm_framer_free(rlm_framer *f);

#endif
