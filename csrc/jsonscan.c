/* jsonscan.c: see jsonscan.h. Byte loops over a line, no allocation. */
#include "jsonscan.h"

#include <string.h>

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

static int hex4(const char *s, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = s[i];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= (unsigned)(c - 'A' + 10);
    else
      return 0;
  }
  *out = v;
  return 1;
}

int rlm_json_unicode_escape(const char *s, size_t left, unsigned *cp,
                            size_t *used) {
  unsigned hi, lo;
  if (left < 6 || !hex4(s + 2, &hi) || (hi >= 0xDC00 && hi <= 0xDFFF))
    return 0;
  if (hi < 0xD800 || hi > 0xDBFF) {
    *cp = hi, *used = 6;
    return 1;
  }
  if (left < 12 || s[6] != '\\' || s[7] != 'u' || !hex4(s + 8, &lo) ||
      lo < 0xDC00 || lo > 0xDFFF)
    return 0;
  *cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
  *used = 12;
  return 1;
}

size_t rlm_utf8_put(char *out, unsigned cp) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* The escape at s[0] == '\\': its bytes in *used, and the bytes it stands
 * for written to out (at most *used of them) when out is not NULL. 0 when
 * it is not one of JSON's. */
static size_t unescape(const char *s, size_t left, char *out, size_t *used) {
  static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
  const char *k = left >= 2 && s[1] != '\0' ? strchr(from, s[1]) : NULL;
  if (k != NULL) {
    if (out != NULL)
      out[0] = to[k - from];
    *used = 2;
    return 1;
  }
  unsigned cp;
  if (left < 2 || s[1] != 'u' || !rlm_json_unicode_escape(s, left, &cp, used))
    return 0;
  char tmp[4];
  return rlm_utf8_put(out != NULL ? out : tmp, cp);
}

#define QUICK_HEAD "{\"type\":\"llm_query\",\"prompt\":\""
#define QUICK_ID "\",\"id\":"

int rlm_quick_query(char *line, size_t n, char **prompt, size_t *len,
                    unsigned long *id) {
  size_t head = sizeof(QUICK_HEAD) - 1, at = head, escapes = 0;
  if (n < head || memcmp(line, QUICK_HEAD, head) != 0)
    return 0;
  /* The first pass reads the string and proves every escape good; only
   * then is anything written. */
  while (at < n && line[at] != '"') {
    if (line[at] == '\\') {
      size_t used;
      if (unescape(line + at, n - at, NULL, &used) == 0)
        return 0;
      at += used;
      escapes++;
    } else if (line[at] == '\0') {
      return 0;
    } else {
      at++;
    }
  }
  size_t end = at, tail = sizeof(QUICK_ID) - 1;
  if (end >= n || n - end < tail + 2 || memcmp(line + end, QUICK_ID, tail))
    return 0;
  const char *digits = line + end + tail;
  size_t ndigits = n - end - tail - 1;
  if (line[n - 1] != '}' || ndigits > 10 || (digits[0] == '0' && ndigits > 1))
    return 0;
  unsigned long v = 0;
  for (size_t i = 0; i < ndigits; i++) {
    if (digits[i] < '0' || digits[i] > '9')
      return 0;
    v = v * 10 + (unsigned long)(digits[i] - '0');
  }
  if (v > 0x7FFFFFFFUL)
    return 0;
  char *w = line + head;
  if (escapes > 0) {
    for (size_t r = head; r < end;) {
      size_t used;
      if (line[r] == '\\') {
        w += unescape(line + r, end - r, w, &used);
        r += used;
      } else {
        *w++ = line[r++];
      }
    }
  } else {
    w = line + end;
  }
  *prompt = line + head;
  *len = (size_t)(w - (line + head));
  *id = v;
  return 1;
}

/* How many bytes byte c takes inside a JSON string: 2 for `"`, `\` and the
 * control characters with a short escape, 6 for the other control
 * characters (\u00XX), else 1. */
static size_t escape_width(unsigned char c) {
  switch (c) {
  case '"':
  case '\\':
  case '\b':
  case '\f':
  case '\n':
  case '\r':
  case '\t':
    return 2;
  default:
    return c < 0x20 ? 6 : 1;
  }
}

size_t rlm_json_escaped_len(const char *s, size_t n) {
  size_t len = 0;
  for (size_t i = 0; i < n; i++)
    len += escape_width((unsigned char)s[i]);
  return len;
}

void rlm_json_escape(const char *s, size_t n, char *out) {
  static const char hex[] = "0123456789abcdef";
  static const char from[] = "\"\\\b\f\n\r\t", to[] = "\"\\bfnrt";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    size_t width = escape_width(c);
    if (width == 1) {
      *out++ = (char)c;
    } else if (width == 2) {
      out[0] = '\\';
      out[1] = to[strchr(from, c) - from];
      out += 2;
    } else {
      memcpy(out, "\\u00", 4);
      out[4] = hex[c >> 4];
      out[5] = hex[c & 0xF];
      out += 6;
    }
  }
}
