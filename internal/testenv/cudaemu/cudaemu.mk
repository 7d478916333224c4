# The CPU emulation of a GPU (internal/testenv/cudaemu): fake libcuda.so.1,
# libcublas.so.12/.13 and libnvidia-ml.so.1 built with the system g++ into
# build/cudaemu, never shipped. Included by the Makefile.

CUDAEMU     := build/cudaemu
CUDAEMU_SRC := internal/testenv/cudaemu
# Every .cu of the backend: the emulated driver holds all their kernels, and
# each module's PTX is checked against them.
CUDAEMU_CU  := model/refembed/kernels/embed.cu model/bert/kernels/bert.cu
CUDAEMU_PTX := $(CUDAEMU_CU:.cu=.ptx)
# The self-test's own kernels (warp operations, half-precision conversions):
# compiled into the driver, no PTX made from them.
CUDAEMU_TEST_CU := $(CUDAEMU_SRC)/warp.cu $(CUDAEMU_SRC)/cvt.cu
CUDAEMU_CXX := g++ -std=c++17 -O2 -g -fPIC -Wall -Wextra -Wno-unused-parameter -Wno-unused-function -Wno-attributes
CUDAEMU_LIBS := $(CUDAEMU)/libcuda.so.1 $(CUDAEMU)/libcublas.so.12 $(CUDAEMU)/libcublas.so.13 $(CUDAEMU)/libnvidia-ml.so.1

.PHONY: cudaemu cudaemu-selftest cuda-emu-test

## cudaemu: the emulated GPU's libraries, into build/cudaemu
cudaemu: $(CUDAEMU_LIBS)

# Every kernel of the .cu files, for the registry kernels.cc compiles.
$(CUDAEMU)/emu_kernels.inc: $(CUDAEMU_CU) $(CUDAEMU_TEST_CU) $(CUDAEMU_SRC)/cudaemu.mk
	mkdir -p $(CUDAEMU)
	for f in $(CUDAEMU_CU) $(CUDAEMU_TEST_CU); do grep -oE 'extern "C" GLOBAL void [A-Za-z_0-9]+' $$f | awk -v src=$$(basename $$f .cu) '{ print "EMU_KERNEL(" $$NF ", \"" src "\")" }'; done >$@.tmp
	mv $@.tmp $@

# kernels.cc includes one file: this one includes every .cu (each keeps its
# helpers apart, so they share a translation unit).
$(CUDAEMU)/kernels_all.cu: $(CUDAEMU_CU) $(CUDAEMU_TEST_CU) $(CUDAEMU_SRC)/cudaemu.mk
	mkdir -p $(CUDAEMU)
	for f in $(CUDAEMU_CU) $(CUDAEMU_TEST_CU); do echo "#include \"$(CURDIR)/$$f\""; done >$@

# Every other entry point of the driver API answers CUDA_ERROR_NOT_SUPPORTED:
# the names come from the link-time stub gen.sh writes, weak so that the
# implemented ones win.
$(CUDAEMU)/unsupported.c: $(CUDA_BUILD)/lib/libcuda.a
	mkdir -p $(CUDAEMU)
	sed -e 's/^int /__attribute__((weak)) int /' -e 's/return 999/return 801/' $(CUDA_BUILD)/lib/stub.c >$@

# cudaemu_driver builds a libcuda.so.1 into $(1) from the kernels of $(2).
define cudaemu_driver
	$(CUDAEMU_CXX) -fvisibility=hidden -I$(CUDAEMU) -I$(CUDAEMU_SRC) -DEMU_KERNELS_CU='"$(CURDIR)/$(2)"' -c -o $(1).kernels.o $(CUDAEMU_SRC)/kernels.cc
	$(CUDAEMU_CXX) -I$(CUDAEMU_SRC) -c -o $(1).cuda.o $(CUDAEMU_SRC)/cuda.cc
	gcc -O2 -fPIC -c -o $(1).unsupported.o $(CUDAEMU)/unsupported.c
	g++ -shared -Wl,-Bsymbolic-functions -Wl,-soname,libcuda.so.1 -o $(1) $(1).cuda.o $(1).kernels.o $(1).unsupported.o -lpthread
endef

