# vramq: `make demo` runs the whole pipeline locally; `make test` runs every test.
# Both install what they need (the emulator and Node 22 from npm, staticcheck
# from the Go module proxy) into ignored folders of this checkout.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

GO          ?= go
BIN         := bin
TOOLS       := build/tools
STATICCHECK := $(TOOLS)/staticcheck
STATICCHECK_VERSION := v0.8.2
EMULATOR    := localstack/emulator.sh
# The harness (bench, soak, loadgen) is a Go module of its own, so that its
# dependencies (plotting, the progress bar) stay out of the product's go.mod.
# build, test, unit, vet and staticcheck run their go command once more in
# it (go -C).
HARNESS     := harness
# infra's Go tests (the Terraform's invariants, read with hcl) are a module of
# their own too, so that hcl and go-cty stay out of the product's go.mod.
INFRA_TESTS := infra
# go test's own timeout for one package, well inside CI's limit: model/modelserver's
# race run took 393 s on a quiet 2-core machine here (216 s on CI), and ran past
# 8 minutes when other work shared the cores.
TEST_TIMEOUT ?= 12m
# vet and staticcheck build with the flags the tests build with, so that make test
# compiles every dependency once: with vet and staticcheck on plain builds, a cold
# CI run compiled the whole dependency graph twice (about 100 s of its 2 cores).
CHECK_FLAGS := -race

.PHONY: build test unit lint fmt-check tidy-check vet staticcheck fuzz bench bench-micro demo emulator-up emulator-down emulator-status queues clean lambda infra-fmt infra-validate infra-validate-offline

## build: the binaries, the harness's (bench, soak, loadgen) too, into bin/
build:
	$(GO) build -o $(BIN)/ ./cmd/...
	$(GO) -C $(HARNESS) build -o $(CURDIR)/$(BIN)/ ./cmd/...

## lambda: the publisher as an AWS Lambda function (provided.al2023): bin/publisher-lambda.zip holding bootstrap
# LAMBDA_ARCH is the function's architecture: arm64 (Graviton) or amd64 (x86_64).
# lambda.norpc leaves out the RPC mode only the retired go1.x runtime used.
# The zip is written by Python's zipfile, which keeps bootstrap's executable
# bit, with zip(1) as the fallback where there is no python3.
LAMBDA_ARCH ?= arm64
lambda:
	rm -rf $(BIN)/lambda $(BIN)/publisher-lambda.zip
	GOOS=linux GOARCH=$(LAMBDA_ARCH) CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w' -o $(BIN)/lambda/bootstrap ./cmd/publisher
	if command -v python3 >/dev/null; then \
		python3 -m zipfile -c $(BIN)/publisher-lambda.zip $(BIN)/lambda/bootstrap; \
	else \
		cd $(BIN)/lambda && zip -q -X ../publisher-lambda.zip bootstrap; \
	fi
	@echo "$(BIN)/publisher-lambda.zip: bootstrap for linux/$(LAMBDA_ARCH)"

## images: container images $(IMAGE_PREFIX)/publisher, /subscriber and /subscriber-cuda, tagged $(VERSION) (needs Docker)
# IMAGE_PREFIX is the repository prefix (e.g. an ECR registry URI); extra
# docker build flags go in DOCKER_BUILD_FLAGS (e.g. --platform linux/arm64).
DOCKER             ?= docker
VERSION            ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE_PREFIX       ?= vramq
DOCKER_BUILD_FLAGS ?=
.PHONY: images
images:
	@if ! command -v $(DOCKER) >/dev/null; then \
		echo "make images: $(DOCKER) not found: install Docker (with BuildKit) to build the images" >&2; exit 1; \
	elif ! $(DOCKER) info >/dev/null 2>&1; then \
		echo "make images: the Docker daemon does not answer ($(DOCKER) info failed): start it and try again" >&2; exit 1; \
	fi
	$(DOCKER) build $(DOCKER_BUILD_FLAGS) -f Dockerfile.publisher -t $(IMAGE_PREFIX)/publisher:$(VERSION) .
	$(DOCKER) build $(DOCKER_BUILD_FLAGS) -f Dockerfile.subscriber -t $(IMAGE_PREFIX)/subscriber:$(VERSION) .
	$(DOCKER) build $(DOCKER_BUILD_FLAGS) -f Dockerfile.subscriber-cuda -t $(IMAGE_PREFIX)/subscriber-cuda:$(VERSION) .

