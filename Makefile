# Spore: the two set-up commands are `make up` and `make test` (see README.md).
# Both work on a fresh Debian machine as root: they install what is missing.

DATA_DIR  ?= /var/lib/spore
CACHE_DIR ?= /var/cache/spore
GO        ?= go
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
REVISION  ?= $(shell r=$$(git rev-parse HEAD 2>/dev/null) && { git diff --quiet HEAD 2>/dev/null && echo $$r || echo $$r-dirty; } || echo unknown)
LDFLAGS   := -X main.version=$(VERSION) -X main.revision=$(REVISION)

export SPORE_DATA_DIR  := $(DATA_DIR)
export SPORE_CACHE_DIR := $(CACHE_DIR)

.PHONY: build setup test test-fast up bench bench-fleet bench-go readme-table clean proto sdk-deps console-assets fuzz fresh-check k8s-tools s3-tools

## build: compile the binaries into bin/
build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/spore ./cmd/spore
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o bin/spore-envd ./cmd/spore-envd

## setup: install the runtime (Debian packages, pinned gVisor runsc, base root filesystem); idempotent
setup: build
	bin/spore setup

## proto: regenerate the envd and node protocol code (committed)
proto:
	PATH="$(CACHE_DIR)/tools:$$PATH" proto/gen.sh

## k8s-tools: build the Kubernetes test tools (kube-apiserver, controller-manager, scheduler, etcd, kwok, helm) into CACHE_DIR/k8s, keyed by version; seconds when cached (docs/deploy.md)
k8s-tools:
	CACHE_DIR=$(CACHE_DIR) GO=$(GO) scripts/k8s-tools.sh

## s3-tools: build the S3-compatible server the blob store tests run against (versitygw) into CACHE_DIR/s3, keyed by version; instant when cached (docs/storage.md)
s3-tools:
	CACHE_DIR=$(CACHE_DIR) GO=$(GO) scripts/s3-tools.sh

## console-assets: copy the console's pinned npm code (internal/console/web: xterm.js) into its embedded assets (committed; docs/console.md)
console-assets:
	npm ci --prefix internal/console/web --cache $(CACHE_DIR)/npm --no-audit --no-fund
	cp internal/console/web/node_modules/@xterm/xterm/lib/xterm.mjs internal/console/web/node_modules/@xterm/xterm/css/xterm.css internal/console/assets/

## sdk-deps: the stock E2B SDKs from npm, for the acceptance tests (cached outside the checkout), Debian's chromium for the console's test, the console's pinned npm code (checked against its committed copy)
sdk-deps:
	npm ci --prefix internal/console/web --cache $(CACHE_DIR)/npm --no-audit --no-fund
	command -v chromium >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; }
	npm ci --prefix test/sdk --cache $(CACHE_DIR)/npm --no-audit --no-fund
	npm ci --prefix examples --cache $(CACHE_DIR)/npm --no-audit --no-fund

## test: vet and staticcheck (pinned in go.mod); the fast tier (-race, fake node, no runtime); the real tier (real runsc sandboxes, the stock E2B SDKs, the Helm chart in a real Kubernetes control plane: k8s-tools first; the S3 blob store against versitygw: s3-tools first); a short fuzz run (scripts/test.sh, docs/reliability.md "Test tiers")
test: setup sdk-deps k8s-tools s3-tools
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	GO=$(GO) scripts/test.sh
	$(MAKE) fuzz FUZZTIME=3000x

## test-fast: vet, staticcheck and the fast tier only (no runsc or root filesystem needed; runs as root, needs a C compiler for -race)
test-fast:
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	GO=$(GO) SPORE_TEST_TIERS=fast scripts/test.sh

FUZZTIME ?= 30s
FUZZ_TARGETS := FuzzValidate:./internal/ids FuzzCursor:./internal/store/sqlite FuzzCreateRequest:./internal/api \
	FuzzListQuery:./internal/api FuzzProxyRoute:./internal/api FuzzUpload:./internal/envd FuzzPlace:./internal/scheduler

## fuzz: each fuzz target for FUZZTIME (seed corpora under testdata/fuzz; make test uses a count, 3000x, since a time budget can end in a spurious "context deadline exceeded" on a busy host)
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		name=$${t%%:*}; pkg=$${t#*:}; \
		echo "fuzz $$name ($$pkg) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

## fresh-check: `make setup`, the build and the fast tests in a newly bootstrapped Debian root (FRESH_TIER=all: every test); proves setup installs all they use
fresh-check: setup
	scripts/fresh-root.sh

## up: set up, build, and start the all-in-one server
up: setup
	bin/spore up

BENCH_OUT ?= docs/benchmarks/$(shell date -u +%Y-%m-%d)

## bench: the whole `spore bench` suite on a private local server (report in BENCH_OUT: JSON, Markdown, plots)
bench: setup
	bin/spore bench --local --out $(BENCH_OUT)

## bench-fleet: each operation through an API replica and a remote node beside the same in one process, and create throughput with 1 and 3 nodes (scripts/bench-fleet.sh; reports and deltas in BENCH_OUT-fleet)
bench-fleet: setup
	scripts/bench-fleet.sh $(BENCH_OUT)-fleet

## bench-go: the Go benchmarks of the engine, node and API side by side with bare runsc
bench-go: setup
	$(GO) test -run '^$$' -bench . -benchtime 10x -timeout 30m ./internal/engine/ ./internal/node/ ./internal/api/

## readme-table: rewrite README.md's speed table from the reports docs/benchmarks/LATEST names (TestREADMESpeedTable checks it)
readme-table:
	$(GO) run ./cmd/spore bench readme

clean:
	rm -rf bin/
