/* core_journal.c: the file store of rlm.journal (lua/rlm/journal/file.lua)
 * as system calls: a directory only its owner can write, files 0600 that
 * are replaced whole (a temporary file, fsync, rename, fsync of the
 * directory), and an flock for the store's conditional set. Every call
 * opens the directory again without following a link and checks its owner
 * and mode, and reaches its files by name relative to that descriptor, so
 * that a directory swapped after the store was made is refused too. Names
 * are checked here as well as in Lua: the letters, digits, '_', '-' and '.'
 * of a journal key, never first a '.', so that no name leaves the
 * directory or meets the store's own dot files. */
#define _GNU_SOURCE
#include "core.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define JOURNAL_LOCK_MT "rlm.core.JournalLock"
#define JOURNAL_NAME_MAX 200

/* nil, "<what> <path>: <strerror>", errno saved by the caller. */
static int journal_fail(lua_State *L, const char *what, const char *path,
                        int err) {
  lua_pushnil(L);
  lua_pushfstring(L, "%s %s: %s", what, path, strerror(err));
  return 2;
}

static void journal_check_name(lua_State *L, int i) {
  size_t len;
  const char *s = luaL_checklstring(L, i, &len);
  if (len == 0 || len > JOURNAL_NAME_MAX || s[0] == '.')
    luaL_argerror(L, i, "not a journal key");
  for (size_t k = 0; k < len; k++) {
    char c = s[k];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
      luaL_argerror(L, i, "not a journal key");
  }
}

/* The directory at index 1, opened and checked: a directory (not a link),
 * owned by this process's user, writable by no one else. Returns its
 * descriptor, or -1 with the failure pushed (2 results). */
static int journal_open_dir(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    journal_fail(L, "open", path, errno);
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    journal_fail(L, "fstat", path, err);
    return -1;
  }
  if (st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
    close(fd);
    char why[160];
    snprintf(why, sizeof(why),
             "(owner uid %d, mode %04o): it must be owned by uid %d and "
             "writable by no one else",
             (int)st.st_uid, (unsigned)(st.st_mode & 07777), (int)geteuid());
    lua_pushnil(L);
    lua_pushfstring(L, "journal directory %s is not this user's alone %s", path,
                    why);
    return -1;
  }
  return fd;
}

/* A call on one entry: its name at index 2, checked (a raise), and the
 * directory at index 1, opened and checked. Returns the directory's
 * descriptor and sets *name, or -1 with the failure pushed (2 results).
 * The caller checks its other arguments first: a raise leaks no fd. */
static int journal_open_entry(lua_State *L, const char **name) {
  journal_check_name(L, 2);
  *name = lua_tostring(L, 2);
  return journal_open_dir(L);
}

static int journal_fsync(int fd) {
  int r;
  do
    r = fsync(fd);
  while (r != 0 && errno == EINTR);
  return r;
}

/* core.journal_dir(path) -> true | nil, message: makes path (0700) when it
 * is not there, then checks it as every call does. */
static int core_journal_dir(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  if (mkdir(path, 0700) != 0 && errno != EEXIST)
    return journal_fail(L, "mkdir", path, errno);
  int fd = journal_open_dir(L);
  if (fd < 0)
    return 2;
  close(fd);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.journal_read(dir, name, max_bytes) -> data, mtime (seconds) | nil
 * (no such entry) | nil, message. Refuses what the store did not write: a
 * link, not a regular file, another owner's, a mode beyond 0600, or more
 * than max_bytes. */
static int core_journal_read(lua_State *L) {
  lua_Integer max = luaL_checkinteger(L, 3);
  const char *name;
  int dir = journal_open_entry(L, &name);
  if (dir < 0)
    return 2;
  int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  int err = errno;
  close(dir);
  if (fd < 0) {
    if (err == ENOENT)
      return 0;
    return journal_fail(L, "open", name, err);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    err = errno;
    close(fd);
    return journal_fail(L, "fstat", name, err);
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0 || st.st_size > max) {
    close(fd);
    lua_pushnil(L);
    lua_pushfstring(L,
                    "journal entry %s is not the store's (a regular file "
                    "of this user, mode 0600, at most %d bytes)",
                    name, (int)max);
    return 2;
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  char chunk[LUAL_BUFFERSIZE];
  off_t got = 0;
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      err = errno;
      close(fd);
      return journal_fail(L, "read", name, err);
    }
    if (n == 0)
      break;
    got += n;
    if (got > max) {
      close(fd);
      lua_pushnil(L);
      lua_pushfstring(L, "journal entry %s grew past %d bytes", name, (int)max);
      return 2;
    }
    luaL_addlstring(&b, chunk, (size_t)n);
  }
  close(fd);
  luaL_pushresult(&b);
  lua_pushinteger(L, (lua_Integer)st.st_mtime);
  return 2;
}

/* core.journal_write(dir, name, data) -> true | nil, message: data
 * replaces name whole or not at all, and is on disk when this returns. */
