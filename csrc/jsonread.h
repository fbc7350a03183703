/* jsonread.h: a small strict JSON reader (RFC 8259) for what rlm-keeper
 * reads: the host's start message, the host's load_context line and the
 * probe's report. One pass into a caller's array of tokens: no allocation,
 * a bounded depth (recursion) and a bounded token count, strings checked
 * (escapes, surrogate pairs, UTF-8) but left in place, and read out with
 * rlm_json_string into a caller's buffer. And the escape of the strings
 * rlm-keeper writes. Pure: no I/O, so that it can be fuzzed on its own
 * (fuzz/jsonread_fuzz.c). */
#ifndef RLM_JSONREAD_H
#define RLM_JSONREAD_H

#include "unit.h"

#include <stddef.h>
#include <stdint.h>

enum {
  RLM_JT_NULL,
  RLM_JT_FALSE,
  RLM_JT_TRUE,
  RLM_JT_NUMBER,
  RLM_JT_STRING,
  RLM_JT_ARRAY,
  RLM_JT_OBJECT
};

typedef struct rlm_jtok {
  unsigned char type;
  size_t start, end; /* the value's bytes; a string's without its quotes */
  size_t count;      /* an array's elements, an object's members */
  size_t next;       /* the index of the token after this value's own */
} rlm_jtok;

/* Parses s[0..n) as one JSON value with only whitespace around it, into at
 * most max tokens (an object's keys are tokens too), nested at most depth
 * arrays and objects deep. Returns how many tokens, or -1: not JSON, more
 * tokens or depth than allowed, or n past what a size_t offset holds. */
RLM_FN long rlm_json_parse(const char *s, size_t n, rlm_jtok *t, size_t max,
                           unsigned depth);

/* The token of the value of `key` in the object at t[obj], or -1 (not an
 * object, no such key). A key that appears twice: the first. */
RLM_FN long rlm_json_get(const char *s, const rlm_jtok *t, long obj,
                         const char *key);

/* The string at t[i], its escapes decoded, into out (at most cap - 1 bytes
 * and a NUL). Returns its length, or -1: not a string, too long, or it holds
 * a NUL (\u0000). */
RLM_FN long rlm_json_string(const char *s, const rlm_jtok *t, long i, char *out,
                            size_t cap);

/* The integer at t[i] (no fraction, no exponent, within int64): 0 and
 * *out, or -1. */
RLM_FN int rlm_json_int(const char *s, const rlm_jtok *t, long i, int64_t *out);

/* The bytes of s as the inside of a JSON string: `"`, `\` and the control
 * characters escaped, every other byte as it is. rlm_json_escaped_len says
 * how many that is (n when nothing needs an escape); rlm_json_escape writes
 * them to out, which holds that many. */
RLM_FN size_t rlm_json_escaped_len(const char *s, size_t n);
RLM_FN void rlm_json_escape(const char *s, size_t n, char *out);

#endif
