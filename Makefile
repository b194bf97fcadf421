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
# BIN as an absolute path: the tools build in their module directories.
BINDIR_BUILD := $(abspath $(BIN))
# --version prints this (libgpu/cli); without it, "devel".
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS     := -X gpukit/libgpu/cli.version=$(VERSION)

# make install: where things go. DESTDIR stages (packaging); the units name
# $(BINDIR) and $(TMPFILESDIR) without it.
PREFIX      ?= /usr/local
DESTDIR     ?=
BINDIR      ?= $(PREFIX)/bin
UNITDIR     ?= $(PREFIX)/lib/systemd/system
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
UNITS       := gpupool.socket gpupool.service

.PHONY: all build install warm-cache docs-check systemd-check test test-short lint generate-check demo demo-gpt ci gpu-bundle bench tidy-check clean deps cuda-check

all: build

## build: static binaries of every tool into ./bin (BIN=DIR: elsewhere; a relative DIR is from here)
build:
	@mkdir -p $(BINDIR_BUILD)
	@for t in $(TOOLS); do (cd $$t && $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BINDIR_BUILD)/$$t .) || exit 1; done
	@echo "built $(TOOLS) into $(BINDIR_BUILD)/"

## install: the tools into $(DESTDIR)$(BINDIR), the systemd units (their paths filled in) into $(UNITDIR), gpukit.conf into $(TMPFILESDIR)
install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(TMPFILESDIR)
	install -m 0755 $(addprefix $(BINDIR_BUILD)/,$(TOOLS)) $(DESTDIR)$(BINDIR)/
	@for u in $(UNITS); do \
		sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@TMPFILESDIR@|$(TMPFILESDIR)|g' examples/systemd/$$u.in >$(DESTDIR)$(UNITDIR)/$$u && \
		chmod 0644 $(DESTDIR)$(UNITDIR)/$$u && echo "wrote $(DESTDIR)$(UNITDIR)/$$u" || exit 1; \
	done
	install -m 0644 examples/systemd/gpukit.conf $(DESTDIR)$(TMPFILESDIR)/gpukit.conf
	@echo "installed $(TOOLS) into $(DESTDIR)$(BINDIR)/; for the pool under systemd, as root:" \
		"groupadd --system gpukit && systemctl daemon-reload && systemctl enable --now gpupool.socket"
	@if [ -z "$(DESTDIR)" ]; then $(MAKE) --no-print-directory warm-cache; fi

## warm-cache: compile every kernel libgpu embeds for this machine's GPU into the kernel cache of the user running it ($$GPUKIT_CACHE_DIR, else ~/.cache/gpukit/kernels) with kernelc build --libgpu, so a first run loads instead of compiling; without a GPU it says so and does nothing (make install runs it unless DESTDIR stages)
warm-cache: build
	@if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then \
		echo "warm-cache: no NVIDIA GPU here (/dev/nvidia*); skipped: a first run compiles the kernels it needs"; \
	elif $(BINDIR_BUILD)/kernelc build --libgpu >/dev/null; then \
		echo "warm-cache: compiled libgpu's kernels for this GPU into the kernel cache"; \
	else echo "warm-cache: kernelc build --libgpu failed (above); a first run compiles the kernels it needs"; fi

## systemd-check: install into a temporary PREFIX and check the units with systemd-analyze verify, and that gpukit.conf gives the gpukit group the socket's directory (apt-get installs systemd when missing)
systemd-check:
	@if ! command -v systemd-analyze >/dev/null || ! command -v systemd-tmpfiles >/dev/null; then \
		echo "installing systemd for systemd-analyze (apt-get)"; \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends systemd; \
	fi
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(MAKE) --no-print-directory install PREFIX=$$tmp/prefix BIN=$$tmp/bin >/dev/null; \
	if grep -rn '@[A-Z]*@\|/usr/local/bin' $$tmp/prefix/lib/systemd/system; then echo "systemd-check: a path left unfilled"; exit 1; fi; \
	out=$$(cd $$tmp/prefix/lib/systemd/system && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify $(UNITS) 2>&1) && [ -z "$$out" ] || \
		{ echo "$$out"; echo "systemd-check: systemd-analyze verify $(UNITS) failed or warned"; exit 1; }; \
	echo "systemd-check: systemd-analyze verify $(UNITS): ok"; \
	if [ "$$(id -u)" = 0 ]; then \
		mkdir -p $$tmp/root/etc $$tmp/root/run; \
		printf 'root:x:0:0::/root:/bin/sh\n' >$$tmp/root/etc/passwd; \
		printf 'root:x:0:\ngpukit:x:4242:\n' >$$tmp/root/etc/group; \
		systemd-tmpfiles --create --root=$$tmp/root $$tmp/prefix/lib/tmpfiles.d/gpukit.conf; \
		got=$$(stat -c '%U:%g %a' $$tmp/root/run/gpukit); \
		[ "$$got" = "root:4242 750" ] || { echo "systemd-check: /run/gpukit is $$got, want root:gpukit(4242) 750"; exit 1; }; \
		echo "systemd-check: gpukit.conf makes /run/gpukit root:gpukit 0750: ok"; \
	else echo "systemd-check: not root; skipping the gpukit.conf check (it chowns)"; fi