$(CUDAEMU)/libcuda.so.1: $(CUDAEMU_SRC)/cuda.cc $(CUDAEMU_SRC)/kernels.cc $(CUDAEMU_SRC)/emu.h $(CUDAEMU)/emu_kernels.inc $(CUDAEMU)/kernels_all.cu $(CUDAEMU)/unsupported.c $(CUDAEMU_CU) $(CUDAEMU_TEST_CU)
	$(call cudaemu_driver,$@,$(CUDAEMU)/kernels_all.cu)

$(CUDAEMU)/libcublas.so.%: $(CUDAEMU_SRC)/cublas.cc $(CUDAEMU_SRC)/emu.h $(CUDAEMU)/libcuda.so.1
	$(CUDAEMU_CXX) -shared -DCUBLAS_MAJOR=$* -Wl,-soname,libcublas.so.$* -I$(CUDAEMU_SRC) -o $@ $< -L$(CUDAEMU) -l:libcuda.so.1

$(CUDAEMU)/libnvidia-ml.so.1: $(CUDAEMU_SRC)/nvml.cc $(CUDAEMU_SRC)/emu.h $(CUDAEMU)/libcuda.so.1
	$(CUDAEMU_CXX) -shared -Wl,-soname,libnvidia-ml.so.1 -I$(CUDAEMU_SRC) -o $@ $< -L$(CUDAEMU) -l:libcuda.so.1

$(CUDAEMU)/selftest: $(CUDAEMU_SRC)/selftest.cc $(CUDAEMU)/libcuda.so.1
	$(CUDAEMU_CXX) -I$(CUDAEMU_SRC) -o $@ $< -L$(CUDAEMU) -l:libcuda.so.1 -ldl

## cudaemu-selftest: the emulator against direct computations; then, for each
## __syncthreads of each .cu's kernels, a driver built without it must FAIL the self-test, as must
## each of cudaemu-warp-mutants
# The self-test's state file is its own, so it never shares a device with tests.
cudaemu-selftest: $(CUDAEMU_LIBS) $(CUDAEMU)/selftest
	VRAMQ_EMU_STATE=$(CURDIR)/$(CUDAEMU)/selftest.state LD_LIBRARY_PATH=$(CURDIR)/$(CUDAEMU) \
		$(CUDAEMU)/selftest $(CURDIR)/$(CUDAEMU)/libcublas.so.12 $(CUDAEMU_PTX)
	@for cu in $(CUDAEMU_CU); do \
	base=$$(basename $$cu .cu); n=$$(grep -c '__syncthreads()' $$cu); \
	for i in $$(seq 1 $$n); do \
		d=$(CUDAEMU)/mutant-$$base-$$i; mkdir -p $$d; \
		awk -v n=$$i '/__syncthreads\(\)/ { c++; if (c == n) { sub(/__syncthreads\(\);/, ""); } } { print }' $$cu >$$d/$$base.cu; \
		$(MAKE) -s --no-print-directory cudaemu-mutant-check MUTANT=$$d CU=$$cu WHAT="cudaemu-selftest: $$cu: __syncthreads $$i of $$n deleted" || exit 1; \
	done; done
	@$(MAKE) -s --no-print-directory cudaemu-warp-mutants

## cudaemu-warp-mutants: the driver built from bert.cu with a warp reduction broken (part of cudaemu-selftest);
## the self-test must FAIL on each
# half-warp: every shuffle names lanes 0-15 only (lanes 16-31 call it unnamed);
# no-first-step: warp_sum's butterfly skips the exchange across half-warps;
# down-max: warp_max shuffles down, so only lane 0 ends with the maximum;
# double-half: a double's upper half is not exchanged.
WARP_MUTANT_half-warp     := s|const unsigned full_warp = 0xffffffffu;|const unsigned full_warp = 0x0000ffffu;|
WARP_MUTANT_no-first-step := /DEVICE double warp_sum/,/^}/ s|int m = 16;|int m = 8;|
WARP_MUTANT_down-max      := /DEVICE float shfl_xor_f/,/^}/ s|__nvvm_shfl_sync_bfly_i32|__nvvm_shfl_sync_down_i32|
WARP_MUTANT_double-half   := s|unsigned hi = (unsigned)__nvvm_shfl_sync_bfly_i32(full_warp, (int)(unsigned)(b >> 32), m, 31);|unsigned hi = (unsigned)(b >> 32);|
WARP_MUTANTS := half-warp no-first-step down-max double-half
.PHONY: cudaemu-warp-mutants
cudaemu-warp-mutants: $(CUDAEMU_LIBS) $(CUDAEMU)/selftest
	@for name in $(WARP_MUTANTS); do \
		case $$name in \
		half-warp) expr='$(WARP_MUTANT_half-warp)';; no-first-step) expr='$(WARP_MUTANT_no-first-step)';; \
		down-max) expr='$(WARP_MUTANT_down-max)';; double-half) expr='$(WARP_MUTANT_double-half)';; \
		esac; \
		d=$(CUDAEMU)/mutant-warp-$$name; mkdir -p $$d; \
		sed "$$expr" model/bert/kernels/bert.cu >$$d/bert.cu; \
		if cmp -s model/bert/kernels/bert.cu $$d/bert.cu; then echo "cudaemu-warp-mutants: $$name: the edit matched nothing in bert.cu" >&2; exit 1; fi; \
		$(MAKE) -s --no-print-directory cudaemu-mutant-check MUTANT=$$d CU=model/bert/kernels/bert.cu WHAT="cudaemu-warp-mutants: $$name" || exit 1; \
	done

