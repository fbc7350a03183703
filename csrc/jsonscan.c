/* jsonscan.c: see jsonscan.h. Byte loops over a line, no allocation. */
#include "jsonscan.h"

size_t rlm_json_values(const char *s, size_t n, size_t limit) {
  size_t count = 1;
  int in_string = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (in_string) {
      if (c == '\\')
        i++;
      else if (c == '"')
        in_string = 0;
    } else if (c == '"') {
      in_string = 1;
    } else if (c == ',' || c == '[' || c == '{') {
      if (++count > limit)
        break;
    }
  }
  return count;
}
