# Shoal — the two set-up commands are `make dev` and `make test`.
# Build settings come from build.env (shared with .ci/run and shells) so the
# Go build cache stays warm: a different CGO_CFLAGS or tag set recompiles SQLite.
SHELL := /bin/bash
export CGO_ENABLED := $(shell . ./build.env; echo "$$CGO_ENABLED")
export CGO_CFLAGS  := $(shell . ./build.env; echo "$$CGO_CFLAGS")
export GOFLAGS     := $(shell . ./build.env; echo "$$GOFLAGS")

BIN      := bin/shoal
DEV_ARGS ?=
# Packages with concurrency run under the race detector in `make test`.
RACE_PKGS ?= ./raftmeta/... ./objecthost/... ./edge/... ./internal/...

.PHONY: all build dev test test-short bench fault lint deps clean

all: build

deps: ## install system packages the build and tests need (Debian)
	@./scripts/deps.sh

build: deps
	@mkdir -p bin
	go build -o $(BIN) ./cmd/shoal

dev: build ## start the whole platform in one process on embedded defaults
	./$(BIN) dev $(DEV_ARGS)

test: deps lint ## every test, race detector on concurrent packages
	go test -count=1 -timeout 20m ./...
	go test -count=1 -race -timeout 20m $(RACE_PKGS)

test-short: deps
	go test -count=1 -short ./...

bench: deps ## figures for docs/benchmarks.md (minutes; not part of make test)
	SHOAL_BENCH=1 go test -count=1 -timeout 60m -run 'Bench|Figure' -bench . -benchtime 3s ./...

fault: deps ## long fault schedules (make test runs their short versions)
	SHOAL_FAULT=long go test -count=1 -timeout 60m -run 'Fault' ./test/...

lint:
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...

clean:
	rm -rf bin
