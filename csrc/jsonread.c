/* jsonread.c: see jsonread.h. */
#include "jsonread.h"
#include "utf8.h"

#include <string.h>

typedef struct jreader {
  const char *s;
  size_t n, at;
  rlm_jtok *t;
  size_t max, used;
} jreader;

static void skip_space(jreader *r) {
  while (r->at < r->n && (r->s[r->at] == ' ' || r->s[r->at] == '\t' ||
                          r->s[r->at] == '\n' || r->s[r->at] == '\r'))
    r->at++;
}

static long new_token(jreader *r, unsigned char type) {
  if (r->used >= r->max)
    return -1;
  rlm_jtok *k = &r->t[r->used];
  memset(k, 0, sizeof(*k));
  k->type = type;
  k->start = r->at;
  return (long)r->used++;
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

/* A \u escape at s[at] (the backslash): its code point, a surrogate pair
 * whole; the bytes it spans in *len. -1 when malformed (a lone surrogate
 * among them: lua-cjson refuses those too). */
static long unicode_escape(const char *s, size_t n, size_t at, size_t *len) {
  unsigned hi, lo;
  s += at;
  n -= at;
  if (n < 6 || !hex4(s + 2, &hi) || (hi >= 0xDC00 && hi <= 0xDFFF))
    return -1;
  if (hi < 0xD800 || hi > 0xDBFF) {
    *len = 6;
    return (long)hi;
  }
  if (n < 12 || s[6] != '\\' || s[7] != 'u' || !hex4(s + 8, &lo) ||
      lo < 0xDC00 || lo > 0xDFFF)
    return -1;
  *len = 12;
  return (long)(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00));
}

