/* farside_relay.c: rlm-keeper's stream, both ways (docs/protocol.md, "The
 * stream"): what waits for its stdout, every line with its channel byte (K
 * the keeper's own messages, D the driver's lines); the host's input, its
 * lines taken apart by channel (D to the driver, K: ping, start, context,
 * interrupt, deadline) and the context's raw bytes, after their message,
 * into the sealed memfd; the driver's events relayed; and the end: a
 * failure said to the host, then the driver, its canaries and the context's
 * descriptor gone. */
#define _GNU_SOURCE
#include "canary.h"
#include "farside.h"
#include "jsonread.h"
#include "workdir.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MSG_TOKENS 4096

/* --- what goes to the host ---------------------------------------------- */

static int out_room(far *f, size_t n) {
  if (f->out_keep > 0 && f->out_keep == f->out_len)
    f->out_keep = f->out_off = f->out_len = 0;
  if (f->out_len + n <= f->out_cap)
    return 0;
  if (f->out_keep > 0) {
    /* what is written and not kept goes; the kept lines and the rest move */
    memmove(f->out, f->out + f->out_keep, f->out_len - f->out_keep);
    f->out_len -= f->out_keep;
    f->out_off -= f->out_keep;
    f->out_keep = 0;
  }
  if (f->out_len + n <= f->out_cap)
    return 0;
  size_t cap = f->out_cap ? f->out_cap : 4096;
  while (cap < f->out_len + n)
    cap *= 2;
  char *more = realloc(f->out, cap);
  if (more == NULL)
    return -1;
  f->out = more;
  f->out_cap = cap;
  return 0;
}

static void out_bytes(far *f, const char *s, size_t n) {
  if (out_room(f, n) == 0) {
    memcpy(f->out + f->out_len, s, n);
    f->out_len += n;
    for (const char *nl = s; (nl = memchr(nl, '\n', n - (size_t)(nl - s)));
         nl++)
      f->out_seq++; /* a line queued: its number is the count before it */
  } else {
    f->out_broken = 1; /* no memory: the host cannot be told more */
  }
}

static void out_str(far *f, const char *s) { out_bytes(f, s, strlen(s)); }

