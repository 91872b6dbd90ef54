# Deltafin build. `make` builds ./deltafin; `make test` builds and runs every test and ends with
# "N passed, N failed"; `make asan` runs the suite under AddressSanitizer + UBSan; `make tsan`
# under ThreadSanitizer; `make fuzz` builds the libFuzzer targets (clang); `make bench` builds
# the benchmarks. Works with gcc and clang (CC=clang make).
#
# Every file is compiled with -ffp-contract=off: a float expression rounds exactly as written
# and only explicit fmaf()/FMA intrinsics fuse, which the exactness contract (kern.h) relies on.

CC      ?= cc
V       ?= 0
Q       := $(if $(filter 1,$(V)),,@)
BUILD   ?= build
OPT     ?= -O2
SAN     ?=
CFLAGS  ?=
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
# gcc's -Wformat-truncation flags every bounded snprintf into a path buffer; truncation there is
# handled (and clang has no such warning), so it is off for gcc.
ifeq ($(shell $(CC) --version 2>/dev/null | grep -c clang),0)
WARN    += -Wno-format-truncation
endif
BASEFLAGS := -std=c11 -D_GNU_SOURCE -g $(OPT) $(WARN) -ffp-contract=off -fno-math-errno -fno-strict-aliasing -Isrc -pthread $(SAN)
LDLIBS  := -lcurl -ljansson -lpcre2-8 -luring -lxxhash -lcrypto -lmicrohttpd -lm -lpthread

ARCH := $(shell uname -m)
ifeq ($(ARCH),x86_64)
FLAGS_kern_avx2   := -mavx2 -mfma -mf16c
FLAGS_kern_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c
endif