# cudaemu-mutant-check: the driver built with $(MUTANT)/ holding a mutated copy of $(CU) must FAIL the
# self-test (exit 1, a check failing); WHAT names the mutant in what it prints.
.PHONY: cudaemu-mutant-check
cudaemu-mutant-check:
	@for f in $(CUDAEMU_CU) $(CUDAEMU_TEST_CU); do \
		if [ $$f = $(CU) ]; then echo "#include \"$(CURDIR)/$(MUTANT)/$$(basename $(CU))\""; else echo "#include \"$(CURDIR)/$$f\""; fi; \
	done >$(MUTANT)/kernels_all.cu
	@$(MAKE) -s --no-print-directory cudaemu-mutant MUTANT=$(MUTANT)
	@VRAMQ_EMU_STATE=$(CURDIR)/$(MUTANT)/state LD_LIBRARY_PATH=$(CURDIR)/$(MUTANT) \
		$(CUDAEMU)/selftest $(CURDIR)/$(CUDAEMU)/libcublas.so.12 $(CUDAEMU_PTX) 2>$(MUTANT)/selftest.err && rc=0 || rc=$$?; \
	if [ $$rc != 1 ]; then \
		echo "$(WHAT): the self-test exited $$rc, want 1 (a check failing):" >&2; cat $(MUTANT)/selftest.err >&2; exit 1; \
	fi; \
	echo "$(WHAT): caught ($$(grep -v '^cudaemu: kernel emu_shfl' $(MUTANT)/selftest.err | grep -m1 -E '^(FAIL|cudaemu: kernel)'))"

.PHONY: cudaemu-mutant
cudaemu-mutant:
	$(call cudaemu_driver,$(MUTANT)/libcuda.so.1,$(MUTANT)/kernels_all.cu)

## cuda-emu-test: every cuda-tagged test (model/refembed, model/bert, subscriber, cmd/subscriber) on the emulated GPU,
## after the emulator's self-test (part of make test)
# The tests find the emulated libraries through LD_LIBRARY_PATH, as they would
# the driver's; the device's state file is this checkout's own, fresh each run.
# -p 1: the packages share the one emulated device, as they would a GPU, and
# model/refembed's CUDA out-of-memory test takes nearly all of it while subscriber's budget
# test measures what is free.
# The SQS emulator is started as make test starts it, for the end-to-end test of
# a lost device (cmd/subscriber).
# The tests that share the device with another process run a second time with a
# CUDA context of a real driver's size (300-500 MiB, not the emulator's default
# 256 MiB): one that assumed the emulator's context would fail only on a GPU.
# No -race here: the race detector's runtime (ThreadSanitizer) deadlocked under
# the emulator twice in about ten runs (a test binary stuck in
# __sanitizer::FutexWait until go test killed it): the emulator runs each CUDA
# thread as a fiber on a stack of its own, which the race runtime does not
# expect. The same packages' Go code runs under -race in make test's main run.
cuda-emu-test: cuda-stubs cudaemu-selftest cuda-bert-mutants
	rm -f $(CUDAEMU)/device.state
	@started=0; \
	if ! $(EMULATOR) status >/dev/null 2>&1; then $(EMULATOR) up; started=1; fi; \
	trap 'if [ $$started = 1 ]; then $(EMULATOR) down; fi' EXIT; \
	eval "$$($(EMULATOR) env)"; \
	export AWS_ENDPOINT_URL AWS_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY; \
	echo "go test -count=1 -p 1 -tags cuda -run CUDA ./model/refembed/ ./model/bert/ ./subscriber/ ./cmd/subscriber/ (on the emulated GPU)"; \
	$(CUDA_ENV) VRAMQ_EMU_STATE=$(CURDIR)/$(CUDAEMU)/device.state LD_LIBRARY_PATH=$(CURDIR)/$(CUDAEMU) \
		$(GO) test -count=1 -p 1 -tags cuda -run 'CUDA' ./model/refembed/ ./model/bert/ ./subscriber/ ./cmd/subscriber/; \
	rm -f $(CUDAEMU)/device.state; \
	echo "again the tests that share the device with another process, with a 450 MiB CUDA context (a real driver's size)"; \
	$(CUDA_ENV) VRAMQ_EMU_CONTEXT_BYTES=471859200 VRAMQ_EMU_STATE=$(CURDIR)/$(CUDAEMU)/device.state LD_LIBRARY_PATH=$(CURDIR)/$(CUDAEMU) \
		$(GO) test -count=1 -p 1 -tags cuda -run 'CUDA.*(ServesModelDir|FollowsFreeMemory)' ./subscriber/

