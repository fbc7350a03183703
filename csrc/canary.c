/* canary.c: see canary.h. Each canary is something a weaker sandbox would
 * let the driver reach; the self-test tries them all. */
#define _GNU_SOURCE
#include "canary.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define PREFIX ".rlm-canary-"
#define ID_LEN 12
/* A plant creates its home file, then locks it; binds its socket, then
 * listens: a sweep leaves alone what is younger than this. */
#define SWEEP_MIN_AGE 5

static void random_hex(char *out, size_t n) {
  unsigned char raw[16];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  ssize_t got = fd >= 0 ? read(fd, raw, sizeof(raw)) : -1;
  if (fd >= 0)
    close(fd);
  if (got != (ssize_t)sizeof(raw)) { /* not secret, only unique */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    memcpy(raw, &ts, sizeof(raw) < sizeof(ts) ? sizeof(raw) : sizeof(ts));
  }
  for (size_t i = 0; i < sizeof(raw) && 2 * i + 2 < n; i++)
    snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

static int listen_on(int family, const struct sockaddr *addr, socklen_t len) {
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  if (bind(fd, addr, len) != 0 || listen(fd, 1) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* ".rlm-canary-" then 12 hex digits then "" (a home file) or ".sock". */
static int canary_name(const char *name) {
  size_t p = strlen(PREFIX);
  if (strncmp(name, PREFIX, p) != 0)
    return 0;
  for (size_t i = p; i < p + ID_LEN; i++)
    if (!((name[i] >= '0' && name[i] <= '9') ||
          (name[i] >= 'a' && name[i] <= 'f')))
      return 0;
  return name[p + ID_LEN] == '\0' || strcmp(name + p + ID_LEN, ".sock") == 0;
}

/* Its planter holds a lock on a live home file. */
static int file_unlocked(int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return 0;
  int unlocked = flock(fd, LOCK_EX | LOCK_NB) == 0;
  (void)close(fd);
  return unlocked;
}

/* Its planter listens on a live socket: a connect to a dead one is
 * refused. */
static int socket_unheard(const char *dir, const char *name) {
  struct sockaddr_un un;
  memset(&un, 0, sizeof(un));
  un.sun_family = AF_UNIX;
  int w = snprintf(un.sun_path, sizeof(un.sun_path), "%s/%s", dir, name);
  if (w <= 0 || (size_t)w >= sizeof(un.sun_path))
    return 0;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return 0;
  int r;
  do
    r = connect(fd, (struct sockaddr *)&un, sizeof(un));
  while (r != 0 && errno == EINTR);
  int unheard = r != 0 && errno == ECONNREFUSED;
  (void)close(fd);
  return unheard;
}

int rlm_canaries_sweep(const char *dir) {
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return 0;
  DIR *d = fdopendir(dfd);
  if (d == NULL) {
    (void)close(dfd);
    return 0;
  }
  time_t now = time(NULL);
  uid_t me = geteuid();
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    struct stat st;
    if (!canary_name(e->d_name) ||
        fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        st.st_uid != me || now - st.st_mtime < SWEEP_MIN_AGE)
      continue;
    int stale = S_ISREG(st.st_mode)    ? file_unlocked(dfd, e->d_name)
                : S_ISSOCK(st.st_mode) ? socket_unheard(dir, e->d_name)
                                       : 0;
    if (stale && unlinkat(dfd, e->d_name, 0) == 0)
      removed++;
  }
  (void)closedir(d);
  return removed;
}

/* Once per process and directory (a few directories; a host with more
 * leaves the rest to its next start). */
static void sweep_once(const char *dir) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static char swept[4][PATH_MAX];
  if (dir == NULL || dir[0] != '/' || strlen(dir) >= PATH_MAX)
    return;
  int todo = 0;
  if (pthread_mutex_lock(&lock) != 0)
    return;
  for (size_t i = 0; i < sizeof(swept) / sizeof(swept[0]); i++) {
    if (strcmp(swept[i], dir) == 0)
      break;
    if (swept[i][0] == '\0') {
      memcpy(swept[i], dir, strlen(dir) + 1);
      todo = 1;
      break;
    }
  }
  (void)pthread_mutex_unlock(&lock);
  if (todo)
    (void)rlm_canaries_sweep(dir);
}

void rlm_canaries_plant(rlm_canaries *c, const char *home, const char *dir) {
  sweep_once(home);
  sweep_once(dir);
  memset(c, 0, sizeof(*c));
  c->tcp_port = -1;
  c->leaked_fd = -1;
  c->lock_fd = -1;
  for (int i = 0; i < 3; i++)
    c->fds[i] = -1;
  char id[33];
  random_hex(id, sizeof(id));
  snprintf(c->secret, sizeof(c->secret), "rlm-canary-%.24s", id);

  if (home != NULL && home[0] == '/') {
    snprintf(c->home_file, sizeof(c->home_file), "%s/.rlm-canary-%.12s", home,
             id);
    int fd = open(c->home_file,
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0 ||
        write(fd, c->secret, strlen(c->secret)) < 0) {
      if (fd >= 0)
        (void)unlink(c->home_file);
      c->home_file[0] = '\0';
    }
    if (fd >= 0 && c->home_file[0])
      c->lock_fd = fd; /* held until the removal, as this host's sign of life */
    else if (fd >= 0)
      close(fd);
  }

  struct sockaddr_in in4;
  memset(&in4, 0, sizeof(in4));
  in4.sin_family = AF_INET;
  in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  c->fds[0] = listen_on(AF_INET, (struct sockaddr *)&in4, sizeof(in4));
  socklen_t len = sizeof(in4);
  if (c->fds[0] >= 0 &&
      getsockname(c->fds[0], (struct sockaddr *)&in4, &len) == 0)
    c->tcp_port = ntohs(in4.sin_port);

  struct sockaddr_un un;
  memset(&un, 0, sizeof(un));
  un.sun_family = AF_UNIX;
  int w = snprintf(un.sun_path, sizeof(un.sun_path),
                   "%s/.rlm-canary-%.12s.sock", dir, id);
  if (w > 0 && (size_t)w < sizeof(un.sun_path)) {
    c->fds[1] = listen_on(AF_UNIX, (struct sockaddr *)&un, sizeof(un));
    if (c->fds[1] >= 0)
      memcpy(c->unix_path, un.sun_path, sizeof(c->unix_path));
  }

  memset(&un, 0, sizeof(un));
  un.sun_family = AF_UNIX;
  snprintf(c->abstract_name, sizeof(c->abstract_name), "rlm-canary-%.12s", id);
  memcpy(un.sun_path + 1, c->abstract_name, strlen(c->abstract_name));
  c->fds[2] = listen_on(AF_UNIX, (struct sockaddr *)&un,
                        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                                    strlen(c->abstract_name)));
  if (c->fds[2] < 0)
    c->abstract_name[0] = '\0';

  /* What an nginx worker might have left open: no O_CLOEXEC, and the secret
   * behind it. */
  int fd = open(c->home_file[0] ? c->home_file : "/dev/null", O_RDONLY);
  if (fd >= 0) {
    c->leaked_fd = fcntl(fd, F_DUPFD, RLM_CANARY_FD_MIN);
    (void)close(fd);
  }
}

void rlm_canaries_close_leaked(rlm_canaries *c) {
  if (c->leaked_fd >= 0) {
    close(c->leaked_fd);
    c->leaked_fd = -1;
  }
}

void rlm_canaries_remove(rlm_canaries *c) {
  for (int i = 0; i < 3; i++)
    if (c->fds[i] >= 0) {
      close(c->fds[i]);
      c->fds[i] = -1;
    }
  if (c->unix_path[0]) {
    (void)unlink(c->unix_path);
    c->unix_path[0] = '\0';
  }
  if (c->home_file[0]) {
    (void)unlink(c->home_file);
    c->home_file[0] = '\0';
  }
  if (c->lock_fd >= 0) {
    (void)close(c->lock_fd);
    c->lock_fd = -1;
  }
  rlm_canaries_close_leaked(c);
}