## test: every package's tests (no GPU needed; GPU tests skip unless GPUKIT_REQUIRE_GPU=1)
test: deps build
	$(GO) test -count=1 -timeout 30m $(addprefix gpukit/,$(addsuffix /...,$(MODULES)))

## lint: gofmt, go vet and staticcheck over every module, and the generated kernel launchers current (generate-check)
lint: generate-check
	@out=$$(gofmt -l $(MODULES)); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(addprefix gpukit/,$(addsuffix /...,$(MODULES)))
	@command -v staticcheck >/dev/null || [ -x "$$($(GO) env GOPATH)/bin/staticcheck" ] || \
		$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck $(addprefix gpukit/,$(addsuffix /...,$(MODULES)))

## generate-check: libgpu/kernels/launch (the typed launchers) is what go generate writes from libgpu/kernels/*.cu
generate-check:
	cd libgpu/kernels/launch && $(GO) run gen.go -check

## tidy-check: each module builds alone (GOWORK=off) and go.mod is tidy
tidy-check:
	@for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) mod tidy && GOWORK=off $(GO) build ./...) || exit 1; done
	@git diff --exit-code -- '*/go.mod' '*/go.sum' || { echo "go.mod/go.sum not tidy: run make tidy-check and commit"; exit 1; }

## deps: the Debian packages the tests need, when missing: Fashion-MNIST; qqwing and faketime (Sudoku puzzles, libgpu/data/sudoku); jq (the README's examples use it)
deps:
	@pkgs=; \
	[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || pkgs="$$pkgs dataset-fashion-mnist"; \
	command -v qqwing >/dev/null || pkgs="$$pkgs qqwing"; \
	command -v faketime >/dev/null || pkgs="$$pkgs faketime"; \
	command -v jq >/dev/null || pkgs="$$pkgs jq"; \
	if [ -n "$$pkgs" ]; then \
		echo "installing$$pkgs (apt-get)"; \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$pkgs; \
	fi

## docs-check: run every shell example of README.md and TOOLS.md that can run on a CPU, as written (scripts/docs-check.sh lists what it skips and why)
docs-check: deps build
	GPUKIT_BIN=$(BINDIR_BUILD) bash scripts/docs-check.sh

## demo: train a Fashion-MNIST classifier through the pool (GPU when there is one, else CPU)
demo: deps build
	GPUKIT_BIN=$(BINDIR_BUILD) bash examples/pipelines/train-fashion.sh

## demo-gpt: train a small character-level GPT on Newton's Opticks (GPU when there is one, else CPU) and generate from it
demo-gpt: build
	GPUKIT_BIN=$(BINDIR_BUILD) bash examples/pipelines/gpt-opticks.sh

## ci: what .ci/run runs — lint, module checks, the systemd units, the README's test command, a clean tree
ci: deps lint tidy-check systemd-check
	$(MAKE) test
	@echo "race detector: ipc, pool, gpupool, trace, tracer, the optimizer service (the race runtime needs cgo)"
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 30m gpukit/libgpu/ipc/... gpukit/libgpu/pool/... gpukit/gpupool/... gpukit/libgpu/trace/... gpukit/tracer/... gpukit/libgpu/optim/service/... gpukit/optimizer/...
	@echo "fuzz smoke: every fuzz target for a few seconds (scripts/fuzz-smoke.sh)"
	GO=$(GO) bash scripts/fuzz-smoke.sh
	@echo "pipeline (short mode): examples/pipelines/train-fashion.sh"
	EPOCHS=1 LIMIT=3000 OUT=$$(mktemp -d) GPUKIT_BIN=$(BINDIR_BUILD) bash examples/pipelines/train-fashion.sh >/dev/null
	@echo "pipeline (short mode): examples/pipelines/gpt-opticks.sh"
	STEPS=30 TOKENS=60 OUT=$$(mktemp -d)/gpt GPUKIT_BIN=$(BINDIR_BUILD) bash examples/pipelines/gpt-opticks.sh >/dev/null
	@echo "docs: every shell example of README.md and TOOLS.md that runs on a CPU (scripts/docs-check.sh)"
	GPUKIT_BIN=$(BINDIR_BUILD) bash scripts/docs-check.sh
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
