# gpukit — build, test, lint, demo, ci, gpu-bundle, bench.
# Every target works on a machine without a GPU; gpu-bundle builds what a GPU
# machine runs (static binaries and test binaries) without needing one.

SHELL       := bash
.SHELLFLAGS := -eu -o pipefail -c
MODULES     := libgpu gpupool kernelc trainer sampler optimizer tracer bench
TOOLS       := gpupool kernelc trainer sampler optimizer tracer
BIN         ?= bin
GO          ?= go
STATICCHECK_VERSION := v0.8.2
export CGO_ENABLED := 0

.PHONY: all build test test-short lint demo ci gpu-bundle bench tidy-check clean deps cuda-check

all: build

## build: static binaries of every tool into ./bin
build:
	@mkdir -p $(BIN)
	@for t in $(TOOLS); do (cd $$t && $(GO) build -trimpath -o ../$(BIN)/$$t .) || exit 1; done
	@echo "built $(TOOLS) into $(BIN)/"

## test: every package's tests (no GPU needed; GPU tests skip unless GPUKIT_REQUIRE_GPU=1)
test: deps build
	$(GO) test -count=1 -timeout 30m $(addprefix gpukit/,$(addsuffix /...,$(MODULES)))

## lint: gofmt, go vet and staticcheck over every module
lint:
	@out=$$(gofmt -l $(MODULES)); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(addprefix gpukit/,$(addsuffix /...,$(MODULES)))
	@command -v staticcheck >/dev/null || [ -x "$$($(GO) env GOPATH)/bin/staticcheck" ] || \
		$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck $(addprefix gpukit/,$(addsuffix /...,$(MODULES)))

## tidy-check: each module builds alone (GOWORK=off) and go.mod is tidy
tidy-check:
	@for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) mod tidy && GOWORK=off $(GO) build ./...) || exit 1; done
	@git diff --exit-code -- '*/go.mod' '*/go.sum' || { echo "go.mod/go.sum not tidy: run make tidy-check and commit"; exit 1; }

## deps: the Debian package with Fashion-MNIST, when missing
deps:
	@if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then \
		echo "installing dataset-fashion-mnist (apt-get)"; \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq dataset-fashion-mnist; \
	fi

## demo: train a Fashion-MNIST classifier through the pool (GPU when there is one, else CPU)
demo: deps build
	GPUKIT_BIN=$(CURDIR)/$(BIN) bash examples/pipelines/train-fashion.sh

## ci: what .ci/run runs — lint, module checks, the README's test command, a clean tree
ci: deps lint tidy-check
	$(MAKE) test
	@echo "pipeline (short mode): examples/pipelines/train-fashion.sh"
	EPOCHS=1 LIMIT=3000 OUT=$$(mktemp -d) GPUKIT_BIN=$(CURDIR)/$(BIN) bash examples/pipelines/train-fashion.sh >/dev/null
	@git status --porcelain | grep -v '^??' && { echo "tracked files changed during ci"; exit 1; } || true

## gpu-bundle: static tools and GPU test binaries in build/gpu/ for a GPU machine
gpu-bundle:
	bash scripts/gpu-bundle.sh

## cuda-check: compile every kernel to PTX with clang (no CUDA needed) to catch C++ errors early
cuda-check:
	bash scripts/cuda-check.sh

## bench: build the bundle; run build/gpu/bench.sh on a GPU machine
bench: gpu-bundle

clean:
	rm -rf $(BIN) build