## cuda-bert-mutants: the emulated driver built from bert.cu with GELU's tanh approximation for erf, and
## with the attention scores not scaled by 1/sqrt(d); the CUDA BERT test against ONNX Runtime must FAIL on
## each (part of cuda-emu-test)
# The PTX stays the committed one (the parameters are unchanged); the code the
# emulator runs is the mutated .cu's.
BERT_MUTANT_GELU  := s|v = v \* phi(v);|v = 0.5f * v * (1.0f + (1.0f - 2.0f / (exp_f(1.5957691216f * (v + 0.044715f * v * v * v)) + 1.0f)));|
BERT_MUTANT_SCALE := s|row\[j\] \* sc + |row[j] + |
.PHONY: cuda-bert-mutants
cuda-bert-mutants: cuda-stubs $(CUDAEMU_LIBS)
	$(CUDA_ENV) $(GO) test -c -tags cuda -o $(CURDIR)/$(CUDAEMU)/bert.test ./model/bert/
	@for name in gelu-tanh no-scale; do \
		case $$name in gelu-tanh) expr='$(BERT_MUTANT_GELU)';; no-scale) expr='$(BERT_MUTANT_SCALE)';; esac; \
		d=$(CUDAEMU)/mutant-bert-$$name; mkdir -p $$d; \
		sed "$$expr" model/bert/kernels/bert.cu >$$d/bert.cu; \
		if cmp -s model/bert/kernels/bert.cu $$d/bert.cu; then echo "cuda-bert-mutants: $$name: the edit matched nothing in bert.cu" >&2; exit 1; fi; \
		for f in $(CUDAEMU_CU) $(CUDAEMU_TEST_CU); do \
			case $$f in */bert.cu) echo "#include \"$(CURDIR)/$$d/bert.cu\"";; *) echo "#include \"$(CURDIR)/$$f\"";; esac; \
		done >$$d/kernels_all.cu; \
		$(MAKE) -s --no-print-directory cudaemu-mutant MUTANT=$$d; \
		(cd model/bert && VRAMQ_EMU_STATE=$(CURDIR)/$$d/state LD_LIBRARY_PATH=$(CURDIR)/$$d:$(CURDIR)/$(CUDAEMU) \
			$(CURDIR)/$(CUDAEMU)/bert.test -test.run 'TestCUDABertMatchesCPUAndONNX/tiny-f32' >$(CURDIR)/$$d/test.out 2>&1) && rc=0 || rc=$$?; \
		n=$$(grep -c 'differs from ONNX Runtime' $$d/test.out); \
		if [ $$rc = 0 ] || [ $$n = 0 ]; then \
			echo "cuda-bert-mutants: $$name: the test exited $$rc with $$n comparisons failing; want a failure:" >&2; cat $$d/test.out >&2; exit 1; \
		fi; \
		echo "cuda-bert-mutants: $$name: caught ($$n of 117 comparisons fail; $$(grep -m1 FIGURE $$d/test.out | sed 's/.*FIGURE //'))"; \
	done
