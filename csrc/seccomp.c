/* seccomp.c: what the REPL may not ask the kernel for. Raw BPF rather than
 * libseccomp: about 200 instructions, no extra library in the host process
 * or the build, and every rule readable here.
 *
 * Denied with EPERM: other processes (ptrace, process_vm_*), kernel attack
 * surface the REPL never needs (io_uring, bpf, perf_event_open, userfaultfd,
 * keyrings, module and kexec loading, open_by_handle_at), the mount family
 * and the namespace calls, every socket(), memory the watchdog cannot see
 * (memfd_create, memfd_secret, SysV IPC, POSIX message queues), the
 * instances the kernel counts per host user (inotify, fanotify), new
 * processes (fork, vfork, clone without CLONE_THREAD or with namespace
 * flags), the terminal injection ioctls TIOCSTI and TIOCLINUX, compared on
 * the low 32 bits of the request (CVE-2019-10063), and fcntl F_SETPIPE_SZ
 * (its cmd is an unsigned int to the kernel: the low 32 bits). clone3 gets
 * ENOSYS so that libc falls back to clone, whose flags a filter can read.
 * Another architecture's syscalls (x32, or i386 through int 0x80) kill the
 * process.
 *
 * No setuid or setgid file, and no device node, can be made: the chmod
 * family and the calls that create a file or directory get EPERM when their
 * mode has S_ISUID or S_ISGID; mknod and mknodat always; the setxattr family
 * always (file capabilities are an xattr). openat2 gets ENOSYS (its mode sits
 * in a struct the filter cannot read; libc falls back to openat). */
#define _GNU_SOURCE
#include "seccomp.h"
#include "workdir.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define RLM_AUDIT_ARCH AUDIT_ARCH_X86_64
#define RLM_X32_BIT 0x40000000u
#elif defined(__aarch64__)
#define RLM_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "rlm: no seccomp architecture for this target"
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ARG_LOW(n) (offsetof(struct seccomp_data, args) + 8 * (n))
#else
#define ARG_LOW(n) (offsetof(struct seccomp_data, args) + 8 * (n) + 4)
#endif

#ifndef TIOCLINUX
#define TIOCLINUX 0x541C
#endif

/* Newer than some headers; the numbers are the same on every architecture
 * that has them. */
#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif
#ifndef SYS_setxattrat
#define SYS_setxattrat 463
#endif
#ifndef SYS_memfd_secret
#define SYS_memfd_secret 447
#endif
#ifndef F_SETPIPE_SZ
#define F_SETPIPE_SZ 1031
#endif

#define NS_FLAGS                                                               \
  (CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |  \
   CLONE_NEWNET | CLONE_NEWCGROUP)

#define DENY_EPERM(nr)                                                         \
  BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1),                             \
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM)

/* EPERM when the mode in argument k has the setuid or setgid bit. */
#define DENY_SETID_MODE(nr, k)                                                 \
  BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 4),                             \
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LOW(k)),                          \
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, S_ISUID | S_ISGID, 0, 1),           \
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),                    \
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

static const struct sock_filter program[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, RLM_AUDIT_ARCH, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
#ifdef RLM_X32_BIT
    BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, RLM_X32_BIT, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
#endif

    /* clone: threads only, and never a new namespace. */
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 5),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LOW(0)),
    BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, NS_FLAGS, 2, 0),
    BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_THREAD, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),

    /* ioctl: no keystrokes into a terminal. */
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, 0, 5),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LOW(1)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, TIOCSTI, 1, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, TIOCLINUX, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),

    /* fcntl: no pipe buffer past the default 64 KiB (the kernel's pages,
     * charged to the host user's pipe budget, shown in no RSS). */
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_fcntl, 0, 4),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LOW(1)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, F_SETPIPE_SZ, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),

#ifdef SYS_clone3
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
#endif

    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat2, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),

/* No setuid or setgid file or directory. */
#ifdef SYS_chmod
    DENY_SETID_MODE(SYS_chmod, 1),
#endif
    DENY_SETID_MODE(SYS_fchmod, 1),
    DENY_SETID_MODE(SYS_fchmodat, 2),
    DENY_SETID_MODE(SYS_fchmodat2, 2),
#ifdef SYS_open
    DENY_SETID_MODE(SYS_open, 2),
#endif
    DENY_SETID_MODE(SYS_openat, 3),
#ifdef SYS_creat
    DENY_SETID_MODE(SYS_creat, 1),
#endif
#ifdef SYS_mkdir
    DENY_SETID_MODE(SYS_mkdir, 1),
#endif
    DENY_SETID_MODE(SYS_mkdirat, 2),
#ifdef SYS_mknod
    DENY_EPERM(SYS_mknod),
#endif
    DENY_EPERM(SYS_mknodat),
    DENY_EPERM(SYS_setxattr),
    DENY_EPERM(SYS_lsetxattr),
    DENY_EPERM(SYS_fsetxattr),
    DENY_EPERM(SYS_setxattrat),

#ifdef SYS_fork
    DENY_EPERM(SYS_fork),
