/* farside.c: rlm-keeper's main: the stream (docs/protocol.md, "The
 * stream"). It says hello, takes the host's start, probes its interpreter
 * (or reads the probe's cache), plants its canaries, starts the driver
 * under bubblewrap through the same driver code rlm.core uses (driver.c,
 * keeper.c, spawn.c: its memory watchdog, cgroup, uid, deadline, kill),
 * sends the driver its configure and self_test, relays lines both ways
 * with a channel byte before each, writes the context into a sealed memfd,
 * checks the sandbox from outside after the driver's ready, and kills
 * everything it started when its stdin ends (or, when the host's start
 * asked it to linger, when no attach came within its time:
 * farside_linger.c).
 *
 * One thread of its own (a poll over stdin, stdout and the driver's loop);
 * the driver's keeper and watchdog threads are driver.c's. Every line it
 * holds is bounded: the host's by max_message_bytes (64 KiB before the
 * start says it), the driver's by the same through the driver's framer,
 * and what waits for stdout by one relayed line and a few messages.
 *
 * This file: the arguments, where the driver's files are, the hello and
 * the loop. The linger and --attach are farside_linger.c's, the start
 * farside_start.c's, the relay of both ways
 * farside_relay.c's, the checks farside_checks.c's, the choice of sandbox
 * and the fallback farside_seccomp.c's, the probe farside_probe.c's. */
#define _GNU_SOURCE
#include "farside.h"
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define FIRST_LINE_MAX 65536 /* a line before the start sets the cap */

/* --- the loop ----------------------------------------------------------- */

/* Where the driver's files are: --driver-dir, RLM_DRIVER_DIR (each, when
 * given, the only place looked at), else beside the binary (a checkout's
 * python/, an install's share/rlm-keeper/), else where the build put them
 * (RLM_KEEPER_SHARE: the rock's, whose binary luarocks deploys apart). */
#ifdef RLM_KEEPER_SHARE
#define SHARE_DIR RLM_KEEPER_SHARE
#else
#define SHARE_DIR NULL
#endif
static int find_driver_dir(far *f, const char *given) {
  const char *candidates[3] = {given, getenv("RLM_DRIVER_DIR"), NULL};
  char exe[PATH_MAX], tries[2][PATH_MAX + 32];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash != NULL)
      *slash = '\0';
    /* A checkout (build/rlm-keeper, python/), or an install
     * (bin/rlm-keeper, share/rlm-keeper/). */
    snprintf(tries[0], sizeof(tries[0]), "%s/../python", exe);
    snprintf(tries[1], sizeof(tries[1]), "%s/../share/rlm-keeper", exe);
  }
  for (int i = 0; i < 5; i++) {
    const char *dir = i < 2   ? candidates[i]
                      : i < 4 ? (n > 0 ? tries[i - 2] : NULL)
                              : SHARE_DIR;
    char probe[PATH_MAX + 32];
    if (dir == NULL || dir[0] == '\0')
      continue;
    if (snprintf(probe, sizeof(probe), "%s/repl_driver.py", dir) <
            (int)sizeof(probe) &&
        access(probe, R_OK) == 0 && realpath(dir, f->driver_dir) != NULL)
      return 0;
    if (i < 2)
      return -1; /* named, and not there: no guessing past it */
  }
  return -1;
}

static void usage(void) {
  fputs(
      "usage: rlm-keeper [--python PATH] [--bwrap PATH] [--driver-dir DIR] "
      "[--cache DIR]\n"
      "                  [--sandbox auto|bubblewrap|seccomp] "
      "[--linger-dir DIR]\n"
      "                  [--listen ADDR:PORT --token-file PATH]\n"
      "       rlm-keeper --attach [--linger-dir DIR]\n"
      "       rlm-keeper --probe [--python PATH] [--driver-dir DIR] "
      "--cache DIR MODULE...\n"
      "Runs one rlm session's sandbox, speaking the stream protocol on "
      "stdin and stdout\n(docs/protocol.md); with --probe, writes the "
      "interpreter's report into the cache;\nwith --attach, hands its "
      "stdin and stdout to the keeper that lingers as the id\nof its "
      "first line. --sandbox: auto (the default) makes bubblewrap's "
      "sandbox where\nit can run, else (as root) the seccomp fallback; "
      "the hello says which\n(docs/security.md). With --listen, the stream is "
      "the first TCP connection on\nADDR:PORT whose first line claims it "
      "with the token of PATH (docs/backends.md).\n",
      stderr);
}

