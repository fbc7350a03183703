/* base64.c: see base64.h. */
#include "base64.h"

long rlm_base64_decode(const char *text, size_t len, char *out) {
  const unsigned char *s = (const unsigned char *)text;
  if (len % 4 != 0)
    return -1;
  long n = 0;
  for (size_t i = 0; i < len; i += 4) {
    unsigned v = 0;
    int pad = 0;
    for (int k = 0; k < 4; k++) {
      unsigned char c = s[i + k];
      int x = c >= 'A' && c <= 'Z'   ? c - 'A'
              : c >= 'a' && c <= 'z' ? c - 'a' + 26
              : c >= '0' && c <= '9' ? c - '0' + 52
              : c == '+'             ? 62
              : c == '/'             ? 63
                                     : -1;
      if (c == '=' && i + 4 == len && k >= 2 && (k == 3 || s[i + 3] == '=')) {
        pad++;
        x = 0;
      } else if (x < 0 || pad > 0) {
        return -1;
      }
      v = v << 6 | (unsigned)x;
    }
    char three[3] = {(char)(v >> 16), (char)(v >> 8 & 0xff), (char)(v & 0xff)};
    for (int k = 0; k < 3 - pad; k++)
      out[n++] = three[k];
  }
  return n;
}