static int core_journal_write(lua_State *L) {
  static unsigned serial;
  size_t len;
  const char *data = luaL_checklstring(L, 3, &len);
  const char *name;
  int dir = journal_open_entry(L, &name);
  if (dir < 0)
    return 2;
  char tmp[JOURNAL_NAME_MAX + 64];
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 8; tries++) {
    snprintf(tmp, sizeof(tmp), ".tmp-%s-%ld-%u", name, (long)getpid(),
             ++serial);
    fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                0600);
    if (fd < 0 && errno != EEXIST)
      break;
  }
  if (fd < 0) {
    int err = errno;
    close(dir);
    return journal_fail(L, "create", tmp, err);
  }
  const char *what = NULL;
  size_t done = 0;
  while (done < len) {
    ssize_t n = write(fd, data + done, len - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      what = "write";
      break;
    }
    done += (size_t)n;
  }
  if (what == NULL && journal_fsync(fd) != 0)
    what = "fsync";
  int err = errno;
  close(fd);
  if (what == NULL && renameat(dir, tmp, dir, name) != 0) {
    what = "rename";
    err = errno;
  }
  if (what != NULL) {
    unlinkat(dir, tmp, 0);
    close(dir);
    return journal_fail(L, what, name, err);
  }
  /* The rename itself is durable once the directory is. */
  if (journal_fsync(dir) != 0) {
    err = errno;
    close(dir);
    return journal_fail(L, "fsync of the directory for", name, err);
  }
  close(dir);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.journal_remove(dir, name) -> true | nil, message (no such entry is
 * no failure). */
static int core_journal_remove(lua_State *L) {
  const char *name;
  int dir = journal_open_entry(L, &name);
  if (dir < 0)
    return 2;
  if (unlinkat(dir, name, 0) != 0 && errno != ENOENT) {
    int err = errno;
    close(dir);
    return journal_fail(L, "unlink", name, err);
  }
  if (journal_fsync(dir) != 0) {
    int err = errno;
    close(dir);
    return journal_fail(L, "fsync of the directory for", name, err);
  }
  close(dir);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.journal_list(dir) -> { name = mtime, ... } | nil, message: the
 * entries and their last writes (seconds); a name that is not a journal
 * key, the store's dot files included, is left out. */
static int core_journal_list(lua_State *L) {
  int dir = journal_open_dir(L);
  if (dir < 0)
    return 2;
  DIR *d = fdopendir(dir);
  if (d == NULL) {
    int err = errno;
    close(dir);
    return journal_fail(L, "fdopendir", lua_tostring(L, 1), err);
  }
  lua_newtable(L);
  struct dirent *e;
  struct stat st;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (e->d_name[0] == '.' || len > JOURNAL_NAME_MAX ||
        strspn(e->d_name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVW"
                          "XYZ0123456789_-.") != len)
      continue;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
      continue; /* gone meanwhile */
    lua_pushinteger(L, (lua_Integer)st.st_mtime);
    lua_setfield(L, -2, e->d_name);
  }
  closedir(d);
  return 1;
}

/* core.journal_sweep_temps(dir, before) -> count | nil, message: removes
 * the temporary files (.tmp-*) last written before `before` (seconds):
 * what a writer that died between its create and its rename left. */
static int core_journal_sweep_temps(lua_State *L) {
  lua_Integer before = luaL_checkinteger(L, 2);
  int dir = journal_open_dir(L);
  if (dir < 0)
    return 2;
  DIR *d = fdopendir(dir);
  if (d == NULL) {
    int err = errno;
    close(dir);
    return journal_fail(L, "fdopendir", lua_tostring(L, 1), err);
  }
  lua_Integer n = 0;
  struct dirent *e;
  struct stat st;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, ".tmp-", 5) != 0 ||
        fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode) || st.st_mtime >= before)
      continue;
    if (unlinkat(dirfd(d), e->d_name, 0) == 0)
      n++;
  }
  closedir(d);
  lua_pushinteger(L, n);
  return 1;
}

/* core.journal_lock(dir) -> Lock | nil, message: the store's lock (an
 * flock of its .lock file), held until lock:unlock() or the Lock is
 * collected. Held for one conditional set: a read and a write. */
static int core_journal_lock(lua_State *L) {
  int dir = journal_open_dir(L);
  if (dir < 0)
    return 2;
  int *u = lua_newuserdata(L, sizeof(*u));
  *u = -1;
  luaL_getmetatable(L, JOURNAL_LOCK_MT);
  lua_setmetatable(L, -2);
  int fd =
      openat(dir, ".lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  int err = errno;
  close(dir);
  if (fd < 0)
    return journal_fail(L, "open", ".lock", err);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    close(fd);
    return fail(L, "the journal's .lock is not a file of this user");
  }
  int r;
  do
    r = flock(fd, LOCK_EX);
  while (r != 0 && errno == EINTR);
  if (r != 0) {
    err = errno;
    close(fd);
    return journal_fail(L, "flock", ".lock", err);
  }
  *u = fd;
  return 1;
}

/* lock:unlock() (and __gc): safe twice. */
static int journal_lock_unlock(lua_State *L) {
  int *u = luaL_checkudata(L, 1, JOURNAL_LOCK_MT);
  close_fd(u);
  return 0;
}

static void open_journal(lua_State *L) {
  luaL_newmetatable(L, JOURNAL_LOCK_MT);
  lua_pushcfunction(L, journal_lock_unlock);
  lua_setfield(L, -2, "__gc");
  lua_newtable(L);
  lua_pushcfunction(L, journal_lock_unlock);
  lua_setfield(L, -2, "unlock");
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
}
