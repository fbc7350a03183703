/* floor_pingpong.c: the floors the benchmarks hold rlm against. A plain C
 * host with nothing of rlm in it (no event loop, no Lua, no JSON): it spawns
 * a child with pipes on its stdin and stdout and times what it is asked to.
 * Samples are printed in nanoseconds, one per line, after all of them were
 * taken, so printing does not disturb the timing.
 *
 *   floor_pingpong pingpong N -- ARGV...
 *       spawns ARGV once, reads its hello line, then N times writes a short
 *       JSON-ish line and reads the reply line: one sample per round trip.
 *   floor_pingpong first N -- ARGV...
 *       N times: spawns ARGV, reads its hello, writes one line and reads the
 *       reply: one sample from before the spawn to the reply.
 *   floor_pingpong phases N -- ARGV...
 *       as `first`, in four parts per sample, one line each: the spawn (to
 *       the exec), the exec to the child's first line (the monotonic stamp
 *       its hello carries as "t":[seconds]), that to the hello read here,
 *       and the one line's round trip.
 *   floor_pingpong exit N -- ARGV...
 *       N times: spawns ARGV and waits for it to exit.
 *   floor_pingpong hello N -- ARGV...
 *       N times: spawns ARGV and reads its first line: one sample from
 *       before the spawn to that line; then closes its stdin and reaps it
 *       (untimed), before the next.
 *   floor_pingpong send FILE -- ARGV...
 *       reads FILE (untimed), spawns ARGV, reads its hello, then writes FILE
 *       plus a newline as one line and reads one reply line: prints the
 *       sample, then the reply.
 *
 * Before the `--`, FD=PATH opens PATH read-only at FD in each child, afresh
 * for each spawn (as the sandbox's keeper hands bubblewrap the driver's
 * files for its --file). The child gets a fixed environment, like the
 * sandbox's. Build: cc -O2. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char *child_env[] = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8",
                            "PYTHONUTF8=1", NULL};

typedef struct child {
  pid_t pid;
  int in, out;     /* our ends: we write to in, read from out */
  char buf[65536]; /* bytes read past the last line */
  size_t len;
} child;

static void die(const char *what) {
  fprintf(stderr, "floor_pingpong: %s: %s\n", what, strerror(errno));
  exit(1);
}

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The FD=PATH opens, at most 8. */
static struct {
  int fd;
  const char *path;
} opens[8];
static int n_opens;

static void spawn(child *c, char **argv) {
  int to[2], from[2];
  if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0)
    die("pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from[1], 1);
  for (int i = 0; i < n_opens; i++)
    posix_spawn_file_actions_addopen(&fa, opens[i].fd, opens[i].path, O_RDONLY,
                                     0);
  int rc = posix_spawn(&c->pid, argv[0], &fa, NULL, argv, child_env);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    errno = rc;
    die(argv[0]);
  }
  close(to[0]);
  close(from[1]);
  c->in = to[1];
  c->out = from[0];
  c->len = 0;
}

static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      die("write to the child");
    p += w;
    n -= (size_t)w;
  }
}

/* Reads up to and including the next newline; the line (without it) goes to
 * line/cap when given, else it is dropped. Exits when the child is gone. */
static void read_line(child *c, char *line, size_t cap) {
  size_t kept = 0;
  for (;;) {
    char *nl = memchr(c->buf, '\n', c->len);
    size_t take = nl ? (size_t)(nl - c->buf) : c->len;
    if (line != NULL && kept + take < cap) {
      memcpy(line + kept, c->buf, take);
      kept += take;
    }
    if (nl != NULL) {
      c->len -= take + 1;
      memmove(c->buf, nl + 1, c->len);
      break;
    }
    c->len = 0;
    ssize_t r = read(c->out, c->buf, sizeof(c->buf));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      fprintf(stderr, "floor_pingpong: the child closed its stdout\n");
      exit(1);
    }
    c->len = (size_t)r;
  }
  if (line != NULL)
    line[kept < cap ? kept : cap - 1] = '\0';
}

/* Closes its stdin (a driver leaves at end of input) and reaps it. */
static void finish(child *c) {
  close(c->in);
  close(c->out);
  int status;
  while (waitpid(c->pid, &status, 0) < 0 && errno == EINTR)
    ;
}

static char *read_file(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0)
    die(path);
  char *data = malloc((size_t)st.st_size + 1);
  if (data == NULL)
    die("malloc");
  size_t got = 0;
  while (got < (size_t)st.st_size) {
    ssize_t r = read(fd, data + got, (size_t)st.st_size - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      die(path);
    got += (size_t)r;
  }
  close(fd);
  data[got] = '\n';
  *len = got + 1;
  return data;
}