## cuda: bin/subscriber-cuda, the subscriber with the CUDA backend (-tags cuda). It builds without the
## CUDA toolkit: the driver header and the driver API's names are generated into build/cuda
## (nothing NVIDIA is committed); the binary loads the NVIDIA driver and cuBLAS at run time (see docs/cuda.md).
CUDA_BUILD := build/cuda
CUDA_ENV   := CGO_ENABLED=1 CGO_CFLAGS="-I$(CURDIR)/$(CUDA_BUILD)/include" CGO_LDFLAGS="-L$(CURDIR)/$(CUDA_BUILD)/lib"
.PHONY: cuda cuda-stubs gpu-test-bin ptx cuda-check
cuda: cuda-stubs
	$(CUDA_ENV) $(GO) build -tags cuda -o $(BIN)/subscriber-cuda ./cmd/subscriber

cuda-stubs: $(CUDA_BUILD)/lib/libcuda.a
$(CUDA_BUILD)/lib/libcuda.a: gpu/cuda/cudabuild/gen.sh go.mod
	gpu/cuda/cudabuild/gen.sh $(CUDA_BUILD)

## gpu-test-bin: the cuda-tagged test binaries of model/refembed, model/bert, gpu/nvml and subscriber, into build/gpu-test/, to
## carry to a GPU machine (no Go needed there); bench/README.md says how to run them
gpu-test-bin: cuda-stubs
	mkdir -p build/gpu-test
	$(CUDA_ENV) $(GO) test -c -tags cuda -o build/gpu-test/refembed.test ./model/refembed/
	$(CUDA_ENV) $(GO) test -c -tags cuda -o build/gpu-test/bert.test ./model/bert/
	$(CUDA_ENV) $(GO) test -c -tags cuda -o build/gpu-test/nvml.test ./gpu/nvml/
	$(CUDA_ENV) $(GO) test -c -tags cuda -o build/gpu-test/subscriber.test ./subscriber/
	$(CUDA_ENV) $(GO) build -tags cuda -o build/gpu-test/subscriber-cuda ./cmd/subscriber
	$(GO) build -o build/gpu-test/genweights ./cmd/genweights
	cp bench/torch/embed.py bench/torch/bert.py build/gpu-test/
	rm -rf build/gpu-test/bert-models && cp -r model/bert/testdata/model build/gpu-test/bert-models
	rm -rf build/gpu-test/bert-tokenizer && cp -r model/wordpiece/testdata/tokenizer build/gpu-test/bert-tokenizer

