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
# go test's own timeout, well inside CI's limit.
TEST_TIMEOUT ?= 8m

.PHONY: build test unit lint fmt-check vet staticcheck demo emulator-up emulator-down emulator-status queues clean lambda

## build: the binaries, into bin/
build:
	$(GO) build -o $(BIN)/ ./cmd/...

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

## test: lint, then unit and end-to-end tests against the emulator (started and stopped here)
test: lint
	@started=0; \
	if ! $(EMULATOR) status >/dev/null 2>&1; then $(EMULATOR) up; started=1; fi; \
	trap 'if [ $$started = 1 ]; then $(EMULATOR) down; fi' EXIT; \
	eval "$$($(EMULATOR) env)"; \
	export AWS_ENDPOINT_URL AWS_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY; \
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

## unit: the tests that need no emulator (the end-to-end ones skip)
unit:
	env -u AWS_ENDPOINT_URL -u AWS_ENDPOINT_URL_SQS $(GO) test -race ./...

## lint: gofmt, go vet and staticcheck
lint: fmt-check vet staticcheck

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go') 2>/dev/null || true); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck: $(STATICCHECK)
	$(STATICCHECK) ./...

$(STATICCHECK):
	GOBIN=$(CURDIR)/$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

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

## queues: create the queues on the endpoint AWS_ENDPOINT_URL names and print their URLs
queues: build
	$(BIN)/queues

## clean: stop the emulator this checkout started, remove build outputs
clean:
	-$(EMULATOR) down
	rm -rf $(BIN) build .run
