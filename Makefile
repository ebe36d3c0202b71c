# lanekit: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/.cargo/bin
GO ?= go
CARGO ?= cargo
BIN := $(CURDIR)/bin
GO_CMDS := lanekitd lanekit-cni lanekit

.PHONY: all deps generate build build-go build-vhost test test-go test-vhost demo bench clean lint

all: build

deps:
	./scripts/deps.sh

# BPF objects are compiled at build time by bpf2go (clang), never by the agent.
generate:
	$(GO) generate ./pkg/datapath/...

build: generate build-go build-vhost

build-go:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(GO_CMDS))
	@# A CNI type names an executable: type "lanekit" is bin/cni/lanekit.
	@mkdir -p $(BIN)/cni && ln -sf ../lanekit-cni $(BIN)/cni/lanekit

build-vhost:
	@if [ -f vhost/Cargo.toml ]; then \
		cd vhost && $(CARGO) build --release --locked -q && install -m 0755 target/release/lanekit-vhost $(BIN)/; \
	fi

# The whole suite: unit tests (skip cleanly without root), BPF packet fixtures
# (BPF_PROG_TEST_RUN) and end-to-end tests in network namespaces.
test: build test-go test-vhost
	@echo "make test: all suites passed"

test-go:
	$(GO) vet ./...
	LANEKIT_BIN=$(BIN) $(GO) test -count=1 -timeout 15m ./...

test-vhost:
	@if [ -f vhost/Cargo.toml ]; then cd vhost && $(CARGO) test --release --locked; fi

# Lab up -> connectivity -> benchmark table -> lab down.
demo: deps build
	$(BIN)/lanekit lab down
	$(BIN)/lanekit lab up --nodes 2 --pods-per-node 2 --vm --vm-queues 2
	$(BIN)/lanekit lab check || { $(BIN)/lanekit lab down; exit 1; }
	$(BIN)/lanekit lab bench --repeat 5 --busy-cpus --chart bench.png; rc=$$?; $(BIN)/lanekit lab down; exit $$rc

bench: build
	$(BIN)/lanekit lab down
	$(BIN)/lanekit lab up --nodes 2 --pods-per-node 2
	$(BIN)/lanekit lab bench --repeat 5 --busy-cpus --json > bench.json; rc=$$?; $(BIN)/lanekit lab down; exit $$rc

clean:
	rm -rf $(BIN) vhost/target
