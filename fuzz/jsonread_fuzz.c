/* jsonread_fuzz.c: libFuzzer harness for the strict JSON reader rlm-keeper
 * reads the host's messages and the probe's report with
 * (csrc/jsonread.c). A crash, a read past the input, a token whose bytes
 * lie outside it or whose subtree does not end where the next begins, a
 * string that decodes to more bytes than it spans (or otherwise in place
 * than into a buffer of its own), or an integer that
 * prints back otherwise than it reads (-0 reads as 0), is a finding. */
/* jsonread.c and utf8.c are static units (csrc/unit.h): take them
 * whole. */
#include "../csrc/jsonread.c"
#include "../csrc/utf8.c"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_TOKENS 256

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* A copy of exactly size bytes: ASan sees any read past it. */
  char *s = malloc(size ? size : 1);
  if (s == NULL)
    return 0;
  memcpy(s, data, size);
  rlm_jtok t[MAX_TOKENS];
  long n = rlm_json_parse(s, size, t, MAX_TOKENS, 16);
  for (long i = 0; i < n; i++) {
    if (t[i].start > t[i].end || t[i].end > size || t[i].next <= (size_t)i ||
        t[i].next > (size_t)n)
      abort();
    if (t[i].type == RLM_JT_STRING) {
      char out[4096];
      long len = rlm_json_string(s, t, i, out, sizeof(out));
      if (len > (long)(t[i].end - t[i].start))
        abort();
      /* Decoded over its own bytes, as the probe's report is: the same. */
      size_t span = t[i].end - t[i].start;
      char *in_place = malloc(size ? size : 1);
      if (in_place != NULL && len >= 0 && span < sizeof(out)) {
        memcpy(in_place, s, size);
        long again =
            rlm_json_string(in_place, t, i, in_place + t[i].start, span + 1);
        if (again != len ||
            memcmp(in_place + t[i].start, out, (size_t)len) != 0)
          abort();
      }
      free(in_place);
    }
    int64_t v;
    if (rlm_json_int(s, t, i, &v) == 0) {
      char back[32];
      int w = snprintf(back, sizeof(back), "%" PRId64, v);
      int minus_zero =
          t[i].end - t[i].start == 2 && memcmp(s + t[i].start, "-0", 2) == 0;
      if (minus_zero ? v != 0
                     : (size_t)w != t[i].end - t[i].start ||
                           memcmp(back, s + t[i].start, (size_t)w) != 0)
        abort();
    }
  }
  if (n > 0) {
    (void)rlm_json_get(s, t, 0, "type");
    (void)rlm_json_get(s, t, 0, "rlimits");
  }
  free(s);
  return 0;
}
