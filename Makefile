# rlm: build rlm/core.so once per Lua ABI, run the specs under every Lua.
CC ?= cc
CFLAGS ?= -O2 -g
WARN = -std=c11 -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes
ALL_CFLAGS = $(WARN) -fPIC -fvisibility=hidden $(CFLAGS) $(XCFLAGS)
LDLIBS = -luv -lpthread
# One unit (csrc/rlm.c includes the others): every function static, only
# luaopen_rlm_core exported.
SRC = csrc/rlm.c
HDR = $(wildcard csrc/*.c csrc/*.h)

# ABI name -> headers. LuaJIT uses the 5.1 ABI and the 5.1 build.
INC_5.1 = /usr/include/lua5.1
INC_5.3 = /usr/include/lua5.3
INC_5.4 = /usr/include/lua5.4
ABIS = 5.1 5.3 5.4
LUAS = lua5.1 lua5.3 lua5.4 luajit
abi_of = $(if $(filter luajit lua5.1,$(1)),5.1,$(patsubst lua%,%,$(1)))

# Everything the specs need (make test, CI's make deps); the demo needs far
# less: Lua 5.4 and its headers, the core's build, the sandbox, and LuaSocket
# and LuaSec for the real-model route (no other Lua, no chromium).
DEB_PKGS = lua5.1 liblua5.1-0-dev lua5.3 liblua5.3-dev lua5.4 liblua5.4-dev \
  luajit libluajit-5.1-dev lua-cjson libuv1-dev lua-busted bubblewrap python3 \
  lua-socket lua-sec openssl lua-luv chromium gcc libc6-dev make luarocks redis-server lua-redis
DEMO_PKGS = lua5.4 liblua5.4-dev lua-cjson libuv1-dev bubblewrap python3 lua-socket lua-sec gcc libc6-dev make

.PHONY: all deps demo-deps test check demo clean install install-keeper keeper-rock bench fuzz soak lint
BUILD ?= build
all: $(foreach a,$(ABIS),$(BUILD)/$(a)/rlm/core.so) $(BUILD)/rlm-keeper

# A Lua whose headers are missing stops the build with one line that names
# the package (plain make after make demo, which installs Lua 5.4's only,
# ended in cc's "lauxlib.h: No such file or directory").
DEV_5.1 = liblua5.1-0-dev
DEV_5.3 = liblua5.3-dev
DEV_5.4 = liblua5.4-dev
$(BUILD)/%/rlm/core.so: $(SRC) $(HDR)
	@test -f $(INC_$*)/lauxlib.h || { echo "make: no Lua $* headers in $(INC_$*): apt-get install $(DEV_$*), or make deps for every Lua (make demo builds Lua 5.4's only)" >&2; exit 1; }
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -I$(INC_$*) -shared -o $@ $(SRC) $(LDFLAGS) $(LDLIBS)

# rlm-keeper, the far side of the exec backend (docs/protocol.md, "The
# stream"): the same units as rlm.core, without Lua, as a program. The
# shared units have functions it does not call (the Lua bindings' own), so
# -Wunused-function is off here; rlm.core's build keeps it on for all.
KEEPER_SRC = csrc/rlm_keeper.c
$(BUILD)/rlm-keeper: $(KEEPER_SRC) $(HDR)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) -Wno-unused-function $(CFLAGS) $(XCFLAGS) -o $@ $(KEEPER_SRC) $(LDFLAGS) $(LDLIBS)

# $(call apt_missing,PACKAGES): installs those of PACKAGES that are not
# installed, without their recommended packages, and nothing else.
apt_missing = @missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "all Debian packages present"; fi

deps:
	$(call apt_missing,$(DEB_PKGS))

demo-deps:
	$(call apt_missing,$(DEMO_PKGS))

# LUA_PATH/LUA_CPATH for one Lua: our modules first, then the system's.
lua_env = LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua;$(CURDIR)/spec/?.lua;;" \
  LUA_CPATH="$(CURDIR)/build/$(call abi_of,$(1))/?.so;;"

test: deps
	@$(MAKE) --no-print-directory all
	@./spec/run $(LUAS)

# The specs of the core's own paths (spec/groups' sanitized) under
# AddressSanitizer and UBSan, with a separate build, on the
# two C ABIs: 5.1 (which LuaJIT loads too) and 5.4 (the core has no branch
# that tells 5.3 from 5.4: its few split 5.1 from 5.2 on). The interpreters
# are not instrumented, so the runtime is preloaded.
# Evaluated when check runs (=, not :=): on a fresh system make demo runs
# before any compiler is installed, and := printed "make: cc: No such file
# or directory" first.
ASAN_LIB = $(shell $(CC) -print-file-name=libasan.so)
check: deps
	$(MAKE) BUILD=build-asan CFLAGS="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=address,undefined" all
	RLM_SPEC_GROUP=sanitized RLM_SPEC_BUILD=build-asan RLM_SPEC_PRELOAD=$(ASAN_LIB) ./spec/run lua5.1 lua5.4

demo: demo-deps
	@$(MAKE) --no-print-directory $(BUILD)/5.4/rlm/core.so
	@$(call lua_env,lua5.4) lua5.4 examples/demo.lua
	@echo; echo "=== the same task, the root model writing the paper's prose format ==="; echo
	@$(call lua_env,lua5.4) RLM_DEMO_STYLE=prose lua5.4 examples/demo.lua

# big.log: the demo's 20 MB of synthetic service logs (RLM_DEMO_MB for
# another size), for the examples of README.md and docs/cli.md.
big.log: examples/demo.lua
	@$(call lua_env,lua5.4) lua5.4 examples/demo.lua --write $@

# luacheck (Debian's lua-check) on every Lua file, and clang-format's view
# of the C.
lint:
	@dpkg-query -W -f='$${Status}\n' lua-check clang-format 2>/dev/null | grep -c 'install ok installed' | grep -q 2 || \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lua-check clang-format
	luacheck lua spec bench examples bin/rlm k8s/sessions.lua
	clang-format --dry-run --Werror csrc/*.c csrc/*.h fuzz/*.c

# The benchmarks: each figure beside a floor measured in the same run;
# writes bench/RESULTS.md. Not timed in make test (spec/bench_spec.lua runs
# them once at tiny sizes).
bench: deps
	@$(MAKE) --no-print-directory all
	@bench/run

# libFuzzer on the framer and the protocol decoder; FUZZ_SECONDS to run.
FUZZ_SECONDS ?= 600
fuzz: deps
	@dpkg-query -W -f='$${Status}\n' clang libclang-rt-14-dev 2>/dev/null | grep -c 'install ok installed' | grep -q 2 || \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev
	@mkdir -p build/fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -I$(INC_5.4) -o build/fuzz/framing_fuzz \
	  fuzz/framing_fuzz.c -llua5.4
	clang -g -O1 -fsanitize=fuzzer,address,undefined -o build/fuzz/jsonread_fuzz fuzz/jsonread_fuzz.c
	cp -r fuzz/corpus build/fuzz/corpus-run
	LUA_CPATH="/usr/lib/x86_64-linux-gnu/lua/5.4/?.so;;" build/fuzz/framing_fuzz \
	  -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -print_final_stats=1 build/fuzz/corpus-run fuzz/corpus
	mkdir -p build/fuzz/jsonread-run
	build/fuzz/jsonread_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -print_final_stats=1 \
	  build/fuzz/jsonread-run fuzz/jsonread_corpus

# 1,000 sessions with random faults; the host's fds, children, RSS and
# workdirs must come back to where they started.
SOAK_SESSIONS ?= 1000
soak: deps
	@$(MAKE) --no-print-directory all
	@$(call lua_env,lua5.4) SOAK_SESSIONS=$(SOAK_SESSIONS) lua5.4 spec/soak.lua

# make install [PREFIX=/usr/local] [DESTDIR=]: the Lua modules for every Lua
# ABI (LuaJIT reads the 5.1 tree) with the driver (repl_driver.py and its
# package _rlm_driver/), the probe, the macOS profile and the container
# backends' seccomp profile beside them (rlm.sandbox.bwrap and
# rlm.sandbox.container look next to the modules), core.so, and bin/rlm.
PREFIX ?= /usr/local
LUA_MODULES = $(shell cd lua && find rlm -name '*.lua' | sort)
DRIVER_MODULES = $(shell cd python && find _rlm_driver -name '*.py' | sort)
install: all
	@set -e; for a in $(ABIS); do \
	  share=$(DESTDIR)$(PREFIX)/share/lua/$$a; lib=$(DESTDIR)$(PREFIX)/lib/lua/$$a; \
	  for m in $(LUA_MODULES); do install -D -m 644 lua/$$m $$share/$$m; done; \
	  install -m 644 python/repl_driver.py python/probe.py sandbox/macos.sb sandbox/rlm-seccomp.json $$share/rlm/; \
	  for m in $(DRIVER_MODULES); do install -D -m 644 python/$$m $$share/rlm/$$m; done; \
	  install -D -m 755 $(BUILD)/$$a/rlm/core.so $$lib/rlm/core.so; \
	  echo "installed $$share/rlm and $$lib/rlm/core.so"; \
	done
	install -D -m 755 bin/rlm $(DESTDIR)$(PREFIX)/bin/rlm
	@$(MAKE) --no-print-directory install-keeper

# rlm-keeper and the driver's files it hands its sandbox: the binary in
# BINDIR, the files in KEEPER_SHARE (PREFIX/share/rlm-keeper, where the
# keeper looks beside its bin/). The rock rlm-keeper (luarocks' make
# backend, rlm-keeper-scm-1.rockspec) builds with keeper-rock, which
# compiles KEEPER_SHARE in (luarocks deploys the binary to its tree's bin/,
# away from the rock's own directory), and installs with this target.
BINDIR ?= $(PREFIX)/bin
KEEPER_SHARE ?= $(PREFIX)/share/rlm-keeper
KEEPER_BIN ?= $(BUILD)/rlm-keeper
install-keeper: $(KEEPER_BIN)
	install -D -m 755 $(KEEPER_BIN) $(DESTDIR)$(BINDIR)/rlm-keeper
	@set -e; k=$(DESTDIR)$(KEEPER_SHARE); \
	  install -D -m 644 python/repl_driver.py python/probe.py -t $$k; \
	  for m in $(DRIVER_MODULES); do install -D -m 644 python/$$m $$k/$$m; done; \
	  echo "installed $(DESTDIR)$(BINDIR)/rlm-keeper and $$k"

keeper-rock: $(KEEPER_SRC) $(HDR)
	@mkdir -p $(BUILD)/rock
	$(CC) $(WARN) -Wno-unused-function $(CFLAGS) -DRLM_KEEPER_SHARE='"$(KEEPER_SHARE)"' \
	  -o $(BUILD)/rock/rlm-keeper $(KEEPER_SRC) $(LDFLAGS) $(LDLIBS)

# Sessions driven from inside real hosts: headless Neovim and nginx with the
# Lua module (spec/hosts/). spec/hosts/deps installs neovim and nginx-core
# and unpacks the Lua module into build/resty-root without installing it.
.PHONY: test-nvim test-resty test-hosts
test-nvim: deps
	@spec/hosts/deps nvim
	@$(MAKE) --no-print-directory $(BUILD)/5.1/rlm/core.so
	@RLM_BUILD=$(abspath $(BUILD)) spec/hosts/run nvim
test-resty: deps
	@spec/hosts/deps nginx
	@$(MAKE) --no-print-directory $(BUILD)/5.1/rlm/core.so
	@RLM_BUILD=$(abspath $(BUILD)) spec/hosts/run nginx
test-hosts: deps
	@spec/hosts/deps nvim nginx
	@$(MAKE) --no-print-directory $(BUILD)/5.1/rlm/core.so
	@RLM_BUILD=$(abspath $(BUILD)) spec/hosts/run nvim nginx settings

# make openresty-example: examples/openresty (POST /ask) in nginx on a
# fresh Debian 12, in the foreground on 127.0.0.1:8080
# (RLM_OPENRESTY_PORT), its models from the settings every host reads
# (docs/llm.md, "Settings"). Installs what is missing (nginx-core only where
# apt would remove nothing), unpacks the nginx Lua module as the host tests
# do (spec/hosts/deps nginx: installing it would remove Debian's luajit),
# builds the 5.1 core, and has examples/openresty/run write
# $(BUILD)/openresty/PORT/nginx.conf with this checkout's paths and start
# nginx. spec/hosts/nginx/example.py runs exactly this.
# curl is for the request the docs send it (docs/adapters.md): Debian 12's
# standard system has none.
OPENRESTY_PKGS = gcc libc6-dev make libuv1-dev liblua5.1-0-dev lua5.1 lua-cjson bubblewrap python3 ca-certificates curl
.PHONY: openresty-example
openresty-example:
	$(call apt_missing,$(OPENRESTY_PKGS))
	@spec/hosts/deps nginx
	@$(MAKE) --no-print-directory $(BUILD)/5.1/rlm/core.so
	@RLM_BUILD=$(abspath $(BUILD)) examples/openresty/run

# make nvim: what a Neovim plugin manager runs in the clone (lazy.nvim's
# `build = "make nvim"`). Neovim runs LuaJIT, the Lua 5.1 ABI, and its
# loader finds C modules on 'runtimepath' as lua/<name>.so, so the 5.1 core
# goes to lua/rlm/core.so (gitignored): the clone on 'runtimepath' is then
# all Neovim needs. Installs only what that takes, with apt and only when
# missing; not as root, it names what is missing and stops. curl is the
# plugin's HTTP client (rlm.llm.transport.nvim): Debian 12's standard
# system has none, and without it every :RlmAsk failed.
# libc6-dev: gcc without its recommended packages has no C library
# headers (stdint.h: No such file), and nothing else here pulls them in.
NVIM_PKGS = gcc libc6-dev make libuv1-dev libluajit-5.1-dev lua-cjson bubblewrap python3 curl
NVIM_INC = $(firstword $(wildcard /usr/include/luajit-2.1) $(INC_5.1))
.PHONY: nvim nvim-deps
nvim: nvim-deps
	@$(MAKE) --no-print-directory INC_5.1=$(NVIM_INC) $(BUILD)/5.1/rlm/core.so
	@install -m 755 $(BUILD)/5.1/rlm/core.so lua/rlm/core.so
	@echo "lua/rlm/core.so built for Neovim (Lua 5.1 ABI); check it with :checkhealth rlm"
nvim-deps:
	@command -v dpkg-query >/dev/null || { echo "make nvim: not a Debian system; needs a C compiler, libuv, LuaJIT (or Lua 5.1) headers, lua-cjson for Lua 5.1, bubblewrap and python3"; exit 0; }; \
	missing=$$(for p in $(NVIM_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" -ne 0 ]; then \
	  echo "make nvim: missing Debian packages:" $$missing; \
	  echo "  install them first: sudo apt-get install" $$missing; exit 1; \
	fi; \
	echo "installing:" $$missing; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing

# make image: the sandbox image for the container backends
# (docs/backends.md): Debian's essential set, python3, bubblewrap, libuv1,
# the driver's files in /usr/local/share/rlm-keeper/ and rlm-keeper, run as
# uid 10001. sandbox/image/build makes the root filesystem with mmdebstrap
# (as root; Debian's archive is all the network it needs) into
# $(IMAGE_TAR), reproducibly (the same packages give the same bytes), and
# sandbox/image/import has Podman import it as $(IMAGE_TAG), with the
# image's configuration (its user, and rlm-keeper as its command). Also
# $(BUILD)/rlm-seccomp.json: Podman's seccomp profile with what bubblewrap
# needs inside the container allowed (sandbox/image/seccomp.py says why
# that gives the container nothing).
# rlm-keeper is $(BUILD)/rlm-keeper, built by its own rule (csrc/rlm_keeper.c,
# issue 27's other half); while that file does not exist, the image is
# built without it (the driver, python3 and bubblewrap, no keeper, no CMD).
IMAGE_VERSION := $(shell sed -n 's/^return "\([^"]*\)"$$/\1/p' lua/rlm/base/version.lua)
IMAGE_TAG ?= localhost/rlm-sandbox:$(IMAGE_VERSION)
IMAGE_TAR = $(BUILD)/rlm-sandbox-$(IMAGE_VERSION).tar
IMAGE_KEEPER = $(if $(wildcard csrc/rlm_keeper.c),$(BUILD)/rlm-keeper)
IMAGE_PKGS = mmdebstrap podman runc uidmap
IMAGE_INPUTS = sandbox/image/build python/repl_driver.py python/probe.py \
  $(wildcard python/_rlm_driver/*.py) lua/rlm/sandbox/bwrap.lua
.PHONY: image image-deps image-check image-tar-path
image: image-deps $(IMAGE_TAR) $(BUILD)/rlm-seccomp.json
	@sandbox/image/import $(IMAGE_TAR) $(IMAGE_TAG)
# make image twice from scratch: the host's apt state must be as it was and
# the two tarballs the same bytes (sandbox/image/check; .ci/run runs it).
image-check:
	@sandbox/image/check $(MAKE) BUILD=$(BUILD)
image-tar-path:
	@echo $(IMAGE_TAR)
image-deps:
	@missing=$$(for p in $(IMAGE_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
$(IMAGE_TAR): $(IMAGE_INPUTS) $(IMAGE_KEEPER)
	@mkdir -p $(dir $@)
	sandbox/image/build $@.part $(IMAGE_KEEPER)
	@mv $@.part $@
	@echo "$@: $$(du -m $@ | cut -f1) MB"
$(BUILD)/rlm-seccomp.json: sandbox/image/seccomp.py
	@mkdir -p $(dir $@)
	python3 sandbox/image/seccomp.py /usr/share/containers/seccomp.json $@

# make k8s-e2e: a real one-node Kubernetes cluster from Debian's packages
# (kube-apiserver, the kubelet and kubectl built from Debian's kubernetes
# source package with Debian's Go, cached in build/k8s; etcd, containerd,
# runc and the CNI bridge), in network, mount and PID namespaces of its
# own, running sessions of the image above in pods of docs/backends.md's
# template beside the local backend: k8s/e2e says each step,
# docs/backends.md what it needs and printed. As root. Not part of make
# test or .ci/run: its first run builds Kubernetes (tens of minutes).
.PHONY: k8s-e2e
k8s-e2e: image-deps all $(IMAGE_TAR) $(BUILD)/rlm-seccomp.json
	@k8s/e2e $(IMAGE_TAR) $(IMAGE_VERSION)

clean:
	rm -rf build build-asan lua/rlm/core.so
