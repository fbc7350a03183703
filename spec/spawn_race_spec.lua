-- The descriptors bubblewrap's own processes hold right after a spawn:
-- its launcher lets the sandbox's setup go on before it closes what it was
-- handed (its monitor's first act), and its init forks the interpreter
-- before it closes them, so under load the interpreter's first line can
-- come while either still holds the seccomp filter's memfd, the context's
-- and the driver's (fds 3, 4, 5): the session's own files, and no other.
-- The host's check takes those (the same files, by device and inode) and
-- nothing else. A stand-in bwrap widens that window: the real bubblewrap
-- with a close() that waits 300 ms before it closes a memfd.
local H = require("helpers")
local rlm = require("rlm")
local core = require("rlm.core")

local BWRAP = H.sh("command -v bwrap"):gsub("%s+$", "")
-- A directory of its own: as root the sandbox's uid runs the stand-in.
local dir

local SHIM = [[
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

__attribute__((constructor)) static void shim_init(void) {
  if (getenv("SPEC_HOLD_FOREIGN") != NULL)
    (void)memfd_create("not-handed", 0); /* inherited, never handed */
  unsetenv("SPEC_HOLD_FOREIGN");
  unsetenv("LD_PRELOAD");
}

int close(int fd) {
  static int (*real)(int);
  if (real == NULL)
    real = (int (*)(int))dlsym(RTLD_NEXT, "close");
  char path[64], target[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t n = fd >= 3 ? readlink(path, target, sizeof(target) - 1) : -1;
  if (n > 0) {
    target[n] = '\0';
    if (strncmp(target, "/memfd:", 7) == 0)
      usleep(300000);
  }
  return real(fd);
}
]]

-- The stand-in: a script named bwrap (what the host reads in /proc/<pid>/
-- comm) that execs the real one under the shim.
local function stand_in(name, env)
  local path = dir .. "/" .. name .. "/bwrap"
  H.sh(("mkdir -p %s/%s && chmod 755 %s %s/%s"):format(dir, name, dir, dir, name))
  local f = assert(io.open(path, "w"))
  f:write(("#!/bin/sh\n%sLD_PRELOAD=%s/slow_close.so exec %s \"$@\"\n"):format(env, dir, BWRAP))
  f:close()
  H.sh("chmod 755 " .. path)
  return path
end

describe("a sandbox whose bubblewrap still holds what the spawn handed it", function()
  setup(function()
    dir = H.sh("mktemp -d /tmp/rlm-slow-bwrap.XXXXXX"):gsub("%s+$", "")
    H.sh("chmod 755 " .. dir)
    local f = assert(io.open(dir .. "/slow_close.c", "w"))
    f:write(SHIM)
    f:close()
    -- The compiler without make check's preloaded sanitizers (its leak
    -- report failed the build there).
    H.sh(("env -u LD_PRELOAD cc -shared -fPIC -O1 -o %s/slow_close.so %s/slow_close.c -ldl && chmod -R a+rX %s")
      :format(dir, dir, dir))
    assert(H.sh("test -f " .. dir .. "/slow_close.so && echo yes"):match("yes"), "the shim did not build")
  end)

  teardown(function()
    H.sh("rm -rf " .. dir)
  end)

  it("starts: the session's own seccomp, context and driver memfds are not foreign", function()
    local result, err = H.run({
      sandbox = { bwrap = stand_in("own", "") },
      context = "the context",
      root_llm = H.script({ H.fence("FINAL(context)") }),
    })
    assert.is_nil(err and err.message)
    assert.equals("the context", result.answer)
  end)

  it("fails closed (sandbox_violation) on a memfd it was not handed", function()
    local _, err = H.run({
      sandbox = { bwrap = stand_in("foreign", "SPEC_HOLD_FOREIGN=1 ") },
      root_llm = H.script({ H.fence("FINAL('no')") }),
    })
    assert.equals("sandbox_violation", err and err.kind)
    assert.matches("/memfd:not-handed", err.message, 1, true)
  end)
end)

-- Spawns on keeper threads while other sessions' contexts are written and
-- sealed (a pool's refills are late contexts, written after the spawn):
-- every session answers from its own context, none from another's, and
-- no start reads as a violation.
describe("sessions started side by side", function()
  local pool
  after_each(function()
    if pool then
      pool:close()
      pool = nil
    end
    H.assert_clean()
  end)

  it("answers each of 64 sessions, 8 at a time, half on a pool of 4, from its own context, with no violation", function()
    pool = assert(rlm.Pool.new({ size = 4, sandbox = { tmpdir = H.tmpdir } }))
    local TOTAL, AT_ONCE = 64, 8
    local started, running, answers, errors = 0, {}, {}, {}
    local ws = assert(core.waitset())
    local t0 = core.now_ms()
    local function start_one()
      started = started + 1
      local i = started
      local s = rlm.Session.new(H.opts({ pool = i % 2 == 0 and pool or nil,
        context = ("context %d "):format(i):rep(100 * i),
        root_llm = function()
          error("pumped")
        end }))
      running[#running + 1] = { s = s, i = i }
    end
    while started < TOTAL or #running > 0 do
      while started < TOTAL and #running < AT_ONCE do
        start_one()
      end
      local idle = true
      for k = #running, 1, -1 do
        local r = running[k]
        local ev = r.s:poll()
        if ev then
          idle = false
          if ev.type == "root_llm" then
            r.s:reply(ev.id, H.fence("FINAL(' '.join(context.split(' ')[:2]) + ' ' + str(len(context)))"))
          elseif ev.type == "done" or ev.type == "error" then
            if ev.type == "done" then
              answers[r.i] = ev.result.answer
            else
              errors[#errors + 1] = ("session %d: %s: %s"):format(r.i, ev.err.kind, ev.err.message)
            end
            r.s:close()
            table.remove(running, k)
          end
        end
      end
      if idle then
        ws:wait(1)
      end
      assert(core.now_ms() - t0 < 120000, "the sessions did not end")
    end
    ws:close()
    assert.same({}, errors)
    for i = 1, TOTAL do
      assert.equals(("context %d %d"):format(i, #(("context %d "):format(i):rep(100 * i))), answers[i])
    end
  end)
end)
