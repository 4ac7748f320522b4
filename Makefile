# tinyloop - build, test, run. See README.md.
CC      ?= gcc
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -fPIC -fvisibility=hidden -pthread -Iengine -Ikernels/cpu
LDLIBS  += -lpcre2-8 -lm -pthread -ldl

LIB_SRC  := $(wildcard engine/*.c kernels/cpu/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=build/obj/%.o)
ASAN_OBJ := $(LIB_SRC:%.c=build/asan/%.o)
TSUP_SRC := $(wildcard tests/c/lib/*.c)
TSUP_OBJ := $(TSUP_SRC:%.c=build/obj/%.o)
TEST_SRC := $(wildcard tests/c/test_*.c)
TESTS    := $(TEST_SRC:tests/c/%.c=build/tests/%)
ASAN_TESTS := $(TEST_SRC:tests/c/%.c=build/tests-asan/%)
TOOLS    := bin/tl-gen-model

ASAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

# The default model for `make run` (fetched on first use); `make run MODEL=x.gguf` for any other.
DEFAULT_MODEL := $(or $(TINYLOOP_MODELS),$(HOME)/.cache/tinyloop/models)/gemma-3-270m-q4_k_m.gguf
MODEL   ?= $(DEFAULT_MODEL)
SMALL_MODEL := ../shared/models/stories260K.gguf

.PHONY: all test test-c test-asan fuzz bench bench-plot run repl serve model clean deps deps-check install uninstall soak test-long
all: build/libtinyloop.so build/libtinyloop.a bin/tinyloop $(TOOLS) lua/tinyloop/cdef.lua

# The CUDA kernels (build/libtinyloop-cuda.so, `make test-cuda`) when nvcc
# is found; `make CUDA=0` skips them. The engine dlopens the plugin (engine/backend.c).
-include kernels/cuda/Makefile.inc
all: cuda

# The FFI declarations are generated from the public header (macro free).
lua/tinyloop/cdef.lua: engine/tinyloop.h bindings/gen_cdef.lua
	luajit bindings/gen_cdef.lua engine/tinyloop.h $@

# Every object lists the headers it includes in a .d file beside it (-MMD);
# -MP adds an empty rule per header so a deleted header does not stop make.
DEPFLAGS := -MMD -MP
-include $(shell find build -name '*.d' 2>/dev/null)

# An object without its .d (built by an older Makefile, before -MMD) would
# never see a header change: such objects are removed here, so they rebuild
# once with their dependencies recorded.
NODEP_OBJ := $(shell find build/obj build/asan -name '*.o' 2>/dev/null | while read -r o; do \
                 [ -f "$${o%.o}.d" ] || echo "$$o"; done)
$(if $(NODEP_OBJ),$(shell rm -f $(NODEP_OBJ)))

build/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

build/asan/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) $(DEPFLAGS) -c $< -o $@

# The kernels' hot loops start on 64-byte boundaries, so their speed does
# not move with the size of code placed before them: an unrelated function
# added to quants_avx2.c shifted vdt_q8_0 and cost ~10% of a 110M Q8_0
# prefill on this AMD machine (2026-12-02, measured both ways).
build/obj/kernels/cpu/%.o: CFLAGS += -falign-functions=64 -falign-loops=64

# Test and tool sources see the test helpers; the engine does not.
build/obj/tests/%.o build/asan/tests/%.o build/obj/tools/%.o: CFLAGS += -Itests/c -Itests/c/lib

build/libtinyloop.a: $(LIB_OBJ)
	@mkdir -p build
	rm -f $@ && ar rcs $@ $^

build/libtinyloop.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS)

build/libtinyloop-asan.a: $(ASAN_OBJ)
	rm -f $@ && ar rcs $@ $^

CLI_SRC := $(wildcard engine/cli/*.c)
bin/tinyloop: $(CLI_SRC:%.c=build/obj/%.o) build/libtinyloop.a
	@mkdir -p bin
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

bin/tl-gen-model: build/obj/tools/gen_model.o $(TSUP_OBJ) build/libtinyloop.a
	@mkdir -p bin
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# A test links its object, the test helpers and the static library (the
# filter drops order-only extras such as the fake backend plugin).
$(TESTS): build/tests/%: build/obj/tests/c/%.o $(TSUP_OBJ) build/libtinyloop.a
	@mkdir -p build/tests
	$(CC) $(CFLAGS) -o $@ $(filter %.o,$^) $(filter %.a,$^) $(LDLIBS)

# The test plugin behind test_backend (the engine's side of engine/backend.h).
build/tests/libtl-fake-backend.so: build/obj/tests/c/fake_backend/fake_backend.o build/obj/engine/sampler.o build/obj/engine/util.o
	@mkdir -p build/tests
	$(CC) $(CFLAGS) -shared -o $@ $^ -lm
build/tests/test_backend build/tests-asan/test_backend: build/tests/libtl-fake-backend.so

$(ASAN_TESTS): build/tests-asan/%: build/asan/tests/c/%.o $(TSUP_SRC:%.c=build/asan/%.o) build/libtinyloop-asan.a
	@mkdir -p build/tests-asan
	$(CC) $(CFLAGS) $(ASAN_FLAGS) -o $@ $(filter %.o,$^) $(filter %.a,$^) $(LDLIBS)

# test_kv_quality measures with the code `tinyloop bench kv` reports with.
build/tests/test_kv_quality: build/obj/engine/cli/kv_eval.o
build/tests-asan/test_kv_quality: build/asan/engine/cli/kv_eval.o
build/obj/tests/c/test_kv_quality.o build/asan/tests/c/test_kv_quality.o: CFLAGS += -Iengine/cli

# The suites test the CPU path, and the CUDA backend's kernels on the CPU
# emulation (tests/gpu/emu, build/tests-emu); tests/gpu/run.sh (make
# test-cuda) runs the same GPU tests on a real device.
test test-asan: export TINYLOOP_BACKEND ?= cpu

# make test: every test (C, CLI, the equivalence tests again in each lossy KV mode, Lua specs,
# nginx, the GPU tests on the emulation), one summary line.
test: deps all $(TESTS) $(EMU_TESTS)
	@sh tests/run.sh build/tests $(EMU_TESTS) $(TESTS) tests/cli/test_cli.sh tests/kv_modes.sh tests/kv_tiers.sh tests/spec/run.sh tests/integration/run.sh

test-asan: deps-check build/libtinyloop-asan.a $(ASAN_TESTS) $(EMU_ASAN_TESTS)
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  TL_TEST_QUICK=1 sh tests/run.sh build/tests-asan $(EMU_ASAN_TESTS) $(ASAN_TESTS)

# make test-long: the cache property test at 1,000,000 random operations
# (make test runs 100,000), plain and under ASan/UBSan.
test-long: build/tests/test_cache_prop build/tests-asan/test_cache_prop
	@TL_PROP_OPS=1000000 sh tests/run.sh build/tests build/tests/test_cache_prop
	@ASAN_OPTIONS=detect_leaks=1 TL_PROP_OPS=1000000 sh tests/run.sh build/tests-asan build/tests-asan/test_cache_prop

FUZZ_TIME ?= 60
# The fuzz targets (tests/fuzz/fuzz_*.c) link one instrumented build of the
# library and the test helpers; the archive pulls in only what each needs.
FUZZ_BINS  := $(patsubst tests/fuzz/%.c,build/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iengine -Ikernels/cpu -Itests/c/lib
FUZZ_OBJ   := $(LIB_SRC:%.c=build/fuzz/obj/%.o) $(TSUP_SRC:%.c=build/fuzz/obj/%.o)

build/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_FLAGS) $(DEPFLAGS) -c $< -o $@

build/fuzz/libtinyloop-fuzz.a: $(FUZZ_OBJ)
	rm -f $@ && ar rcs $@ $^

$(FUZZ_BINS): build/fuzz/%: build/fuzz/obj/tests/fuzz/%.o build/fuzz/libtinyloop-fuzz.a
	clang $(FUZZ_FLAGS) -o $@ $^ -lpcre2-8 -lm -pthread -ldl

fuzz: $(FUZZ_BINS)
	sh tests/fuzz/run.sh build/fuzz/fuzz_gguf $(FUZZ_TIME)
	sh tests/fuzz/run_tokenizer.sh build/fuzz/fuzz_tokenizer $(FUZZ_TIME)
	sh tests/fuzz/run_model.sh build/fuzz/fuzz_model $(FUZZ_TIME)
	sh tests/fuzz/run_kv_file.sh build/fuzz/fuzz_kv_file $(FUZZ_TIME)

# Synthetic models shaped like stories110M (dim 768, 12 layers, 12 heads,
# vocab 32000) in the weight types llama.cpp's figures in the README use.
BENCH_TYPES  := f32 f16 q8_0 q4_0
BENCH_MODELS := $(BENCH_TYPES:%=build/bench/stories110M-%.gguf)
build/bench/stories110M-%.gguf: bin/tl-gen-model
	@mkdir -p build/bench
	./bin/tl-gen-model $@ --type $* --vocab 32000 --dim 768 --layers 12 --heads 12 --kv-heads 12 --ff 2048 --ctx 1024

# A PNG of tokens/s by model, weight type and batch size (gnuplot; BENCH_LOG=file plots a saved run).
bench-plot: all $(BENCH_MODELS)
	sh tools/bench_plot.sh build/bench/bench.png $(SMALL_MODEL) $(BENCH_MODELS)

bench: all $(BENCH_MODELS)
	@echo "== all threads"
	./bin/tinyloop bench -m $(SMALL_MODEL) $(BENCH_MODELS:%=-m %)
	@echo "== one thread (llama.cpp on this machine, one thread: stories260K ~10000, f32 ~85, f16 ~128, q8_0 ~200, q4_0 ~285 decode tok/s)"
	./bin/tinyloop bench -t 1 -m $(SMALL_MODEL) $(BENCH_MODELS:%=-m %)
	@echo "== prefix cache (ratios measured in this run)"
	./bin/tinyloop bench cache -m $(SMALL_MODEL) --max-seq-len 512
	./bin/tinyloop bench cache -m build/bench/stories110M-q8_0.gguf --max-seq-len 2048
	./bin/tinyloop bench tiers -m build/bench/stories110M-q8_0.gguf --max-seq-len 2048
	@echo "== KV cache modes (memory on the 110M shape; quality and speed on Gemma 3 270M when fetched, and stories260K)"
	$(MAKE) --no-print-directory bench-kv
	@echo "== serving (nginx on loopback): 1, 8, 32 clients with and without prefix reuse"
	luajit tools/load_bench.lua $(SMALL_MODEL)
	@echo "== eviction policies on a multi-tenant trace (LRU, shortest-first, cost-aware Lua; shadow predictions)"
	luajit tools/trace_bench.lua

# Issue 17's KV modes: bytes/token and 1,024-token sequences per 256 MiB for
# each mode, perplexity and greedy agreement vs f16, prefill/decode tok/s at a
# 2,048-token context and TTFT of a prefix-cache hit vs miss.
.PHONY: bench-kv
bench-kv: all build/bench/stories110M-q8_0.gguf
	./bin/tinyloop bench kv --only mem -m build/bench/stories110M-q8_0.gguf
	./bin/tinyloop bench kv

# Issue 14's three-tenant TTFT test through the servers: ours (nginx) against
# ik_llama.cpp's llama-server when ../shared/tools/anchor-build.sh has built it.
.PHONY: bench-server
bench-server: all build/bench/stories110M-q8_0.gguf
	luajit tools/server_bench.lua build/bench/stories110M-q8_0.gguf

# The main job: three tenants with system prompts in a PrefixPool (examples/serve_tenants.lua).
run: deps all
	@if [ "$(MODEL)" = "$(DEFAULT_MODEL)" ]; then sh tools/fetch_model.sh >/dev/null; fi
	luajit examples/serve_tenants.lua $(MODEL)

model:
	sh tools/fetch_model.sh

# OpenAI-compatible server in the foreground (nginx on localhost; MODEL=, PORT=).
serve: deps all
	sh tools/serve.sh

repl: deps all
	./bin/tinyloop repl $(SMALL_MODEL)

# make deps installs what is missing (as root; otherwise prints the apt-get
# line); deps-check only reports. See README "Two commands".
deps:
	@sh tools/deps.sh

deps-check:
	@sh tools/deps.sh --check

# A bounded soak of one engine (loopback, stories260K): SOAK_SECONDS (150),
# SOAK_CLIENTS (64); prints requests/s, TTFT p50/p99, errors by kind.
soak: deps-check all
	timeout 660 luajit tools/soak.lua

# make install [PREFIX=/usr/local] [DESTDIR=]: the library, header, tinyloop.pc,
# the CLI, the Lua modules where LuaJIT/OpenResty look (LUADIR), the policies
# and examples (DATADIR). With the default layout tinyloop.lib finds the
# library from the Lua files (LUADIR/../../../../lib), so a DESTDIR tree works
# where it lies. The rockspec (tinyloop-*.rockspec) calls this with its dirs.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
LUADIR     ?= $(PREFIX)/share/lua/5.1
DATADIR    ?= $(PREFIX)/share/tinyloop
INSTALL_LUA  = $(sort $(wildcard lua/tinyloop/*.lua lua/tinyloop/*/*.lua) lua/tinyloop/cdef.lua)
INSTALL_DATA = $(wildcard lua/policies/*.lua examples/*.conf examples/*.lua examples/README.md examples/policies/*)

install: build/libtinyloop.so build/libtinyloop.a bin/tinyloop lua/tinyloop/cdef.lua
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(DATADIR)
	install -m 755 bin/tinyloop $(DESTDIR)$(BINDIR)/tinyloop
	install -m 755 build/libtinyloop.so $(DESTDIR)$(LIBDIR)/libtinyloop.so
	if [ -f build/libtinyloop-cuda.so ]; then install -m 755 build/libtinyloop-cuda.so $(DESTDIR)$(LIBDIR)/; fi
	install -m 644 build/libtinyloop.a $(DESTDIR)$(LIBDIR)/libtinyloop.a
	install -m 644 engine/tinyloop.h $(DESTDIR)$(INCLUDEDIR)/tinyloop.h
	sed -e 's#^prefix=.*#prefix=$(PREFIX)#' -e 's#^libdir=.*#libdir=$(LIBDIR)#' \
	    -e 's#^includedir=.*#includedir=$(INCLUDEDIR)#' \
	    bindings/tinyloop.pc > $(DESTDIR)$(LIBDIR)/pkgconfig/tinyloop.pc
	for f in $(INSTALL_LUA); do install -D -m 644 $$f $(DESTDIR)$(LUADIR)/$${f#lua/}; done
	for f in $(INSTALL_DATA); do install -D -m 644 $$f $(DESTDIR)$(DATADIR)/$${f#lua/}; done
	sed -e 's#^\( *lua_package_path \).*#\1"$(LUADIR)/?.lua;$(LUADIR)/?/init.lua;;";#' \
	    examples/nginx.conf > $(DESTDIR)$(DATADIR)/examples/nginx.conf
	sed -e 's#^\( *lua_package_path \).*#\1"$(LUADIR)/?.lua;$(LUADIR)/?/init.lua;;";#' \
	    examples/nginx-front.conf > $(DESTDIR)$(DATADIR)/examples/nginx-front.conf

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/tinyloop $(DESTDIR)$(LIBDIR)/libtinyloop.so $(DESTDIR)$(LIBDIR)/libtinyloop-cuda.so \
	    $(DESTDIR)$(LIBDIR)/libtinyloop.a $(DESTDIR)$(LIBDIR)/pkgconfig/tinyloop.pc $(DESTDIR)$(INCLUDEDIR)/tinyloop.h
	rm -rf $(DESTDIR)$(LUADIR)/tinyloop $(DESTDIR)$(DATADIR)

clean:
	rm -rf build bin lua/tinyloop/cdef.lua
