# The two entry points. Both install missing Debian packages first.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)

.PHONY: deps build demo test clean

deps:
	./scripts/install-deps

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	./$(BUILD_DIR)/ferry demo

# The fuzz build's ctest is the short pass of tests/fuzz: about 20 s a target.
test: build fuzz-build
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600
	cd $(FUZZ_DIR) && ctest --output-on-failure --timeout 600

# The libFuzzer targets of tests/fuzz, in a clang build of their own:
# `make fuzz` runs each for FUZZ_SECONDS, FUZZ_JOBS at once, and, given
# FUZZ_JSON=path (say bench/results/fuzz-$$(date +%F).json), writes the
# report there.
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 1
FUZZ_JSON ?=
.PHONY: fuzz fuzz-build

$(FUZZ_DIR)/build.ninja:
	CC=clang-14 CXX=clang++-14 cmake -S . -B $(FUZZ_DIR) -G Ninja -DFERRY_FUZZ=ON \
	  -DFERRY_WITH_CUDA=OFF -DFERRY_WITH_PYTHON=OFF -DBUILD_TESTING=OFF

fuzz-build: deps $(FUZZ_DIR)/build.ninja
	cmake --build $(FUZZ_DIR) -j $(JOBS) --target fuzz_targets

fuzz: fuzz-build
	/usr/bin/python3 tests/fuzz/run.py --build-dir $(FUZZ_DIR) --seconds $(FUZZ_SECONDS) \
	  --jobs $(FUZZ_JOBS) $(if $(FUZZ_JSON),--json $(FUZZ_JSON))

# Sanitizer runs (docs/testing.md): `make test-asan` (ASan, LSan and UBSan)
# and `make test-tsan` each configure a build of their own, build it and run
# the whole ctest suite there. Neither is part of `make test` or .ci/run: each
# takes several times CI's normal build and run (measured in the doc).
# - Without CUDA (FERRY_WITH_CUDA=OFF). CI has no GPU, and the GPU tests skip
#   without one. The CUDA runtime is not instrumented anyway.
# - -O1 -g. Every object of the tree is instrumented, the generated protobuf
#   code included. gRPC, protobuf, absl, spdlog, httplib and OpenSSL are the
#   system's uninstrumented libraries. -Wno-tsan: gcc warns that TSan does not
#   model the std::atomic_thread_fence in asio's handler completion
#   (fenced_block). What that fence orders is also ordered by the scheduler's
#   mutex, which TSan sees.
# - tests/sanitizers/run-ctest runs ctest. It fails on any sanitizer report,
#   also one from a `ferry` child that no test looked at.
# - python_tests loads the extension into /usr/bin/python3, which is not
#   instrumented. Under ASan it runs on its own, with libasan preloaded and
#   leak checking off (what the interpreter holds at exit is not Ferry's).
#   libstdc++ is preloaded too: python3 does not link it, and without it
#   ASan's __cxa_throw interceptor has no real __cxa_throw to call (a CHECK
#   failure at the binding's first exception).
#   Under TSan it is left out. The tests order numpy buffers between Python
#   and the engine's threads through another process, which TSan cannot see:
#   with libtsan preloaded, recv into a registered buffer races with reading
#   it after the peer says it is done. Their transfer deadlines also pass
#   under the slowdown.
# - Timeouts: the suite's own limits (300 s an integration test, 120 s a store
#   test) hold under both. SAN_TIMEOUT is the limit for the other tests.
# Each entry of tests/sanitizers/*.supp says why it is not Ferry's bug.
ASAN_DIR ?= build-asan
TSAN_DIR ?= build-tsan
SAN_TIMEOUT ?= 900
SAN_SUPP := $(CURDIR)/tests/sanitizers
SAN_CMAKE := -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
             -DFERRY_WITH_CUDA=OFF
ASAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer
TSAN_FLAGS := -fsanitize=thread -Wno-tsan
ASAN_OPTS := halt_on_error=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:log_path=$(CURDIR)/$(ASAN_DIR)/sanitizer-logs/asan
ASAN_ENV := LSAN_OPTIONS=suppressions=$(SAN_SUPP)/lsan.supp \
            UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$(SAN_SUPP)/ubsan.supp
TSAN_ENV := TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(SAN_SUPP)/tsan.supp:log_path=$(CURDIR)/$(TSAN_DIR)/sanitizer-logs/tsan
SAN_CTEST := --output-on-failure --timeout $(SAN_TIMEOUT)
.PHONY: build-asan test-asan build-tsan test-tsan

# $(call san_build,dir,flags,env): configure (again, so that changed flags
# take effect), then build. The build runs the test binaries once, to list
# their tests, and so it needs the sanitizer's options too.
define san_build
	cmake -S . -B $(1) $(SAN_CMAKE) -DCMAKE_CXX_FLAGS="$(2)" -DCMAKE_EXE_LINKER_FLAGS="$(2)" \
	  -DCMAKE_SHARED_LINKER_FLAGS="$(2)" -DCMAKE_MODULE_LINKER_FLAGS="$(2)"
	mkdir -p $(1)/sanitizer-logs
	$(3) cmake --build $(1) -j $(JOBS)
endef

build-asan: deps
	$(call san_build,$(ASAN_DIR),$(ASAN_FLAGS),ASAN_OPTIONS=$(ASAN_OPTS) $(ASAN_ENV))

test-asan: build-asan
	rc=0; ASAN_OPTIONS=$(ASAN_OPTS) $(ASAN_ENV) \
	  tests/sanitizers/run-ctest $(ASAN_DIR) $(SAN_CTEST) -E '^python_tests$$' || rc=1; \
	ASAN_OPTIONS=$(ASAN_OPTS):detect_leaks=0 $(ASAN_ENV) \
	  LD_PRELOAD="$$($(CXX) -print-file-name=libasan.so) $$($(CXX) -print-file-name=libstdc++.so)" \
	  tests/sanitizers/run-ctest $(ASAN_DIR) $(SAN_CTEST) -R '^python_tests$$' || rc=1; \
	exit $$rc

build-tsan: deps
	$(call san_build,$(TSAN_DIR),$(TSAN_FLAGS),$(TSAN_ENV))

test-tsan: build-tsan
	$(TSAN_ENV) tests/sanitizers/run-ctest $(TSAN_DIR) $(SAN_CTEST) -E '^python_tests$$'

clean:
	rm -rf $(BUILD_DIR)