LIB_SRC  := $(sort $(wildcard src/base/*.c src/kernels/*.c src/model/*.c src/engine/*.c src/engine/drafters/*.c src/backend/*.c src/hub/*.c src/store/*.c src/tokenizer/*.c src/server/*.c))
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/*.c))
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)

# The CUDA backend (src/backend/cuda): `make CUDA=1` adds it (nvcc, machine code for sm_90 and
# its PTX for later GPUs), `make test-cuda` runs the GPU tests on a machine with an NVIDIA GPU.
# The default build, `make test` and CI never need nvcc. nvcc's flags keep the CPU's arithmetic:
# no multiply-add fusion (-fmad=false, as -ffp-contract=off), IEEE division and square root,
# subnormals kept (kern.h's contract).
CUDA      ?= 0
NVCC      ?= nvcc
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
NVCCFLAGS := -std=c++17 -O3 -g -Isrc -fmad=false -prec-div=true -prec-sqrt=true -ftz=false \
             -Werror all-warnings -Xcompiler -Wall,-Wextra,-Wno-unused-parameter \
             -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
CU_SRC    := $(sort $(wildcard src/backend/cuda/*.cu))
CU_OBJ    := $(CU_SRC:%.cu=$(BUILD)/%.o) $(patsubst %.c,$(BUILD)/%.o,$(sort $(wildcard src/backend/cuda/*.c)))
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
FLAGS_test_cuda    := -I$(CUDA_HOME)/include -Itests
FLAGS_backend_cuda := -I$(CUDA_HOME)/include
BASE_OBJ  := $(LIB_OBJ)
ifeq ($(CUDA),1)
LIB_OBJ   += $(CU_OBJ)
LDLIBS    += $(CUDA_LIBS)
endif
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all deps test test-neon test-cuda cuda-compile asan tsan fuzz bench clean
all: deltafin

deltafin: $(BUILD)/deltafin
	cp $< $@.tmp && mv -f $@.tmp $@

# $(BUILD)/build-options records the options the binary was linked with, one VAR=value a line
# (`deltafin upgrade` rebuilds with exactly these); replaced atomically, and only when they change.
define BUILD_OPTIONS
CC=$(CC)
OPT=$(OPT)
CFLAGS=$(CFLAGS)
SAN=$(SAN)
BUILD=$(BUILD)
CUDA=$(CUDA)
endef

$(BUILD)/deltafin: $(LIB_OBJ) $(CLI_OBJ)
	$(Q)$(CC) $(BASEFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)
	$(file >$(BUILD)/build-options.tmp,$(BUILD_OPTIONS))
	$(Q)cmp -s $(BUILD)/build-options.tmp $(BUILD)/build-options && rm -f $(BUILD)/build-options.tmp \
	  || mv -f $(BUILD)/build-options.tmp $(BUILD)/build-options

# The test binary counts allocations (tests/test_alloc.c) by wrapping the allocator at link time.
TEST_WRAP := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=posix_memalign,--wrap=aligned_alloc
$(BUILD)/test_runner: $(LIB_OBJ) $(TEST_OBJ)
	$(Q)$(CC) $(BASEFLAGS) $(CFLAGS) $(TEST_WRAP) -o $@ $^ $(LDLIBS)

# Fuzz targets linked with a plain driver that replays a corpus (no clang needed).
$(BUILD)/fuzz/%: $(BUILD)/tests/fuzz/%.o $(BUILD)/tests/fuzz/replay.o $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(BASEFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRC))

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(BASEFLAGS) $(FLAGS_$(basename $(notdir $<))) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(Q)$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

# the chat page is assembled into srv_page.o (.incbin), which -MMD does not see
$(BUILD)/src/server/srv_page.o: src/server/page.html

# `make test` first makes sure the build dependencies are installed (setup.sh --deps-only is
# quick when they are), so it is the one command a fresh machine and CI need.
deps:
	@./setup.sh --deps-only

test: deps
	@$(MAKE) --no-print-directory $(BUILD)/test_runner $(BUILD)/deltafin $(FUZZ_BINS)
	@DELTAFIN_BIN=$(BUILD)/deltafin ./tests/run.sh $(BUILD)

asan:
	$(MAKE) BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" test

tsan:
	$(MAKE) BUILD=build-tsan OPT=-O1 SAN="-fsanitize=thread" test

# libFuzzer builds (clang): build-fuzz/fuzz_<name>; run e.g. build-fuzz/fuzz_safetensors tests/fuzz/corpus/safetensors
fuzz:
	$(MAKE) CC=clang BUILD=build-fuzz OPT=-O1 SAN="-fsanitize=fuzzer-no-link,address,undefined" $(LIB_OBJ:$(BUILD)/%=build-fuzz/%)
	@for f in $(FUZZ_SRC); do n=$$(basename $$f .c); \
	  echo "clang $$n"; clang $(filter-out -Wno-format-truncation,$(BASEFLAGS)) -fsanitize=fuzzer,address,undefined -o build-fuzz/$$n $$f $(LIB_SRC:%.c=build-fuzz/%.o) $(LDLIBS) || exit 1; done

bench: $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
$(BUILD)/bench/%: $(BUILD)/bench/%.o $(LIB_OBJ)
	$(Q)$(CC) $(BASEFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

# NEON kernels checked bit for bit against the scalar reference under qemu (needs Debian's
# gcc-aarch64-linux-gnu and qemu-user; tests/run.sh runs this when both are installed).
KERN_TEST_SRC := tests/test_main.c tests/test_kernels.c $(wildcard src/kernels/*.c) src/base/rng.c
test-neon:
	@mkdir -p $(BUILD)/aarch64
	$(Q)aarch64-linux-gnu-gcc -std=c11 -D_GNU_SOURCE -O2 $(WARN) -ffp-contract=off -Isrc -static -pthread \
	  -o $(BUILD)/aarch64/test_kernels $(KERN_TEST_SRC) -lm
	@qemu-aarch64 $(BUILD)/aarch64/test_kernels

# The GPU kernels against the scalar reference (tests/cuda/test_cuda.c, through test_kernels.c's
# checks); cuda-compile only builds it (tests/run.sh does that wherever nvcc is installed).
CUDA_TEST_OBJ := $(BUILD)/tests/test_main.o $(BUILD)/tests/test_kernels.o $(BUILD)/tests/test_util.o \
                 $(BUILD)/tests/test_alloc.o $(BUILD)/tests/cuda/test_cuda.o
$(BUILD)/cuda/test_cuda: $(CUDA_TEST_OBJ) $(BASE_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(BASEFLAGS) $(CFLAGS) $(TEST_WRAP) -o $@ $^ $(LDLIBS) $(if $(filter 1,$(CUDA)),,$(CUDA_LIBS))
$(BUILD)/cuda/bench_cuda: $(BUILD)/bench/cuda/bench_cuda.o $(BUILD)/src/backend/cuda/cuda_kern.o $(BUILD)/src/backend/cuda/cuda_mm.o $(BUILD)/src/kernels/dtype.o $(BUILD)/src/base/err.o
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(BASEFLAGS) $(CFLAGS) -o $@ $^ $(CUDA_LIBS) -lm -lpthread
cuda-compile: $(BUILD)/cuda/test_cuda $(BUILD)/cuda/bench_cuda
test-cuda: $(BUILD)/cuda/test_cuda
	@$(BUILD)/cuda/test_cuda

clean:
	rm -rf build build-asan build-tsan build-fuzz deltafin

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