static void out_fmt(far *f, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n > 0)
    out_bytes(f, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

/* A JSON string: the quotes and what is inside them. */
static void out_json(far *f, const char *s, size_t n) {
  size_t len = rlm_json_escaped_len(s, n);
  if (out_room(f, len + 2) != 0) {
    f->out_broken = 1;
    return;
  }
  f->out[f->out_len++] = '"';
  rlm_json_escape(s, n, f->out + f->out_len);
  f->out_len += len;
  f->out[f->out_len++] = '"';
}

static void out_jstr(far *f, const char *s) { out_json(f, s, strlen(s)); }

/* A message of the keeper's own that only says why: failed. */
static void say_failed(far *f, const char *message) {
  out_str(f, "K{\"type\":\"failed\",\"message\":");
  out_jstr(f, message);
  out_str(f, "}\n");
}

/* Lets go of written lines past what a replay keeps (all of them when the
 * host asked for no linger), a whole line at a time: out_keep is always a
 * line's start, keep_seq its number. */
static void out_trim(far *f) {
  size_t keep = f->linger_ms > 0 ? f->keep_max : 0;
  while (f->out_off - f->out_keep > keep) {
    char *nl = memchr(f->out + f->out_keep, '\n', f->out_off - f->out_keep);
    if (nl == NULL)
      break;
    f->out_keep = (size_t)(nl - f->out) + 1;
    f->keep_seq++;
  }
}

/* Writes what it can without blocking; -1 when the host is gone. */
static int flush_some(far *f) {
  while (f->pre_off < f->pre_len) {
    ssize_t n = write(f->out_fd, f->pre + f->pre_off, f->pre_len - f->pre_off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN)
      return 0;
    if (n <= 0)
      return -1;
    f->pre_off += (size_t)n;
  }
  while (f->out_off < f->out_len) {
    ssize_t n = write(f->out_fd, f->out + f->out_off, f->out_len - f->out_off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN)
      break;
    if (n <= 0)
      return -1;
    f->out_off += (size_t)n;
  }
  out_trim(f);
  return 0;
}

/* At the end: what is left, for at most ms. */
static void flush_all(far *f, int ms) {
  while (!f->detached && (f->pre_off < f->pre_len || f->out_off < f->out_len) &&
         flush_some(f) == 0) {
    struct pollfd p = {.fd = f->out_fd, .events = POLLOUT};
    if (poll(&p, 1, ms) <= 0)
      return;
  }
}

/* --- the end ------------------------------------------------------------ */

static void end_driver(far *f) {
  if (f->d != NULL) {
    rlm_driver_close(f->d); /* its keeper thread kills and reaps it */
    f->d = NULL;
  }
  if (f->planted) {
    rlm_canaries_remove(&f->canaries);
    f->planted = 0;
  }
  if (f->ctx_fd >= 0) {
    close(f->ctx_fd);
    f->ctx_fd = -1;
  }
}

/* A failure that ends the keeper: said to the host, then everything goes. */
static void fail(far *f, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (!f->ended)
    say_failed(f, msg);
  f->ended = 1;
  end_driver(f);
}

/* --- the host's messages ------------------------------------------------ */

/* The context's bytes, as they come: into the memfd, sealed at the end. */
static void context_bytes(far *f, const char *p, size_t n) {
  if (f->ctx_state == 1 && f->ctx_fd >= 0 &&
      rlm_context_append(f->ctx_fd, p, n) != 0) {
    snprintf(f->ctx_err, sizeof(f->ctx_err), "write: %s", strerror(errno));
    f->ctx_state = -1;
  }
  f->raw_left -= n;
  if (f->raw_left == 0 && f->ctx_state == 1) {
    if (rlm_context_seal(f->ctx_fd) != 0) {
      snprintf(f->ctx_err, sizeof(f->ctx_err), "seal: %s", strerror(errno));
      f->ctx_state = -1;
    } else {
      f->ctx_state = 2;
    }
    close(f->ctx_fd); /* written once: the driver's read-only open remains */
    f->ctx_fd = -1;
  }
}

/* The host's load_context, on its way to the driver: the rlimits it asks
 * for are what the check after ready reads back. */
static void note_load(far *f, const char *line, size_t len) {
  rlm_jtok t[MSG_TOKENS];
  start_msg m = {.s = line, .t = t, .root = 0};
  long n = rlm_json_parse(line, len, t, MSG_TOKENS, 64);
  char type[32];
  if (n < 1 || t[0].type != RLM_JT_OBJECT ||
      rlm_json_string(line, t, rlm_json_get(line, t, 0, "type"), type,
                      sizeof(type)) < 0 ||
      strcmp(type, "load_context") != 0)
    return; /* not load_context: no check is armed, the host fails closed */
  if (read_rlimits(f, &m, rlm_json_get(line, t, 0, "rlimits")) == 0)
    f->load_seen = 1;
}

static void keeper_message(far *f, const char *s, size_t len) {
  rlm_jtok t[MSG_TOKENS];
  long n = rlm_json_parse(s, len, t, MSG_TOKENS, 16);
  char type[32];
  if (n < 1 || t[0].type != RLM_JT_OBJECT ||
      rlm_json_string(s, t, rlm_json_get(s, t, 0, "type"), type, sizeof(type)) <
          0) {
    fail(f, "the host sent a keeper message that is not a JSON object with "
            "a type");
    return;
  }
  start_msg m = {.s = s, .t = t, .root = 0};
  int64_t v;
  if (strcmp(type, "ping") == 0) {
    /* The host's heartbeat: any byte back will do, and one pong waiting
     * is enough (a host that is not reading has bytes to read already). */
    if (f->out_len - f->out_off < OUT_HIGH)
      out_str(f, "K{\"type\":\"pong\"}\n");
  } else if (strcmp(type, "close") == 0) {
    /* The host ends the session: its end of input ends the keeper, with
     * no linger. */
    f->linger_ms = 0;
  } else if (strcmp(type, "start") == 0 && !f->started) {
    start(f, &m);
  } else if (strcmp(type, "context") == 0 && f->started && f->ctx_state == 0 &&
             field_int(&m, "bytes", 0, INT64_MAX, &v) == 0) {
    f->ctx_state = 1;
    f->raw_left = (uint64_t)v;
    if (v == 0)
      context_bytes(f, "", 0);
  } else if (strcmp(type, "interrupt") == 0 && f->d != NULL) {
    int pid = rlm_driver_interpreter_pid(f->d);
    if (pid > 0)
      (void)kill(pid, SIGINT);
  } else if (strcmp(type, "deadline") == 0 && f->d != NULL &&
             field_int(&m, "ms", 0, INT64_MAX, &v) == 0) {
    rlm_driver_set_deadline(f->d, (uint64_t)v);
  } else {
    fail(f,
         "the host sent a keeper message rlm-keeper does not take here "
         "(%s)",
         type);
  }
}

static void host_line(far *f, const char *s, size_t len) {
  if (len > 0 && s[0] == 'D')
    f->host_lines++; /* an attach says how many came (its "taken") */
  if (len > 0 && s[0] == 'D' && f->d != NULL) {
    if (f->ctx_state != 0 && !f->load_seen)
      note_load(f, s + 1, len - 1);
    (void)rlm_driver_send(f->d, s + 1, len - 1); /* a driver gone says so */
  } else if (len > 0 && s[0] == 'D' && f->started) {
    /* the driver has ended: its end is on its way to the host */
  } else if (len > 0 && s[0] == 'K') {
    keeper_message(f, s + 1, len - 1);
  } else {
    fail(f, "the host sent a line with no channel rlm-keeper knows");
  }
}

/* Everything read from stdin so far, in order: lines, and the context's
 * raw bytes after its message. */
static void host_input(far *f) {
  while (f->chunk_at < f->chunk_end && !f->ended) {
    char *p = f->chunk + f->chunk_at;
    size_t avail = f->chunk_end - f->chunk_at;
    if (f->raw_left > 0) {
      size_t n = avail < f->raw_left ? avail : (size_t)f->raw_left;
      context_bytes(f, p, n);
      f->chunk_at += n;
      continue;
    }
    char *nl = memchr(p, '\n', avail);
    size_t take = nl ? (size_t)(nl - p) : avail;
    if (f->line_len + take > f->line_max) {
      fail(f, "the host sent a line longer than max_message_bytes + 1 (%zu)",
           f->line_max);
      return;
    }
    if (f->line_len + take > f->line_cap) {
      size_t cap = f->line_cap ? f->line_cap : 4096;
      while (cap < f->line_len + take)
        cap *= 2;
      char *more = realloc(f->line, cap);
      if (more == NULL) {
        fail(f, "out of memory");
        return;
      }
      f->line = more;
      f->line_cap = cap;
    }
    memcpy(f->line + f->line_len, p, take);
    f->line_len += take;
    f->chunk_at += take;
    if (nl != NULL) {
      f->chunk_at++;
      size_t len = f->line_len;
      f->line_len = 0;
      host_line(f, f->line, len);
      if (f->line_cap > (1u << 20) && f->line_len == 0) {
        free(f->line); /* a large line is not held on to */
        f->line = NULL;
        f->line_cap = 0;
      }
    }
  }
}

/* --- the driver's events ------------------------------------------------ */

/* The driver's exit, with as much of its stderr's tail as the host's line
 * cap leaves room for once escaped: a control byte is six bytes of JSON,
 * so the 4 KiB the driver keeps can be 24 KiB of line. */
static void say_exit(far *f, const rlm_event *ev, uint64_t kills,
                     uint64_t peak) {
  static const char stderr_key[] = ",\"stderr\":";
  char head[256];
  int n = snprintf(head, sizeof(head),
                   "K{\"type\":\"exit\",\"status\":%lld,\"signal\":%d,"
                   "\"oom_kills\":%llu,\"peak\":%llu,\"mechanism\":",
                   (long long)ev->exit_status, ev->term_signal,
                   (unsigned long long)kills, (unsigned long long)peak);
  const char *mechanism = rlm_driver_memory_mechanism(f->d);
  const char *err = ev->data ? ev->data : "";
  size_t len = ev->data ? ev->len : 0;
  /* The line without its newline: at most max_line + 1 bytes (the channel
   * byte and the message), as the host frames it. */
  size_t fixed = (size_t)n +
                 rlm_json_escaped_len(mechanism, strlen(mechanism)) + 2 +
                 strlen(stderr_key) + 2 + 1;
  size_t room = f->max_line + 1 > fixed ? f->max_line + 1 - fixed : 0;
  size_t from = len, used = 0;
  while (from > 0) {
    size_t width = rlm_json_escaped_len(err + from - 1, 1);
    if (used + width > room)
      break;
    used += width;
    from--;
  }
  out_bytes(f, head, (size_t)n);
  out_jstr(f, mechanism);
  out_str(f, stderr_key);
  out_json(f, err + from, len - from);
  out_str(f, "}\n");
}

static void driver_event(far *f, rlm_event *ev) {
  uint64_t peak = 0, kills;
  switch (ev->kind) {
  case RLM_EV_LINE:
    f->lines_seen++;
    if (f->lines_seen == 1) {
      adopt(f);
      rlm_canaries_close_leaked(&f->canaries);
    }
    /* The driver's fourth line answers load_context (hello, configured,
     * self_test_result, ready: no model code runs before it). */
    if (f->lines_seen == 4 && f->load_seen) {
      ready_checks(f);
      rlm_canaries_remove(&f->canaries);
      f->planted = 0;
    }
    out_bytes(f, "D", 1);
    out_bytes(f, ev->data, ev->len);
    out_bytes(f, "\n", 1);
    rlm_driver_line_taken(f->d);
    return;
  case RLM_EV_EXIT:
    kills = rlm_driver_oom_kills(f->d, &peak);
    say_exit(f, ev, kills, peak);
    break;
  case RLM_EV_TIMEOUT:
    out_str(f, "K{\"type\":\"timeout\"}\n");
    break;
  case RLM_EV_MEMORY:
    out_fmt(f, "K{\"type\":\"memory\",\"peak\":%llu}\n",
            (unsigned long long)ev->peak_bytes);
    break;
  case RLM_EV_FILES:
    out_fmt(f, "K{\"type\":\"files\",\"files\":%llu,\"peak\":%llu}\n",
            (unsigned long long)ev->peak_bytes,
            (unsigned long long)rlm_driver_peak_rss(f->d));
    break;
  case RLM_EV_OVERFLOW:
    out_str(f, "K{\"type\":\"overflow\"}\n");
    break;
  case RLM_EV_FAILED:
  case RLM_EV_SILENT: /* a stream's alone: the driver here is not one */
    say_failed(f, ev->data ? ev->data : "the sandbox did not start");
    break;
  }
  /* Every other event ends the driver, and the keeper with it. */
  f->ended = 1;
  end_driver(f);
}