/* Code point cp as UTF-8 at out (4 bytes of room); how many bytes. */
static size_t utf8_put(char *out, unsigned cp) {
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

static int parse_string(jreader *r) {
  r->at++; /* the opening quote */
  long k = new_token(r, RLM_JT_STRING);
  if (k < 0)
    return -1;
  while (r->at < r->n) {
    unsigned char c = (unsigned char)r->s[r->at];
    if (c == '"') {
      r->t[k].end = r->at++;
      r->t[k].next = r->used;
      return 0;
    }
    if (c < 0x20)
      return -1;
    if (c == '\\') {
      if (r->at + 1 >= r->n)
        return -1;
      char e = r->s[r->at + 1];
      if (e == 'u') {
        size_t len;
        if (unicode_escape(r->s, r->n, r->at, &len) < 0)
          return -1;
        r->at += len;
      } else if (strchr("\"\\/bfnrt", e) != NULL && e != '\0') {
        r->at += 2;
      } else {
        return -1;
      }
      continue;
    }
    size_t len =
        rlm_utf8_sequence((const unsigned char *)r->s + r->at, r->n - r->at);
    if (len == 0)
      return -1;
    r->at += len;
  }
  return -1; /* no closing quote */
}

static int digits(jreader *r) {
  size_t from = r->at;
  while (r->at < r->n && r->s[r->at] >= '0' && r->s[r->at] <= '9')
    r->at++;
  return r->at > from ? 0 : -1;
}

static int parse_number(jreader *r) {
  long k = new_token(r, RLM_JT_NUMBER);
  if (k < 0)
    return -1;
  if (r->s[r->at] == '-')
    r->at++;
  if (r->at < r->n && r->s[r->at] == '0')
    r->at++;
  else if (digits(r) != 0)
    return -1;
  if (r->at < r->n && r->s[r->at] == '.') {
    r->at++;
    if (digits(r) != 0)
      return -1;
  }
  if (r->at < r->n && (r->s[r->at] == 'e' || r->s[r->at] == 'E')) {
    r->at++;
    if (r->at < r->n && (r->s[r->at] == '+' || r->s[r->at] == '-'))
      r->at++;
    if (digits(r) != 0)
      return -1;
  }
  r->t[k].end = r->at;
  r->t[k].next = r->used;
  return 0;
}

static int parse_word(jreader *r, const char *word, unsigned char type) {
  size_t len = strlen(word);
  if (r->n - r->at < len || memcmp(r->s + r->at, word, len) != 0)
    return -1;
  long k = new_token(r, type);
  if (k < 0)
    return -1;
  r->at += len;
  r->t[k].end = r->at;
  r->t[k].next = r->used;
  return 0;
}

static int parse_value(jreader *r, unsigned depth);

/* An array or an object, from its opening bracket. */
static int parse_container(jreader *r, unsigned depth, int object) {
  if (depth == 0)
    return -1;
  long k = new_token(r, object ? RLM_JT_OBJECT : RLM_JT_ARRAY);
  if (k < 0)
    return -1;
  char close = object ? '}' : ']';
  r->at++;
  skip_space(r);
  if (r->at < r->n && r->s[r->at] == close) {
    r->at++;
    r->t[k].end = r->at;
    r->t[k].next = r->used;
    return 0;
  }
  size_t count = 0;
  for (;;) {
    skip_space(r);
    if (object) {
      if (r->at >= r->n || r->s[r->at] != '"' || parse_string(r) != 0)
        return -1;
      skip_space(r);
      if (r->at >= r->n || r->s[r->at] != ':')
        return -1;
      r->at++;
    }
    if (parse_value(r, depth - 1) != 0)
      return -1;
    count++;
    skip_space(r);
    if (r->at >= r->n)
      return -1;
    if (r->s[r->at] == ',') {
      r->at++;
      continue;
    }
    if (r->s[r->at] != close)
      return -1;
    r->at++;
    r->t[k].end = r->at;
    r->t[k].count = count;
    r->t[k].next = r->used;
    return 0;
  }
}

static int parse_value(jreader *r, unsigned depth) {
  skip_space(r);
  if (r->at >= r->n)
    return -1;
  switch (r->s[r->at]) {
  case '{':
    return parse_container(r, depth, 1);
  case '[':
    return parse_container(r, depth, 0);
  case '"':
    return parse_string(r);
  case 't':
    return parse_word(r, "true", RLM_JT_TRUE);
  case 'f':
    return parse_word(r, "false", RLM_JT_FALSE);
  case 'n':
    return parse_word(r, "null", RLM_JT_NULL);
  default:
    if (r->s[r->at] == '-' || (r->s[r->at] >= '0' && r->s[r->at] <= '9'))
      return parse_number(r);
    return -1;
  }
}

long rlm_json_parse(const char *s, size_t n, rlm_jtok *t, size_t max,
                    unsigned depth) {
  jreader r = {.s = s, .n = n, .at = 0, .t = t, .max = max, .used = 0};
  if (n > (size_t)-1 / 2 || parse_value(&r, depth + 1) != 0)
    return -1;
  skip_space(&r);
  return r.at == n ? (long)r.used : -1;
}

long rlm_json_string(const char *s, const rlm_jtok *t, long i, char *out,
                     size_t cap) {
  if (i < 0 || t[i].type != RLM_JT_STRING || cap == 0)
    return -1;
  size_t at = t[i].start, end = t[i].end, len = 0;
  while (at < end) {
    /* A run without escapes at once (the probe's report holds 300 KB of
     * base64, decoded in place: out may be s itself). */
    const char *bs = memchr(s + at, '\\', end - at);
    size_t run = (bs != NULL ? (size_t)(bs - s) : end) - at;
    if (run > 0) {
      if (len + run >= cap)
        return -1;
      memmove(out + len, s + at, run);
      len += run;
      at += run;
      continue;
    }
    char tmp[4], e = s[at + 1];
    size_t w = 1;
    if (e == 'u') {
      size_t span;
      long c = unicode_escape(s, end, at, &span);
      if (c <= 0)
        return -1; /* malformed (the parse saw to that), or a NUL */
      w = utf8_put(tmp, (unsigned)c);
      at += span;
    } else {
      static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
      const char *p = strchr(from, e);
      if (p == NULL || e == '\0')
        return -1;
      tmp[0] = to[p - from];
      at += 2;
    }
    if (len + w >= cap)
      return -1;
    memcpy(out + len, tmp, w);
    len += w;
  }
  out[len] = '\0';
  return (long)len;
}

long rlm_json_get(const char *s, const rlm_jtok *t, long obj, const char *key) {
  if (obj < 0 || t[obj].type != RLM_JT_OBJECT)
    return -1;
  size_t klen = strlen(key);
  long k = obj + 1;
  for (size_t m = 0; m < t[obj].count; m++) {
    long v = k + 1;
    char name[128];
    if (klen < sizeof(name) &&
        rlm_json_string(s, t, k, name, sizeof(name)) == (long)klen &&
        memcmp(name, key, klen) == 0)
      return v;
    k = (long)t[v].next;
  }
  return -1;
}

int rlm_json_int(const char *s, const rlm_jtok *t, long i, int64_t *out) {
  if (i < 0 || t[i].type != RLM_JT_NUMBER)
    return -1;
  size_t at = t[i].start, end = t[i].end;
  int neg = s[at] == '-';
  if (neg)
    at++;
  uint64_t v = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (; at < end; at++) {
    char c = s[at];
    if (c < '0' || c > '9')
      return -1; /* a fraction or an exponent */
    unsigned d = (unsigned)(c - '0');
    if (v > (limit - d) / 10)
      return -1;
    v = v * 10 + d;
  }
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return 0;
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
