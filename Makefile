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
# `make fuzz` runs each for FUZZ_SECONDS and, given FUZZ_JSON=path (say
# bench/results/fuzz-$$(date +%F).json), writes the report there.
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_JSON ?=
.PHONY: fuzz fuzz-build

$(FUZZ_DIR)/build.ninja:
	CC=clang-14 CXX=clang++-14 cmake -S . -B $(FUZZ_DIR) -G Ninja -DFERRY_FUZZ=ON \
	  -DFERRY_WITH_CUDA=OFF -DFERRY_WITH_PYTHON=OFF -DBUILD_TESTING=OFF

fuzz-build: deps $(FUZZ_DIR)/build.ninja
	cmake --build $(FUZZ_DIR) -j $(JOBS) --target fuzz_targets

fuzz: fuzz-build
	/usr/bin/python3 tests/fuzz/run.py --build-dir $(FUZZ_DIR) --seconds $(FUZZ_SECONDS) \
	  $(if $(FUZZ_JSON),--json $(FUZZ_JSON))

clean:
	rm -rf $(BUILD_DIR)
