# Shoal — the two set-up commands are `make dev` and `make test`.
# Build settings come from build.env (shared with .ci/run and shells) so the
# Go build cache stays warm: a different CGO_CFLAGS or tag set recompiles SQLite.
SHELL := /bin/bash
export CGO_ENABLED := $(shell . ./build.env; echo "$$CGO_ENABLED")
export CGO_CFLAGS  := $(shell . ./build.env; echo "$$CGO_CFLAGS")
export GOFLAGS     := $(shell . ./build.env; echo "$$GOFLAGS")

BIN      := bin/shoal
DEV_ARGS ?=
# `shoal --version` prints these when the binary carries no VCS stamp from Go
# (build.env sets -buildvcs=false; a git worktree is never stamped).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# `make test` runs the component packages (all have concurrency) under the
# race detector, and the multi-process / end-to-end packages without it.
RACE_PKGS  ?= ./raftmeta/... ./objecthost/... ./edge/... ./internal/... ./d1client/... ./pipeline/... ./limiter/...
PLAIN_PKGS ?= ./cmd/... ./test/...

.PHONY: all build install dev test test-short bench fault compat compat-go lint deps clean

all: build

deps: ## install system packages the build and tests need (Debian)
	@./scripts/deps.sh

build: deps
	@mkdir -p bin
	go build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/shoal

install: deps ## build shoal with build.env and install it into $GOBIN, or $GOPATH/bin when GOBIN is unset (~/go/bin)
	go install -ldflags "$(LDFLAGS)" ./cmd/shoal
	@dir="$$(go env GOBIN)"; [ -n "$$dir" ] || dir="$$(go env GOPATH | cut -d: -f1)/bin"; echo "installed $$dir/shoal"

dev: build ## start the whole platform in one process on embedded defaults
	./$(BIN) dev $(DEV_ARGS)

test: deps lint ## every test, race detector on concurrent packages
	@missing="$$(comm -23 <(go list ./... | sort) <(go list $(RACE_PKGS) $(PLAIN_PKGS) | sort))"; \
	  if [ -n "$$missing" ]; then echo "packages in neither RACE_PKGS nor PLAIN_PKGS:"; echo "$$missing"; exit 1; fi
	go test -count=1 -race -timeout 20m $(RACE_PKGS)
	go test -count=1 -timeout 20m $(PLAIN_PKGS)

test-short: deps
	go test -count=1 -short ./...

# The cluster harnesses are in test/bench (each skips unless SHOAL_BENCH is
# set); ./... also runs the components' Go benchmarks and the figures that
# stay beside their tests in test/ (TestEdgePurgeFigure, TestD1ExportImportBench).
# TestCatalogScaleBench fills the catalog with SHOAL_BENCH_DATABASES
# databases; its own default, 1,000,000, takes ~30 min on 2 cores, so make
# bench uses 100,000 unless the variable is set.
bench: deps ## figures for docs/benchmarks.md (minutes; not part of make test)
	@SHOAL_DEPS_BENCH=1 ./scripts/deps.sh
	SHOAL_BENCH=1 SHOAL_BENCH_DATABASES=$${SHOAL_BENCH_DATABASES:-100000} go test -count=1 -timeout 60m -run 'Bench|Figure' -bench . -benchtime 3s ./...

compat: deps ## the D1 differential suite (miniflare) and the wrangler/SDK runs (make test runs them too), then the Go SDK run (only here)
	SHOAL_REQUIRE_NODE=1 go test -count=1 -timeout 20m -v ./test/compat/ ./test/wrangler/
	$(MAKE) compat-go

# The official Go SDK (cloudflare-go/v4 v4.6.0) against shoal dev. Its own
# module (test/gosdk/go.mod) keeps the SDK out of Shoal's go.mod, and the
# build tag keeps its build (minutes when cold) out of `make test`.
compat-go: deps
	cd test/gosdk && go vet -tags gosdk ./... && go test -tags gosdk -count=1 -timeout 10m -v ./...

fault: deps ## long fault schedules and 200 random ones over 2 processes (make test runs short versions; scripts/fault.sh)
	./scripts/fault.sh

lint:
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...

clean:
	rm -rf bin
