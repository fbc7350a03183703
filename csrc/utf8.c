/* utf8.c: see utf8.h. Eight bytes at a time: a continuation byte
 * (10xxxxxx) is found in a word by its top two bits, and the flags of many
 * words are summed in their byte lanes before the lanes are added up. */
#include "utf8.h"

#include <string.h>

/* The continuation bytes among the 8 bytes at p, each as a 1 in its byte's
 * lowest bit. */
static uint64_t continuation_flags(const unsigned char *p) {
  uint64_t w;
  memcpy(&w, p, sizeof(w));
  return (w & ~(w << 1) & 0x8080808080808080ULL) >> 7;
}

/* The continuation bytes in s[0..n): the flags of up to 255 words summed
 * in their byte lanes, then the lanes added up. */
static size_t count_continuations(const unsigned char *s, size_t n) {
  size_t total = 0, i = 0;
  while (n - i >= 8) {
    size_t words = (n - i) / 8 > 255 ? 255 : (n - i) / 8;
    uint64_t lanes = 0;
    for (size_t k = 0; k < words; k++, i += 8)
      lanes += continuation_flags(s + i);
    lanes = (lanes & 0x00FF00FF00FF00FFULL) +
            ((lanes >> 8) & 0x00FF00FF00FF00FFULL);
    total += (size_t)((lanes * 0x0001000100010001ULL) >> 48);
  }
  for (; i < n; i++)
    total += (s[i] & 0xC0) == 0x80;
  return total;
}

size_t rlm_utf8_prefix(const unsigned char *s, size_t len, int64_t n,
                       int64_t *chars) {
  if (n >= 0 && (uint64_t)n >= len) { /* all of it: a byte that is not a
                                          continuation byte starts one */
    *chars = (int64_t)(len - count_continuations(s, len));
    return len;
  }
  int64_t seen = 0;
  size_t i = 0;
  /* Eight bytes at a time while the n-th character cannot be among them. */
  while (len - i >= 8 && n - seen > 8) {
    uint64_t f = continuation_flags(s + i);
    seen += 8 - (int64_t)((f * 0x0101010101010101ULL) >> 56);
    i += 8;
  }
  for (; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) {
      if (seen == n)
        break;
      seen++;
    }
  }
  *chars = seen;
  return i;
}

static int continuation(const unsigned char *s, size_t len, size_t i) {
  return i < len && (s[i] & 0xC0) == 0x80;
}

size_t rlm_utf8_sequence(const unsigned char *s, size_t len) {
  unsigned c = s[0];
  if (c < 0x80)
    return 1;
  if (c >= 0xC2 && c <= 0xDF)
    return continuation(s, len, 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    unsigned lo = c == 0xE0 ? 0xA0 : 0x80; /* no overlong forms */
    unsigned hi = c == 0xED ? 0x9F : 0xBF; /* no surrogates */
    return len > 1 && s[1] >= lo && s[1] <= hi && continuation(s, len, 2) ? 3
                                                                          : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    unsigned lo = c == 0xF0 ? 0x90 : 0x80;
    unsigned hi = c == 0xF4 ? 0x8F : 0xBF; /* nothing past U+10FFFF */
    return len > 1 && s[1] >= lo && s[1] <= hi && continuation(s, len, 2) &&
                   continuation(s, len, 3)
               ? 4
               : 0;
  }
  return 0;
}

size_t rlm_utf8_valid(const unsigned char *s, size_t len) {
  size_t i = 0;
  while (i < len) {
    /* ASCII eight bytes at a time. */
    while (len - i >= 8) {
      uint64_t w;
      memcpy(&w, s + i, sizeof(w));
      if (w & 0x8080808080808080ULL)
        break;
      i += 8;
    }
    if (i == len)
      break;
    size_t n = rlm_utf8_sequence(s + i, len - i);
    if (n == 0)
      break;
    i += n;
  }
  return i;
}

uint64_t rlm_utf8_str_size(const unsigned char *s, size_t len, uint64_t *chars,
                           int *width) {
  uint64_t n = 0;
  int w = 1;
  size_t i = 0;
  while (i < len) {
    /* ASCII eight bytes at a time. */
    while (len - i >= 8) {
      uint64_t word;
      memcpy(&word, s + i, sizeof(word));
      if (word & 0x8080808080808080ULL)
        break;
      i += 8;
      n += 8;
    }
    if (i == len)
      break;
    size_t k = rlm_utf8_sequence(s + i, len - i);
    int need = k == 0   ? 2 /* a lone surrogate */
               : k == 1 ? 1
               : k == 2 ? (s[i] <= 0xC3 ? 1 : 2) /* below U+0100: Latin-1 */
               : k == 3 ? 2
                        : 4;
    if (need > w)
      w = need;
    n++;
    i += k == 0 ? 1 : k;
  }
  *chars = n;
  *width = w;
  return n * (uint64_t)w;
}
