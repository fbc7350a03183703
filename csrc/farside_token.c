/* farside_token.c: the secrets a keeper is given (docs/protocol.md): a
 * lingering keeper's attach token (farside_linger.c) and a listening
 * keeper's claim token (farside_listen.c), both of one form, lowercase
 * hex from the host's random source, and compared in a time that tells
 * nothing of where two differ. */
#define _GNU_SOURCE
#include "farside.h"

#include <string.h>

/* Whether t is min to max of [0-9a-f]. */
static int token_form_ok(const char *t, size_t min, size_t max) {
  size_t n = strlen(t);
  if (n < min || n > max)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f')))
      return 0;
  return 1;
}

/* The same bytes, in a time that depends on the lengths alone. */
static int same_secret(const char *a, const char *b) {
  size_t n = strlen(a);
  if (n != strlen(b))
    return 0;
  unsigned char diff = 0;
  for (size_t i = 0; i < n; i++)
    diff |= (unsigned char)(a[i] ^ b[i]);
  return diff == 0;
}
