# flexjit developer entry points. `make run` and `make test` work from a fresh clone:
# `deps` installs whatever Debian packages are missing first.
BUILD ?= build
SAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
JOBS ?= $(shell nproc)
CUDA_HOME ?= /usr/local/cuda
PKGS := cmake ninja-build g++ libfmt-dev nlohmann-json3-dev catch2 libcli11-dev libxxhash-dev libeigen3-dev llvm-19-dev libpng-dev pkgconf python3-dev python3-pip clang-19 libclang-rt-19-dev
PYTHON ?= python3

.PHONY: deps build run test test-release test-asan python test-python fuzz-build fuzz gpu clean

deps:
	@missing=$$(for p in $(PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "flexjit: installing missing packages:" $$missing; \
	  SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@test -f $(CUDA_HOME)/include/nvrtc.h || { \
	  echo "flexjit: the CUDA 13 toolkit was not found at $(CUDA_HOME) (needed for NVRTC); install it or run with CUDA_HOME=/path"; exit 1; }

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCUDA_HOME=$(CUDA_HOME)
	cmake --build $(BUILD) -j $(JOBS)

# The demo: checks, dumps and runs the gallery on the GPU when there is one, else on the CPU backend.
run: build
	./examples/demo.sh $(BUILD)

# Release build tests, then the same tests under AddressSanitizer + UBSan, then the Python
# package's. GPU tests skip themselves without a device.
test: test-release test-asan test-python

test-release: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	cmake -S . -B $(SAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFLEXJIT_SANITIZE=ON -DCUDA_HOME=$(CUDA_HOME)
	cmake --build $(SAN_BUILD) -j $(JOBS)
	cd $(SAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:suppressions=$(CURDIR)/tests/asan.supp \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -LE nvrtc

# The Python package (python/) into $(PYTHON)'s environment, linking the libraries `build` made.
python: build
	$(PYTHON) -m pip install ./python -Ccmake.define.FLEXJIT_PREBUILT=$(CURDIR)/$(BUILD)

# Its tests through numpy on the CPU backend (the torch and GPU tests skip themselves without them).
test-python: python
	$(PYTHON) -m pip install -q numpy pytest
	cd python/tests && $(PYTHON) -m pytest -q

# The libFuzzer targets (tests/fuzz/): every library instrumented, with ASan and UBSan, by clang.
fuzz-build: deps
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFLEXJIT_FUZZ=ON -DCMAKE_C_COMPILER=clang-19 \
	  -DCMAKE_CXX_COMPILER=clang++-19 -DCUDA_HOME=$(CUDA_HOME)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers

# Runs every fuzz target for FUZZ_SECONDS each (FUZZ_TARGETS="npy capi" picks some); fails on a finding.
fuzz: fuzz-build
	./tests/fuzz/run_fuzzers.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# On a GPU machine: build here, then tools/gpu_check.sh runs the GPU tests and benchmarks there.
gpu:
	./tools/gpu_check.sh

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(FUZZ_BUILD) python/build