#endif
#ifdef SYS_vfork
    DENY_EPERM(SYS_vfork),
#endif
    DENY_EPERM(SYS_ptrace),
    DENY_EPERM(SYS_process_vm_readv),
    DENY_EPERM(SYS_process_vm_writev),
    DENY_EPERM(SYS_io_uring_setup),
    DENY_EPERM(SYS_io_uring_enter),
    DENY_EPERM(SYS_io_uring_register),
    DENY_EPERM(SYS_bpf),
    DENY_EPERM(SYS_perf_event_open),
    DENY_EPERM(SYS_userfaultfd),
    DENY_EPERM(SYS_keyctl),
    DENY_EPERM(SYS_add_key),
    DENY_EPERM(SYS_request_key),
    DENY_EPERM(SYS_mount),
    DENY_EPERM(SYS_umount2),
    DENY_EPERM(SYS_pivot_root),
    DENY_EPERM(SYS_fsopen),
    DENY_EPERM(SYS_fsconfig),
    DENY_EPERM(SYS_fsmount),
    DENY_EPERM(SYS_fspick),
    DENY_EPERM(SYS_move_mount),
    DENY_EPERM(SYS_open_tree),
#ifdef SYS_mount_setattr
    DENY_EPERM(SYS_mount_setattr),
#endif
    DENY_EPERM(SYS_unshare),
    DENY_EPERM(SYS_setns),
    DENY_EPERM(SYS_kexec_load),
    DENY_EPERM(SYS_kexec_file_load),
    DENY_EPERM(SYS_init_module),
    DENY_EPERM(SYS_finit_module),
    DENY_EPERM(SYS_delete_module),
    DENY_EPERM(SYS_open_by_handle_at),
    DENY_EPERM(SYS_socket),
    DENY_EPERM(SYS_memfd_create),
    DENY_EPERM(SYS_memfd_secret),

    /* SysV IPC and POSIX message queues: kernel memory (a namespace's
     * queues hold up to msgmni x msgmnb, 500 MiB) that no RSS shows. */
    DENY_EPERM(SYS_shmget),
    DENY_EPERM(SYS_shmat),
    DENY_EPERM(SYS_shmdt),
    DENY_EPERM(SYS_shmctl),
    DENY_EPERM(SYS_msgget),
    DENY_EPERM(SYS_msgsnd),
    DENY_EPERM(SYS_msgrcv),
    DENY_EPERM(SYS_msgctl),
    DENY_EPERM(SYS_semget),
    DENY_EPERM(SYS_semop),
    DENY_EPERM(SYS_semtimedop),
    DENY_EPERM(SYS_semctl),
    DENY_EPERM(SYS_mq_open),
    DENY_EPERM(SYS_mq_unlink),
    DENY_EPERM(SYS_mq_timedsend),
    DENY_EPERM(SYS_mq_timedreceive),
    DENY_EPERM(SYS_mq_notify),
    DENY_EPERM(SYS_mq_getsetattr),

/* inotify and fanotify instances count against the host user's 128 (a
 * count kept per uid up the user namespaces), whatever the sandbox. */
#ifdef SYS_inotify_init
    DENY_EPERM(SYS_inotify_init),
#endif
    DENY_EPERM(SYS_inotify_init1),
    DENY_EPERM(SYS_fanotify_init),
    DENY_EPERM(SYS_pidfd_getfd),
    DENY_EPERM(SYS_chroot),

    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
};

const struct sock_fprog *rlm_seccomp_program(void) {
  static const struct sock_fprog prog = {
      .len = (unsigned short)(sizeof(program) / sizeof(program[0])),
      .filter = (struct sock_filter *)program,
  };
  return &prog;
}

int rlm_seccomp_fd(char *err, size_t errlen) {
  int fd = (int)syscall(SYS_memfd_create, "rlm-seccomp",
                        MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    snprintf(err, errlen, "memfd_create: %s", strerror(errno));
    return -1;
  }
  const char *p = (const char *)program;
  size_t left = sizeof(program);
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      snprintf(err, errlen, "writing the seccomp filter: %s", strerror(errno));
      close(fd);
      return -1;
    }
    p += n;
    left -= (size_t)n;
  }
  if (fcntl(fd, F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0 ||
      lseek(fd, 0, SEEK_SET) != 0) {
    snprintf(err, errlen, "sealing the seccomp filter: %s", strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

static pthread_mutex_t shared_mu = PTHREAD_MUTEX_INITIALIZER;
static int shared_fd = -1;

int rlm_seccomp_open(char *err, size_t errlen) {
  pthread_mutex_lock(&shared_mu);
  if (shared_fd < 0)
    shared_fd = rlm_seccomp_fd(err, errlen);
  int fd = shared_fd;
  pthread_mutex_unlock(&shared_mu);
  if (fd < 0)
    return -1;
  int own = rlm_sealed_reopen(fd);
  if (own < 0)
    snprintf(err, errlen, "reopening the seccomp filter: %s", strerror(errno));
  return own;
}
