/* framing.c: see framing.h. The model is cqueues' lso_fill/lso_getline: one
 * buffer, read into at its end, lines taken from its start; the partial
 * line is moved to the front only when room is needed, and the buffer grows
 * by doubling, never past max + 1 bytes. */
#define _GNU_SOURCE
#include "framing.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define FRAMER_MIN 4096
/* An emptied buffer larger than this is given back: one long line must not
 * pin its size for the life of the session. */
#define FRAMER_KEEP (256u << 10)

static size_t used(const rlm_framer *f) { return f->end - f->start; }

/* A buffer past FRAMER_KEEP is mapped, not malloc'd: freeing it gives its
 * pages back to the system at once (glibc would keep a large freed chunk in
 * its heap once its mmap threshold has grown). */
static void buf_free(char *buf, size_t cap) {
  if (cap > FRAMER_KEEP)
    munmap(buf, cap);
  else
    free(buf);
}

static char *buf_resize(char *buf, size_t cap, size_t n, size_t new_cap) {
  if (new_cap <= FRAMER_KEEP)
    return realloc(buf, new_cap);
  if (cap > FRAMER_KEEP) {
    void *p = mremap(buf, cap, new_cap, MREMAP_MAYMOVE);
    return p == MAP_FAILED ? NULL : p;
  }
  void *p = mmap(NULL, new_cap, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  if (n > 0)
    memcpy(p, buf, n);
  free(buf);
  return p;
}

/* The newline of the first complete line, or NULL. Bytes already scanned
 * are not scanned again, so a long line costs O(its length) in all. */
static char *find_newline(rlm_framer *f) {
  if (f->buf == NULL || f->scan >= used(f))
    return NULL;
  char *from = f->buf + f->start + f->scan;
  char *nl = memchr(from, '\n', f->end - f->start - f->scan);
  if (nl == NULL)
    f->scan = used(f);
  return nl;
}

int rlm_framer_ready(rlm_framer *f) { return find_newline(f) != NULL; }

int rlm_framer_overflowed(const rlm_framer *f) {
  return f->scan == used(f) && used(f) > f->max;
}

char *rlm_framer_space(rlm_framer *f, size_t want, size_t *len) {
  *len = 0;
  if (want == 0)
    want = 1;
  size_t limit = f->max + 1;
  size_t n = used(f);
  if (n >= limit)
    return NULL; /* a partial line past max, or lines not taken */
  rlm_framer_trim(f);
  if (f->cap - f->end < want && f->start > 0) {
    memmove(f->buf, f->buf + f->start, n);
    f->end = n;
    f->start = 0;
  }
  if (f->cap - f->end < want && f->cap < limit) {
    size_t cap = f->cap ? f->cap : FRAMER_MIN;
    while (cap < n + want && cap < limit)
      cap = cap > limit / 2 ? limit : cap * 2;
    if (cap > limit)
      cap = limit;
    char *buf = buf_resize(f->buf, f->cap, f->end, cap);
    if (buf == NULL)
      return NULL;
    f->buf = buf;
    f->cap = cap;
  }
  size_t room = f->cap - f->end;
  if (room == 0)
    return NULL;
  *len = room < want ? room : want;
  return f->buf + f->end;
}

void rlm_framer_commit(rlm_framer *f, size_t n) { f->end += n; }

int rlm_framer_next(rlm_framer *f, const char **line, size_t *len) {
  char *nl = find_newline(f);
  if (nl == NULL)
    return 0;
  *nl = '\0';
  *line = f->buf + f->start;
  *len = (size_t)(nl - *line);
  f->start += *len + 1;
  f->scan = 0;
  if (f->start == f->end)
    f->start = f->end = 0; /* the view stays valid: nothing moves */
  return 1;
}

void rlm_framer_trim(rlm_framer *f) {
  size_t n = used(f);
  if (f->cap <= FRAMER_KEEP || n > FRAMER_KEEP / 2)
    return;
  char *small = NULL;
  if (n > 0) {
    small = malloc(FRAMER_KEEP);
    if (small == NULL)
      return; /* keep the large one */
    memcpy(small, f->buf + f->start, n);
  }
  buf_free(f->buf, f->cap);
  f->buf = small;
  f->cap = small ? FRAMER_KEEP : 0;
  f->start = 0;
  f->end = n;
  /* scan counts from start: unchanged */
}

void rlm_framer_reset(rlm_framer *f) {
  if (f->buf != NULL)
    buf_free(f->buf, f->cap);
  f->buf = NULL;
  f->cap = f->start = f->end = f->scan = 0;
}

void rlm_framer_free(rlm_framer *f) { rlm_framer_reset(f); }