## gpu-verify: build/gpu-verify/, everything a GPU machine with the driver, cuBLAS and PyTorch (but
## no Go) needs for the GPU verification: copy the folder there and run its run.sh with no arguments;
## it writes results.md (commit it as bench/gpu/<device>.md). bench/README.md "On a GPU" says more.
# Stripped (-s -w): the folder travels to the GPU machine, and debug info doubles its size.
GPU_VERIFY := build/gpu-verify
.PHONY: gpu-verify
gpu-verify: cuda-stubs
	rm -rf $(GPU_VERIFY) && mkdir -p $(GPU_VERIFY)
	$(CUDA_ENV) $(GO) test -c -tags cuda -ldflags='-s -w' -o $(GPU_VERIFY)/refembed.test ./model/refembed/
	$(CUDA_ENV) $(GO) test -c -tags cuda -ldflags='-s -w' -o $(GPU_VERIFY)/bert.test ./model/bert/
	$(CUDA_ENV) $(GO) test -c -tags cuda -ldflags='-s -w' -o $(GPU_VERIFY)/subscriber.test ./subscriber/
	cp bench/torch/embed.py bench/torch/bert.py gpu/verify/run.sh $(GPU_VERIFY)/
	# The model-server path against a real engine (gpu/verify/engine): pure Go, so no cuda stubs.
	CGO_ENABLED=0 $(GO) build -ldflags='-s -w' -o $(GPU_VERIFY)/engine ./gpu/verify/engine
	cp -r model/bert/testdata/model $(GPU_VERIFY)/bert-models
	cp -r model/wordpiece/testdata/tokenizer $(GPU_VERIFY)/bert-tokenizer
	git describe --always --dirty >$(GPU_VERIFY)/COMMIT 2>/dev/null || echo unknown >$(GPU_VERIFY)/COMMIT
	@du -sh $(GPU_VERIFY)
	# The folder (55 MiB at 7a43135) and the checkout together pass the 64 MiB a lent GPU machine takes: the
	# archive (15 MiB) travels instead; there, tar -xJf gpu-verify.tar.xz && gpu-verify/run.sh.
	tar -C build -cf - gpu-verify | xz -T0 -6 >build/gpu-verify.tar.xz

## cuda-check: vet the cuda-tagged code and link both cuda binaries, so the CUDA backend cannot rot
## on machines without a GPU (part of make test)
# vet type-checks the test files too; one link, of the binary, checks the cgo side
# (the test binaries link the same objects; make cuda-emu-test builds and runs them).
cuda-check: cuda-stubs $(STATICCHECK)
	$(CUDA_ENV) $(GO) vet $(CHECK_FLAGS) -tags cuda ./gpu/... ./model/... ./subscriber/ ./cmd/subscriber/
	$(CUDA_ENV) GOFLAGS=$(CHECK_FLAGS) $(STATICCHECK) -tags cuda ./gpu/... ./model/... ./subscriber/ ./cmd/subscriber/
	$(CUDA_ENV) $(GO) build $(CHECK_FLAGS) -tags cuda -o /dev/null ./cmd/subscriber

