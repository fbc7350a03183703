/* framing.c: see framing.h. The partial line grows by doubling, never past
 * max + 1 bytes, whatever the stream holds. */
#include "framing.h"

#include <stdlib.h>
#include <string.h>

static int append(rlm_framer *f, const char *p, size_t n) {
  if (n > f->max - f->len)
    return -1;
  if (f->len + n + 1 > f->cap) {
    size_t cap = f->cap ? f->cap : 4096;
    while (cap < f->len + n + 1)
      cap *= 2;
    if (cap > f->max + 1)
      cap = f->max + 1;
    char *line = realloc(f->line, cap);
    if (line == NULL)
      return -1;
    f->line = line;
    f->cap = cap;
  }
  memcpy(f->line + f->len, p, n);
  f->len += n;
  f->line[f->len] = '\0';
  return 0;
}

int rlm_framer_feed(rlm_framer *f, const char *p, size_t n, rlm_line_fn fn,
                    void *ud) {
  const char *end = p + n;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t chunk = (size_t)((nl ? nl : end) - p);
    if (append(f, p, chunk) != 0)
      return RLM_FRAME_OVERFLOW;
    p += chunk;
    if (nl == NULL)
      break;
    p++;
    if (f->line == NULL && append(f, "", 0) != 0) /* an empty line */
      return RLM_FRAME_OVERFLOW;
    char *line = f->line;
    size_t len = f->len;
    f->line = NULL;
    f->len = f->cap = 0;
    if (fn(ud, line, len) != 0)
      return RLM_FRAME_STOPPED;
  }
  return RLM_FRAME_OK;
}

void rlm_framer_free(rlm_framer *f) {
  free(f->line);
  f->line = NULL;
  f->len = f->cap = 0;
}
