/* interrupt.c: see interrupt.h. */
#define _GNU_SOURCE
#include "interrupt.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>

static struct sigaction interrupt_prev; /* written only while not armed */
static _Atomic(uv_async_t *) interrupt_target;
static atomic_uint interrupt_seen;
static atomic_int interrupt_armed;

static void on_sigint(int sig, siginfo_t *info, void *ctx) {
  int saved = errno;
  if (interrupt_prev.sa_flags & SA_SIGINFO)
    interrupt_prev.sa_sigaction(sig, info, ctx);
  else
    interrupt_prev.sa_handler(sig);
  atomic_fetch_add(&interrupt_seen, 1);
  uv_async_t *wake = atomic_load(&interrupt_target);
  if (wake != NULL)
    (void)uv_async_send(wake);
  errno = saved;
}

static int is_ours(const struct sigaction *sa) {
  return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == on_sigint;
}

int rlm_interrupt_arm(void) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&interrupt_armed, &expected, 1))
    return 0;
  struct sigaction cur;
  if (sigaction(SIGINT, NULL, &cur) != 0 || is_ours(&cur) ||
      cur.sa_handler == SIG_DFL || cur.sa_handler == SIG_IGN) {
    atomic_store(&interrupt_armed, 0);
    return 0;
  }
  interrupt_prev = cur;
  struct sigaction ours = cur;
  ours.sa_flags |= SA_SIGINFO;
  ours.sa_sigaction = on_sigint;
  if (sigaction(SIGINT, &ours, NULL) != 0) {
    atomic_store(&interrupt_armed, 0);
    return 0;
  }
  return 1;
}

void rlm_interrupt_disarm(void) {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  /* Fails only for a bad argument. */
  int masked = pthread_sigmask(SIG_BLOCK, &block, &old) == 0;
  struct sigaction cur;
  if (sigaction(SIGINT, NULL, &cur) == 0 && is_ours(&cur))
    (void)sigaction(SIGINT, &interrupt_prev, NULL); /* what was there */
  if (masked)
    (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
  atomic_store(&interrupt_armed, 0);
}

void rlm_interrupt_wake(uv_async_t *wake) {
  atomic_store(&interrupt_target, wake);
}

unsigned rlm_interrupt_count(void) { return atomic_load(&interrupt_seen); }