## ptx: regenerate model/refembed/kernels/embed.ptx and model/bert/kernels/bert.ptx from their .cu with clang-14 (commit both); installs clang-14
## from Debian's packages when it is missing and this is root
PTX_FLAGS := -x cuda --cuda-device-only --cuda-gpu-arch=sm_80 -nocudainc -nocudalib -Xclang -target-feature -Xclang +ptx70 -O3 -S
ptx:
	@if ! command -v clang-14 >/dev/null; then 		if [ "$$(id -u)" = 0 ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang-14; 		else echo "make ptx: clang-14 not found: apt-get install clang-14" >&2; exit 1; fi; 	fi
	clang-14 $(PTX_FLAGS) -o model/refembed/kernels/embed.ptx model/refembed/kernels/embed.cu
	clang-14 $(PTX_FLAGS) -o model/bert/kernels/bert.ptx model/bert/kernels/bert.cu

## weights: build/model.safetensors, the reference model's generated weights at the default config
## (seed 1), for the subscriber and bench/torch/embed.py; bin/genweights -h for other shapes
.PHONY: weights
weights:
	mkdir -p build
	$(GO) run ./cmd/genweights -out build/model.safetensors

## test: lint, then unit and end-to-end tests against the emulator (started and stopped here)
# cuda-emu-test runs beside the Go tests, not before them: those mostly wait on real time
# (subscriber and cmd/subscriber: 103 s of CPU in 163 s, about 0.6 of one core), and the emulated GPU's tests are CPU work.
# -parallel 4: the end-to-end tests marked parallel mostly wait (visibility timeouts,
# backoffs, slow models), so four at a time overlap their waits on two cores.
# VRAMQ_REQUIRE_JS_SDK: the JavaScript SDK's test fails, rather than skips, without its install.
# A package whose test binary dies of a fatal signal outside Go code (the race runtime's) runs once more;
# any other failure stands (internal/testenv/rerun-crashed.sh says why). The crash's head is printed last.
GO_TEST_FLAGS := -race -count=1 -timeout $(TEST_TIMEOUT)
RERUN_CRASHED := internal/testenv/rerun-crashed.sh
test: lint cuda-check js-sdk cuda-stubs
	@if command -v terraform >/dev/null; then terraform fmt -check -recursive infra; else echo "terraform fmt -check: skipped: no terraform"; fi
	@started=0; \
	if ! $(EMULATOR) status >/dev/null 2>&1; then $(EMULATOR) up; started=1; fi; \
	trap 'if [ $$started = 1 ]; then $(EMULATOR) down; fi' EXIT; \
	eval "$$($(EMULATOR) env)"; \
	export AWS_ENDPOINT_URL AWS_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY; \
	mkdir -p build; \
	echo "cuda-emu-test: started beside the tests below, its output in build/cuda-emu-test.log"; \
	$(MAKE) -s --no-print-directory cuda-emu-test >build/cuda-emu-test.log 2>&1 & emu=$$!; \
	rc=0; \
	export VRAMQ_REQUIRE_JS_SDK=1; \
	$(GO) test $(GO_TEST_FLAGS) -parallel 4 ./... 2>&1 | tee build/go-test.log \
		|| $(RERUN_CRASHED) build/go-test.log $(GO) test $(GO_TEST_FLAGS) -parallel 4 || rc=$$?; \
	$(GO) -C $(HARNESS) test $(GO_TEST_FLAGS) -parallel 4 ./... 2>&1 | tee build/go-test-harness.log \
		|| $(RERUN_CRASHED) build/go-test-harness.log $(GO) -C $(HARNESS) test $(GO_TEST_FLAGS) -parallel 4 || rc=$$?; \
	$(GO) -C $(INFRA_TESTS) test $(GO_TEST_FLAGS) ./... 2>&1 | tee build/go-test-infra.log \
		|| $(RERUN_CRASHED) build/go-test-infra.log $(GO) -C $(INFRA_TESTS) test $(GO_TEST_FLAGS) || rc=$$?; \
	if wait $$emu; then grep -E '^(ok|FAIL|---|cudaemu|cuda-bert)' build/cuda-emu-test.log || true; \
	else echo "cuda-emu-test FAILED:" >&2; cat build/cuda-emu-test.log >&2; rc=1; fi; \
	$(RERUN_CRASHED) crash-heads build/go-test.log build/go-test-harness.log build/go-test-infra.log; \
	exit $$rc

## js-sdk: the official OpenAI and Anthropic JavaScript SDKs and a Node 22 for the publisher's *JavaScriptSDK tests,
## pinned by publisher/testdata/jsclient/package-lock.json (part of make test; again only when the lock changes)
# npm rewrites node_modules/.package-lock.json on every install, so it stands for the install;
# --engine-strict=false: npm may run on an older Node than the SDK's, which runs on the bundled one.
JS_SDK := publisher/testdata/jsclient
.PHONY: js-sdk
js-sdk: $(JS_SDK)/node_modules/.package-lock.json
$(JS_SDK)/node_modules/.package-lock.json: $(JS_SDK)/package-lock.json $(JS_SDK)/package.json
	@command -v npm >/dev/null || { echo "make js-sdk: npm not found: install Node.js (any version npm runs on)" >&2; exit 1; }
	cd $(JS_SDK) && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error --engine-strict=false
	touch $@

## unit: the tests that need no emulator (the end-to-end ones skip)
unit:
	env -u AWS_ENDPOINT_URL -u AWS_ENDPOINT_URL_SQS $(GO) test -race ./...
	env -u AWS_ENDPOINT_URL -u AWS_ENDPOINT_URL_SQS $(GO) -C $(HARNESS) test -race ./...
	$(GO) -C $(INFRA_TESTS) test -race ./...

## fuzz: each fuzz target for FUZZTIME (default 5m), one after another; not part of make test.
# New inputs that find a failure land in the package's testdata/fuzz/<Name>/:
# commit them with the fix, and go test runs them as regression tests.
FUZZTIME ?= 5m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeWork$$' -fuzztime $(FUZZTIME) ./job/
	$(GO) test -run '^$$' -fuzz '^FuzzPayloadRef$$' -fuzztime $(FUZZTIME) ./job/
	$(GO) test -run '^$$' -fuzz '^FuzzParseBytes$$' -fuzztime $(FUZZTIME) ./internal/bytesize/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeJobRequest$$' -fuzztime $(FUZZTIME) ./publisher/jobs/
	$(GO) test -run '^$$' -fuzz '^FuzzReadSafetensors$$' -fuzztime $(FUZZTIME) ./model/refembed/
	$(GO) test -run '^$$' -fuzz '^FuzzRead$$' -fuzztime $(FUZZTIME) ./model/safetensors/
	$(GO) test -run '^$$' -fuzz '^FuzzEncode$$' -fuzztime $(FUZZTIME) ./model/wordpiece/

## bench: every admission strategy on one workload and simulated device against the offline bound,
## writing bench/results.md, results.json and the plots. The device costs as the demo's generated
## BERT (build/demo-bert, made here as make demo makes it), with budget and throughput scaled so that
## about two and a half large messages fit (bench/README.md). BENCH_MODEL=reference runs the
## reference model at bin/bench's defaults instead (the figures before 2026-11-24); BENCH_FLAGS adds
## flags (e.g. BENCH_FLAGS='-repeat 1 -out ""'); bin/bench strategies -h lists them.
# Not part of make test: it takes a few minutes and measures this machine.
BENCH_MODEL ?= bert
BENCH_FLAGS ?=
BENCH_BERT  := build/demo-bert
ifeq ($(BENCH_MODEL),bert)
BENCH_MODEL_FLAGS := -bert $(BENCH_BERT) -budget 200MiB -throughput 2GiB
else ifeq ($(BENCH_MODEL),reference)
BENCH_MODEL_FLAGS :=
else
BENCH_MODEL_FLAGS = $(error BENCH_MODEL must be bert or reference, not $(BENCH_MODEL))
endif
bench: build
	@if [ "$(BENCH_MODEL)" = bert ]; then $(BIN)/genweights -bert $(BENCH_BERT) >/dev/null; fi
	@started=0; \
	if ! $(EMULATOR) status >/dev/null 2>&1; then $(EMULATOR) up; started=1; fi; \
	trap 'if [ $$started = 1 ]; then $(EMULATOR) down; fi' EXIT; \
	eval "$$($(EMULATOR) env)"; \
	export AWS_ENDPOINT_URL AWS_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY; \
	$(BIN)/bench strategies $(BENCH_MODEL_FLAGS) $(BENCH_FLAGS)

## soak: bin/soak: 100,000 small messages through the fault proxy with random faults and subscriber
## restarts, every chunk accounted for; prints the figures and fails if any is lost. Not part of
## make test. It starts its own emulator unless AWS_ENDPOINT_URL is set; SOAK_FLAGS adds flags
## (e.g. SOAK_FLAGS='-messages=2000 -json'); bin/soak -h lists them.
SOAK_FLAGS ?=
.PHONY: soak
soak: build
	$(BIN)/soak $(SOAK_FLAGS)

## bench-micro: the hot-path micro-benchmarks (admission, keeper finish, work/result JSON, chunking),
## five runs each, into /tmp/bench.txt; figures and how to read them in bench/README.md
bench-micro:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 300ms -count 5 ./job/ ./subscriber/ ./publisher/ ./publisher/jobs/ ./publisher/batches/ | tee /tmp/bench.txt

## lint: gofmt, go vet, staticcheck and go mod tidy, of the product's module, the harness's and infra's tests'
lint: fmt-check vet staticcheck tidy-check

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go') 2>/dev/null || true); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# tidy-check fails where go mod tidy would change a module's go.mod or go.sum (it prints the
# diff): a module that tidy cannot settle (an ambiguous import) or a sum no build needs.
tidy-check:
	$(GO) mod tidy -diff
	$(GO) -C $(HARNESS) mod tidy -diff
	$(GO) -C $(INFRA_TESTS) mod tidy -diff

vet:
	$(GO) vet $(CHECK_FLAGS) ./...
	$(GO) -C $(HARNESS) vet $(CHECK_FLAGS) ./...
	$(GO) -C $(INFRA_TESTS) vet $(CHECK_FLAGS) ./...

staticcheck: $(STATICCHECK)
	GOFLAGS=$(CHECK_FLAGS) $(STATICCHECK) ./...
	cd $(HARNESS) && GOFLAGS=$(CHECK_FLAGS) $(CURDIR)/$(STATICCHECK) ./...
	cd $(INFRA_TESTS) && GOFLAGS=$(CHECK_FLAGS) $(CURDIR)/$(STATICCHECK) ./...

$(STATICCHECK):
	GOBIN=$(CURDIR)/$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

## deadcode: the product's unreachable functions (golang.org/x/tools/cmd/deadcode), listed and counted:
## those no main reaches, neither the services' in the default build nor in the cuda build (bin/subscriber-cuda)
## nor the harness's; test helpers (internal/testenv/, the *test packages, bench/timed) are not counted.
## Not part of make test (about a minute of two cores).
# One run covers the product's and the harness's mains through a go.work in build/ (the harness is a
# module of its own); a function is listed only when both builds leave it out.
DEADCODE         := $(TOOLS)/deadcode
DEADCODE_VERSION := v0.52.0
DEADCODE_DIR     := build/deadcode
DEADCODE_HELPERS := ^(internal/testenv/|bench/timed/|harness/|[^:]*test/[^/:]*\.go:)
.PHONY: deadcode
deadcode: $(DEADCODE) cuda-stubs
	mkdir -p $(DEADCODE_DIR) && rm -f $(DEADCODE_DIR)/go.work $(DEADCODE_DIR)/go.work.sum
	cd $(DEADCODE_DIR) && GOWORK= $(GO) work init $(CURDIR) $(CURDIR)/$(HARNESS)
	GOWORK=$(CURDIR)/$(DEADCODE_DIR)/go.work $(DEADCODE) -filter '^github.com/vramq/vramq/' ./... ./$(HARNESS)/... \
		| sort >$(DEADCODE_DIR)/default.txt
	GOWORK=$(CURDIR)/$(DEADCODE_DIR)/go.work $(CUDA_ENV) $(DEADCODE) -tags cuda -filter '^github.com/vramq/vramq/' ./... ./$(HARNESS)/... \
		| sort >$(DEADCODE_DIR)/cuda.txt
	@comm -12 $(DEADCODE_DIR)/default.txt $(DEADCODE_DIR)/cuda.txt | { grep -Ev '$(DEADCODE_HELPERS)' || true; } >$(DEADCODE_DIR)/product.txt
	@cat $(DEADCODE_DIR)/product.txt
	@echo "deadcode: $$(wc -l <$(DEADCODE_DIR)/product.txt) unreachable functions outside test helpers"

$(DEADCODE):
	GOBIN=$(CURDIR)/$(TOOLS) $(GO) install golang.org/x/tools/cmd/deadcode@$(DEADCODE_VERSION)

## demo: emulator, queues, subscriber on a simulated GPU, a mixed workload, a summary
demo: build
	localstack/demo.sh

## emulator-up / emulator-down / emulator-status: the local SQS emulator (fauxqs under Node 22)
emulator-up:
	$(EMULATOR) up

emulator-down:
	$(EMULATOR) down

emulator-status:
	$(EMULATOR) status

## infra-fmt: format the Terraform in infra/
infra-fmt:
	terraform fmt -recursive infra

## infra-validate: terraform validate of infra/examples/complete (and so of infra/) with the
## pinned 6.x AWS provider, downloaded from the Terraform registry: run it on a machine with
## network access.
infra-validate:
	terraform -chdir=infra/examples/complete init -backend=false -input=false
	terraform -chdir=infra/examples/complete validate

## infra-validate-offline: terraform validate and the provider schema check against the AWS
## provider in a local plugin mirror (/opt/tf-plugins, or VRAMQ_TF_PLUGIN_MIRROR), no network;
## part of make test, and skipped with the reason where there is no terraform or no mirror.
## The mirror's provider may be 5.x: infra/README.md says what that check cannot see.
infra-validate-offline:
	$(GO) -C $(INFRA_TESTS) test -count=1 -run '^(TestTerraformValidate|TestEveryAttributeIsInTheProviderSchema)$$' -v ./...

## queues: create the queues on the endpoint AWS_ENDPOINT_URL names and print their URLs
queues: build
	$(BIN)/queues

## clean: stop the emulator this checkout started, remove build outputs
clean:
	-$(EMULATOR) down
	rm -rf $(BIN) build .run

## golden-tokenizer: regenerate model/wordpiece/testdata/tokenizer/{texts,golden}.json with Hugging Face's
## tokenizers (transformers.js and the Rust library's Node binding, pinned by the generator's
## package-lock.json). Not part of make test, which compares against the committed files.
# --ignore-scripts: onnxruntime-node (a dependency of transformers.js) would download
# CUDA parts from the internet; the tokenizers need no ONNX Runtime.
TOKENIZER_GOLDEN := model/wordpiece/golden
.PHONY: golden-tokenizer
golden-tokenizer:
	cd $(TOKENIZER_GOLDEN) && npm ci --ignore-scripts --no-audit --no-fund
	cd $(TOKENIZER_GOLDEN) && node generate.mjs

# ---- CUDA on an emulated GPU (issue 16): internal/testenv/cudaemu/cudaemu.mk ----
include internal/testenv/cudaemu/cudaemu.mk
# make test runs cuda-emu-test beside its Go tests (the test recipe above).
# ---- end CUDA on an emulated GPU ----

## golden-onnx: regenerate model/bert's test models and their ONNX Runtime outputs
## (model/bert/testdata/model) with the generator in model/bert/golden/onnx. It installs
## onnxruntime-node (CPU, ~300 MB; --ignore-scripts: its install script fetches CUDA parts)
## and onnx-proto from npm; make test only reads the committed files.
BERT_GOLDEN := model/bert/golden/onnx
.PHONY: golden-onnx
golden-onnx:
	cd $(BERT_GOLDEN) && npm ci --ignore-scripts --no-audit --no-fund
	cd $(BERT_GOLDEN) && node gen.mjs ../../testdata/model

## golden: every golden file (tokenizer and model), from the independent implementations
.PHONY: golden
golden: golden-tokenizer golden-onnx

# ---- docs/configuration.md from the flag sets (issue 15) ----
## docs: regenerate the flag tables of docs/configuration.md from the binaries' flag sets; make test's
## TestConfigurationDoc (cmd/subscriber, cmd/publisher) fails when they differ
.PHONY: docs
docs:
	$(GO) test -count=1 -run '^TestConfigurationDoc$$' ./cmd/subscriber -args -update
	$(GO) test -count=1 -run '^TestConfigurationDoc$$' ./cmd/publisher -args -update
# ---- end docs/configuration.md ----