int main(int argc, char **argv) {
  static far f;
  memset(&f, 0, sizeof(f));
  f.ctx_fd = -1;
  f.python_name = "python3";
  f.bwrap_name = "bwrap";
  f.cache_dir = getenv("RLM_KEEPER_CACHE");
  f.line_max = FIRST_LINE_MAX;
  f.out_fd = 1;
  f.conn_fd = f.listen_fd = -1;
  const char *driver_dir = NULL, *sandbox = "auto", *listen_at = NULL,
             *token_file = NULL;
  int probe_only = 0, attach = 0, i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--probe") == 0)
      probe_only = 1;
    else if (strcmp(a, "--attach") == 0)
      attach = 1;
    else if (i + 1 < argc && strcmp(a, "--linger-dir") == 0)
      f.linger_dir = argv[++i];
    else if (i + 1 < argc && strcmp(a, "--python") == 0)
      f.python_name = argv[++i];
    else if (i + 1 < argc && strcmp(a, "--bwrap") == 0)
      f.bwrap_name = argv[++i];
    else if (i + 1 < argc && strcmp(a, "--driver-dir") == 0)
      driver_dir = argv[++i];
    else if (i + 1 < argc && strcmp(a, "--cache") == 0)
      f.cache_dir = argv[++i];
    else if (i + 1 < argc && strcmp(a, "--sandbox") == 0)
      sandbox = argv[++i];
    else if (i + 1 < argc && strcmp(a, "--listen") == 0)
      listen_at = argv[++i];
    else if (i + 1 < argc && strcmp(a, "--token-file") == 0)
      token_file = argv[++i];
    else if (strcmp(a, "--help") == 0) {
      usage();
      return 0;
    } else if (a[0] == '-' || !probe_only) {
      usage();
      return 2;
    } else
      break;
  }
  if (f.cache_dir != NULL && f.cache_dir[0] == '\0')
    f.cache_dir = NULL;
  if (strcmp(sandbox, "auto") != 0 && strcmp(sandbox, "bubblewrap") != 0 &&
      strcmp(sandbox, "seccomp") != 0) {
    usage();
    return 2;
  }
  if ((listen_at == NULL) != (token_file == NULL) ||
      (listen_at != NULL && (attach || probe_only))) {
    usage();
    return 2;
  }
  if (attach)
    return far_attach_main(f.linger_dir);
  if (!probe_only && far_term_init() != 0) {
    fprintf(stderr, "rlm-keeper: SIGTERM's handler: %s\n", strerror(errno));
    return 2;
  }
  far_listener *listener = NULL;
  if (listen_at != NULL) {
    /* The token is read once, now, into a process no other process of its
     * uid may read (the REPL runs as another uid: a second wall). */
    char err[512];
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if ((listener = far_listen_open(listen_at, token_file, err, sizeof(err))) ==
        NULL) {
      fprintf(stderr, "rlm-keeper: %s\n", err);
      return 2;
    }
  }
  (void)signal(SIGPIPE, SIG_IGN); /* a host gone is an EPIPE */
  int found_python =
      rlm_find_program(f.python_name, f.python, sizeof(f.python)) == 0;
  f.have_bwrap = rlm_find_program(f.bwrap_name, f.bwrap, sizeof(f.bwrap)) == 0;
  if (find_driver_dir(&f, driver_dir) != 0) {
    fprintf(stderr, "rlm-keeper: the driver (repl_driver.py) was not found: "
                    "give --driver-dir or RLM_DRIVER_DIR\n");
    return 2;
  }
  if (probe_only) {
    far_probe p;
    char err[768];
    if (f.cache_dir == NULL || !found_python) {
      fprintf(stderr, "rlm-keeper --probe: %s\n",
              f.cache_dir ? "the interpreter was not found" : "give --cache");
      return 2;
    }
    if (far_probe_get(&p, f.python, f.driver_dir, (const char *const *)argv + i,
                      (size_t)(argc - i), f.cache_dir, err, sizeof(err)) != 0) {
      fprintf(stderr, "rlm-keeper --probe: %s\n", err);
      return 1;
    }
    printf("%s %s\n", p.executable, p.version);
    far_probe_free(&p);
    return 0;
  }
  choose_mode(&f, sandbox, found_python);
  /* Nothing of this process's memory for a process of the same uid to read
   * through /proc (its mem, its environ): the REPL runs as another uid,
   * this closes what a slip there would open. */
  (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  if (listener != NULL) {
    /* Everything before the hello is done: the claim's wait, then its
     * connection is the stream, as stdin and stdout are otherwise. */
    char err[512];
    int conn = far_listen_claim(listener, err, sizeof(err));
    free(listener);
    if (conn < 0 || dup2(conn, 0) < 0 || dup2(conn, 1) < 0) {
      fprintf(stderr, "rlm-keeper: %s\n",
              conn < 0 ? err : "dup2: the claimed connection");
      return conn < 0 && strncmp(err, "SIGTERM", 7) == 0 ? 0 : 1;
    }
    if (conn > 1)
      close(conn);
  }
  (void)fcntl(1, F_SETFL, fcntl(1, F_GETFL) | O_NONBLOCK);
  /* The hello: who speaks, and which sandbox it will make, and why. */
  out_fmt(&f,
          "K{\"type\":\"hello\",\"keeper\":\"%s\",\"protocol\":%d,"
          "\"sandbox\":\"%s\",\"pid\":%d,\"detail\":",
          RLM_KEEPER_VERSION, RLM_KEEPER_PROTOCOL, far_mode_name(f.mode),
          (int)getpid());
  out_jstr(&f, f.mode_why);
  out_str(&f, ",\"linger\":true}\n"); /* it takes a start's linger */
  if (!found_python)
    fail(&f, "the interpreter %s was not found on the far side", f.python_name);
  while (!f.out_broken) {
    if (f.in_eof) {
      /* The host is done, or gone: everything goes, unless it asked the
       * keeper to linger (farside_linger.c). */
      if (!linger_detach(&f))
        break;
      f.in_eof = 0;
    }
    struct pollfd p[5];
    int np = 0, in_at = -1, out_at = -1, drv_at = -1, lis_at = -1, term_at = -1;
    if (!f.termed) {
      term_at = np;
      p[np++] = (struct pollfd){.fd = far_term_fd(), .events = POLLIN};
    }
    if (!f.ended && !f.detached) {
      in_at = np;
      p[np++] = (struct pollfd){.fd = f.in_fd, .events = POLLIN};
    }
    if (!f.detached && (f.pre_off < f.pre_len || f.out_off < f.out_len)) {
      out_at = np;
      p[np++] = (struct pollfd){.fd = f.out_fd, .events = POLLOUT};
    }
    int timeout = -1;
    if (f.d != NULL && f.out_len - f.out_off < OUT_HIGH) {
      drv_at = np;
      p[np++] =
          (struct pollfd){.fd = rlm_driver_backend_fd(f.d), .events = POLLIN};
      timeout = rlm_driver_backend_timeout(f.d);
    }
    if (f.listen_fd >= 0 && !f.ended) {
      lis_at = np;
      p[np++] = (struct pollfd){.fd = f.listen_fd, .events = POLLIN};
    }
    int left = linger_left_ms(&f);
    if (left == 0)
      break; /* lingered its time: everything goes */
    if (left > 0 && (timeout < 0 || left < timeout))
      timeout = left;
    if (f.ended && out_at < 0)
      break; /* said all it had to say */
    if (np == 0)
      break;
    int n = poll(p, (nfds_t)np, timeout);
    if (n < 0 && errno != EINTR)
      break;
    if (term_at >= 0 && p[term_at].revents != 0) {
      /* SIGTERM: the end of the input, as the host's close is (no
       * linger); what waits for the host still goes, as at any end. */
      fprintf(stderr, "rlm-keeper[%d]: SIGTERM: the end of its input\n",
              (int)getpid());
      f.termed = 1;
      f.linger_ms = 0;
      f.in_eof = 1;
      continue;
    }
    if (out_at >= 0 && (p[out_at].revents & (POLLOUT | POLLERR | POLLHUP)) &&
        flush_some(&f) != 0) {
      f.in_eof = 1; /* the host is gone */
      continue;
    }
    if (in_at >= 0 && (p[in_at].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t r = read(f.in_fd, f.chunk, sizeof(f.chunk));
      if (r > 0) {
        f.chunk_at = 0;
        f.chunk_end = (size_t)r;
        host_input(&f);
      } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
        f.in_eof = 1;
      }
    }
    if (f.d != NULL && drv_at >= 0) {
      rlm_driver_wait(f.d, 0, 0, 0);
      rlm_event *ev;
      while (f.d != NULL && f.out_len - f.out_off < OUT_HIGH &&
             (ev = rlm_driver_take(f.d)) != NULL) {
        driver_event(&f, ev);
        rlm_event_free(ev);
      }
    }
    if (lis_at >= 0 && (p[lis_at].revents & POLLIN) && !f.in_eof)
      linger_accept(&f);
    if (!f.detached && (f.pre_off < f.pre_len || f.out_off < f.out_len) &&
        flush_some(&f) != 0)
      f.in_eof = 1;
  }
  linger_end(&f);
  end_driver(&f);
  flush_all(&f, 1000);
  if (f.session_dir[0] != '\0') {
    /* The fallback's directory goes once the REPL is reaped (its teardown
     * on the driver's thread), whatever it left there. */
    for (int waited = 0; rlm_driver_teardowns() > 0 && waited < 5000; waited++)
      (void)poll(NULL, 0, 1);
    (void)far_remove_tree(f.session_dir);
  }
  free(f.line);
  free(f.out);
  return 0; /* driver.c's exit hook waits for the teardowns */
}