static void usage(void) {
  fprintf(stderr, "usage: floor_pingpong pingpong|first|phases|exit|hello N "
                  "[FD=PATH...] -- "
                  "ARGV...\n"
                  "       floor_pingpong send FILE -- ARGV...\n");
  exit(2);
}

int main(int argc, char **argv) {
  int dash = 3;
  while (dash < argc && strcmp(argv[dash], "--") != 0) {
    char *eq = strchr(argv[dash], '=');
    if (eq == NULL || n_opens == 8)
      usage();
    opens[n_opens].fd = atoi(argv[dash]);
    opens[n_opens++].path = eq + 1;
    dash++;
  }
  if (argc < dash + 2)
    usage();
  const char *mode = argv[1];
  char **cargv = argv + dash + 1;
  /* A child that dies must show as an error message, not kill us. */
  signal(SIGPIPE, SIG_IGN);

  if (strcmp(mode, "send") == 0) {
    size_t len;
    char *data = read_file(argv[2], &len);
    static char reply[4096];
    child c;
    spawn(&c, cargv);
    read_line(&c, NULL, 0);
    long long t0 = now_ns();
    write_all(c.in, data, len);
    read_line(&c, reply, sizeof(reply));
    long long t = now_ns() - t0;
    finish(&c);
    free(data);
    printf("%lld\n%s\n", t, reply);
    return 0;
  }

  long n = strtol(argv[2], NULL, 10);
  if (n <= 0)
    usage();
  long long *samples = malloc((size_t)n * sizeof(*samples));
  if (samples == NULL)
    die("malloc");

  if (strcmp(mode, "pingpong") == 0) {
    static child c;
    spawn(&c, cargv);
    read_line(&c, NULL, 0);
    for (long i = 0; i < n; i++) {
      char line[128];
      int w = snprintf(line, sizeof(line),
                       "{\"type\":\"llm_result\",\"id\":%ld,\"text\":\"x\"}\n",
                       i + 1);
      long long t0 = now_ns();
      write_all(c.in, line, (size_t)w);
      read_line(&c, NULL, 0);
      samples[i] = now_ns() - t0;
    }
    finish(&c);
  } else if (strcmp(mode, "first") == 0) {
    for (long i = 0; i < n; i++) {
      static child c;
      static const char hi[] =
          "{\"type\":\"exec\",\"id\":1,\"code\":\"x = 1\"}\n";
      long long t0 = now_ns();
      spawn(&c, cargv);
      read_line(&c, NULL, 0);
      write_all(c.in, hi, sizeof(hi) - 1);
      read_line(&c, NULL, 0);
      samples[i] = now_ns() - t0;
      finish(&c);
    }
  } else if (strcmp(mode, "phases") == 0) {
    long long *parts = malloc((size_t)n * 4 * sizeof(*parts));
    if (parts == NULL)
      die("malloc");
    for (long i = 0; i < n; i++) {
      static child c;
      static const char hi[] =
          "{\"type\":\"exec\",\"id\":1,\"code\":\"x = 1\"}\n";
      char hello[512];
      long long t0 = now_ns();
      spawn(&c, cargv); /* posix_spawn returns once the child has exec'd */
      long long t1 = now_ns();
      read_line(&c, hello, sizeof(hello));
      long long t3 = now_ns();
      write_all(c.in, hi, sizeof(hi) - 1);
      read_line(&c, NULL, 0);
      long long t4 = now_ns();
      finish(&c);
      const char *t = strstr(hello, "\"t\":[");
      long long t2 = t ? (long long)(strtod(t + 5, NULL) * 1e9) : t1;
      parts[4 * i] = t1 - t0;
      parts[4 * i + 1] = t2 - t1;
      parts[4 * i + 2] = t3 - t2;
      parts[4 * i + 3] = t4 - t3;
    }
    for (long i = 0; i < 4 * n; i++)
      printf("%lld\n", parts[i]);
    free(parts);
    free(samples);
    return 0;
  } else if (strcmp(mode, "hello") == 0) {
    for (long i = 0; i < n; i++) {
      static child c;
      long long t0 = now_ns();
      spawn(&c, cargv);
      read_line(&c, NULL, 0);
      samples[i] = now_ns() - t0;
      finish(&c);
    }
  } else if (strcmp(mode, "exit") == 0) {
    for (long i = 0; i < n; i++) {
      child c;
      long long t0 = now_ns();
      spawn(&c, cargv);
      finish(&c);
      samples[i] = now_ns() - t0;
    }
  } else {
    usage();
  }
  for (long i = 0; i < n; i++)
    printf("%lld\n", samples[i]);
  free(samples);
  return 0;
}
