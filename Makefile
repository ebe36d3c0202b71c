# lanekit: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/.cargo/bin
GO ?= go
CARGO ?= cargo
BIN := $(CURDIR)/bin
GO_CMDS := lanekitd lanekit-cni lanekit lanekit-kubevirt-sidecar

.PHONY: all deps k8s-bins generate check-generated build build-go build-vhost test test-go test-vhost demo bench clean lint lint-go lint-vhost

all: build

deps:
	./scripts/deps.sh

# etcd + kube-apiserver for the tests against a real API server, built once per
# machine into ~/.cache/lanekit/k8s (scripts/k8s-bins.sh; slow the first time).
k8s-bins:
	nice ./scripts/k8s-bins.sh

# BPF objects are compiled at build time by bpf2go (clang), never by the agent.
generate:
	$(GO) generate ./pkg/datapath/... ./pkg/rss/...

# CI: the committed bpf2go output (objects and Go bindings, constants included)
# must be what the C sources compile to. Regenerates in a scratch copy.
check-generated:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	mkdir -p "$$tmp/pkg/datapath" && cp -r go.mod go.sum bpf "$$tmp/" && cp pkg/datapath/gen.go "$$tmp/pkg/datapath/" && \
	(cd "$$tmp" && $(GO) generate ./pkg/datapath/) && \
	stale=0 && for f in "$$tmp"/pkg/datapath/*_bpfel.*; do \
		cmp -s "$$f" "pkg/datapath/$$(basename "$$f")" || { echo "pkg/datapath/$$(basename "$$f") is stale"; stale=1; }; \
	done && \
	for f in pkg/datapath/*_bpfel.*; do [ -e "$$tmp/$$f" ] || { echo "$$f is not generated any more"; stale=1; }; done && \
	if [ $$stale = 1 ]; then echo "generated BPF files differ from bpf/: run make generate and commit"; exit 1; fi && \
	echo "generated BPF files are up to date"

build: generate build-go build-vhost

build-go:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(GO_CMDS))
	@# A CNI type names an executable: type "lanekit" is bin/cni/lanekit.
	@mkdir -p $(BIN)/cni && ln -sf ../lanekit-cni $(BIN)/cni/lanekit

build-vhost:
	@if [ -f vhost/Cargo.toml ]; then \
		cd vhost && $(CARGO) build --release --locked -q && install -m 0755 target/release/lanekit-vhost $(BIN)/ && \
		$(CARGO) build --release --locked -q --example rss_guest && \
		install -m 0755 target/release/examples/rss_guest $(BIN)/lanekit-rss-guest; \
	fi

# The whole suite: unit tests (skip cleanly without root), BPF packet fixtures
# (BPF_PROG_TEST_RUN) and end-to-end tests in network namespaces.
test: build test-go test-vhost
	@echo "make test: all suites passed"

test-go:
	$(GO) vet ./...
	LANEKIT_BIN=$(BIN) $(GO) test -count=1 -timeout 15m ./...

# Rust backend. Root-only tests (AF_XDP in a netns, DPDK testpmd, a QEMU guest) are
# #[ignore]d: run one at a time as root, listed as skipped otherwise.
test-vhost:
	@if [ -f vhost/Cargo.toml ]; then \
		cd vhost && $(CARGO) test --release --locked && \
		if [ "$$(id -u)" = 0 ]; then \
			$(CARGO) test --release --locked -- --ignored --test-threads=1; \
		else \
			echo "test-vhost: SKIPPED (need root; run make test-vhost as root):"; \
			$(CARGO) test --release --locked -q -- --ignored --list 2>/dev/null | sed -n 's/: test$$//p' | sed 's/^/  /'; \
		fi; \
	fi

# Static checks CI runs before the tests: formatting, vet, staticcheck, a tidy
# go.mod, BPF objects matching bpf/, and the Rust lints.
lint: lint-go check-generated lint-vhost

lint-go:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
		if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	$(GO) mod tidy -diff

lint-vhost:
	cd vhost && $(CARGO) fmt --check && $(CARGO) clippy --release --locked --all-targets -- -D warnings

# Lab up -> connectivity -> benchmark table -> lab down.
demo: deps build
	$(BIN)/lanekit lab down
	$(BIN)/lanekit lab up --nodes 2 --pods-per-node 2 --vm --vm-queues 2
	$(BIN)/lanekit lab check || { $(BIN)/lanekit lab down; exit 1; }
	$(BIN)/lanekit lab bench --repeat 5 --busy-cpus --services 10,1000 --svc-repeat 1 --chart bench.png; rc=$$?; $(BIN)/lanekit lab down; exit $$rc

bench: build
	$(BIN)/lanekit lab down
	$(BIN)/lanekit lab up --nodes 2 --pods-per-node 2
	$(BIN)/lanekit lab bench --repeat 5 --busy-cpus --policies 0,1000 --services 10,1000,10000 --json > bench.json; rc=$$?; $(BIN)/lanekit lab down; exit $$rc

clean:
	rm -rf $(BIN) vhost/target
