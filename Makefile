# lanekit: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/.cargo/bin
GO ?= go
CARGO ?= cargo
BIN := $(CURDIR)/bin
GO_CMDS := lanekitd lanekit-cni lanekit lanekit-kubevirt-sidecar

.PHONY: all deps demo-deps helm k8s-bins k8s-node-bins k8s-lab-bins test-real-nodes kubevirt-bins kubevirt-images k8s-node-images k8s-rival-images conformance generate check-generated build build-go build-vhost test test-preflight test-unprivileged test-go test-vhost demo bench clean lint lint-go lint-vhost docs FORCE

all: build

deps:
	./scripts/deps.sh
	@$(MAKE) --no-print-directory helm

# The Helm CLI for deploy/helm/lanekit (`bin/helm install lanekit
# deploy/helm/lanekit -n lanekit-system`), built from the Go module proxy at
# HELM_VERSION, the version go.mod's helm.sh/helm/v3 (the chart tests) pins;
# nothing to do when bin/helm already is that version.
HELM_VERSION := v3.22.0
helm:
	@if [ "$$($(BIN)/helm version --template '{{.Version}}' 2>/dev/null)" != "$(HELM_VERSION)" ]; then \
		echo "building bin/helm $(HELM_VERSION)"; mkdir -p $(BIN) && \
		GOBIN=$(BIN) nice $(GO) install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION)" \
			helm.sh/helm/v3/cmd/helm@$(HELM_VERSION); \
	fi

# etcd + kube-apiserver for the tests against a real API server, built once per
# machine into ~/.cache/lanekit/k8s (scripts/k8s-bins.sh; slow the first time).
k8s-bins:
	nice ./scripts/k8s-bins.sh

# The components of a real node (kubelet, containerd, runc, e2e.test, CoreDNS...)
# for `lanekit lab up --k8s --kubelet`; opt-in, tens of minutes the first time
# (scripts/k8s-node-bins.sh).
k8s-node-bins:
	./scripts/k8s-node-bins.sh

# Only what the real-node lab runs with lanekit (kubelet, kube-controller-manager,
# kube-scheduler, kubectl, containerd, runc, pause, agnhost, CoreDNS): no e2e.test,
# kube-proxy, flanneld or Cilium. About ten minutes the first time; CI builds it
# for make test-real-nodes. `make k8s-node-bins` adds the rest to the same cache.
k8s-lab-bins:
	./scripts/k8s-node-bins.sh lab

# The tests that need real nodes (kubelet + containerd from make k8s-lab-bins):
# TestLabRealNodes (the real-node lab, dual-stack: Helm and kustomize installs,
# pods, Services, hostPort, a dual-stack LoadBalancer pool, the machine left as
# found) and TestCtrImport (the image archives in a real containerd), required:
# they fail instead of skipping when something is missing. make test runs them
# too wherever the binaries are cached; CI, whose make test has none, runs this
# target after it.
REALNODE_RESULTS := $(CURDIR)/.testresults-realnodes
test-real-nodes: test-preflight build helm k8s-lab-bins $(TESTSUMMARY)
	@rm -rf $(REALNODE_RESULTS) && mkdir -p $(REALNODE_RESULTS)
	@rc=0; set -o pipefail; $(TEST_ENV) LANEKIT_K8S_NODE_REQUIRED=1 $(GO) test -json -count=1 -timeout 20m \
		-run '^(TestLabRealNodes|TestCtrImport)$$' ./pkg/lab ./internal/tools/lkimages 2>&1 | \
		$(TESTSUMMARY) go $(REALNODE_RESULTS)/go.json || rc=1; \
	$(TESTSUMMARY) report $(REALNODE_RESULTS) || rc=1; \
	exit $$rc

# The node image archives (pause, the agent, agnhost, CoreDNS) that
# `lanekit lab up --k8s --kubelet` imports into each node's containerd
# (internal/tools/lkimages; the agent image carries this tree's binaries),
# and BusyBox and regression-issue-74839 for make conformance (the latter left
# out, with a note, when only make k8s-lab-bins has run).
k8s-node-images: build
	nice $(GO) run ./internal/tools/lkimages -out $(BIN)/images

# Real KubeVirt (v1.9.0) and Multus for `lab up --k8s --kubelet --kubevirt`:
# opt-in, cached beside the node binaries (scripts/kubevirt-bins.sh; needs root
# once, for libvirt-dev from bookworm-backports).
kubevirt-bins:
	./scripts/kubevirt-bins.sh

# Their images, lanekit's binding sidecar's and lanekit's test guest as a
# kernel-boot image (internal/tools/lkimages): the virt-launcher image is
# Debian with libvirt 11.3 and QEMU 10.0 from bookworm-backports.
kubevirt-images: build
	./scripts/guest/build.sh >/dev/null
	nice $(GO) run ./internal/tools/lkimages -out $(BIN)/images virt-operator virt-api virt-controller \
		virt-exportproxy virt-handler virt-launcher multus kubevirt-sidecar lanekit-guest

# The rivals' images (kube-proxy, flannel, Cilium's agent and operator) for
# `lab up --kubelet --cni kube-proxy-iptables|kube-proxy-nftables|cilium`
# (their binaries: make k8s-node-bins).
k8s-rival-images:
	nice $(GO) run ./internal/tools/lkimages -out $(BIN)/images kube-proxy flannel cilium cilium-operator

# Kubernetes' own [sig-network] e2e tests (e2e.test + ginkgo from
# make k8s-node-bins) against `lanekit lab up --k8s --kubelet`: opt-in and
# long (hours for the whole focus; CONFORMANCE_FOCUS narrows it). Writes
# docs/conformance.json (ginkgo's JSON report) and docs/conformance.md; the
# skip list, each entry with its reason, is test/conformance/skip.txt.
conformance: k8s-node-images
	./scripts/conformance.sh

# BPF objects are compiled at build time by bpf2go (clang), never by the agent.
generate:
	$(GO) generate $$(git grep -l 'go:generate go tool bpf2go' -- '*.go' | xargs -n1 dirname | sort -u | sed 's|^|./|')

# CI: the committed bpf2go output of every package that generates BPF must be
# what the C sources compile to (regenerated in a scratch copy).
check-generated:
	./scripts/check-generated.sh

build: generate build-go build-vhost

build-go:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(GO_CMDS))
	@# A CNI type names an executable: type "lanekit" is bin/cni/lanekit.
	@mkdir -p $(BIN)/cni && ln -sf ../lanekit-cni $(BIN)/cni/lanekit

build-vhost:
	@if [ -f vhost/Cargo.toml ]; then \
		cd vhost && $(CARGO) build --release --locked -q && install -m 0755 target/release/lanekit-vhost $(BIN)/ && \
		$(CARGO) build --release --locked -q --example rss_guest --example paced_guest --example tso_guest --example rx_guest && \
		install -m 0755 target/release/examples/rss_guest $(BIN)/lanekit-rss-guest && \
		install -m 0755 target/release/examples/paced_guest $(BIN)/lanekit-paced-guest && \
		install -m 0755 target/release/examples/tso_guest $(BIN)/lanekit-tso-guest && \
		install -m 0755 target/release/examples/rx_guest $(BIN)/lanekit-rx-guest; \
	fi

# The whole suite: unit tests, BPF packet fixtures (BPF_PROG_TEST_RUN) and
# end-to-end tests in network namespaces. Needs root: as non-root it stops and
# says so, unless asked for the unprivileged subset (make test-unprivileged).
# Under root, what make deps provides must be there: a test missing a tool,
# bpffs or a built binary fails instead of skipping (LANEKIT_TEST_STRICT).
# Every suite runs even when one fails; the summary at the end lists passed,
# failed and skipped tests per suite and every skip with its reason.
RESULTS := $(CURDIR)/.testresults
TESTSUMMARY := $(BIN)/testsummary
TEST_ENV := LANEKIT_BIN=$(BIN) $(if $(LANEKIT_TEST_UNPRIVILEGED),,LANEKIT_TEST_STRICT=1)

test: test-preflight build helm $(TESTSUMMARY)
	@rm -rf $(RESULTS) && mkdir -p $(RESULTS)
	@rc=0; \
	$(MAKE) --no-print-directory test-go TESTSUMMARY_BUILT=1 || rc=1; \
	$(MAKE) --no-print-directory test-vhost TESTSUMMARY_BUILT=1 || rc=1; \
	$(TESTSUMMARY) report $(RESULTS) || rc=1; \
	exit $$rc

test-preflight:
	@if [ "$$(id -u)" != 0 ] && [ -z "$(LANEKIT_TEST_UNPRIVILEGED)" ]; then \
		echo "make test needs root (network namespaces, BPF, XDP, AF_XDP, QEMU and DPDK tests): run it as root," >&2; \
		echo "or run 'make test-unprivileged' for the unprivileged subset (most datapath and lab tests then skip)." >&2; \
		exit 1; \
	fi

test-unprivileged:
	@$(MAKE) --no-print-directory test LANEKIT_TEST_UNPRIVILEGED=1

$(TESTSUMMARY): FORCE
	@mkdir -p $(BIN) && $(GO) build -o $@ ./internal/tools/testsummary

FORCE:

# ./pkg/lab first: go test starts packages in the order given (-p of them at a
# time), and pkg/lab is one serial run of most of the suite's wall time (its
# tests share one lab lock), so it starts at once while the other packages share
# the second slot; listed last (as ./... sorts it) it started 6 minutes late.
# Then the other long packages, longest first, so that the short ones fill the
# end instead of one 2.5-minute package running alone after everything else
# (go test lists a package once however often it is named).
TEST_GO_FIRST := ./pkg/lab ./pkg/k8s ./pkg/datapath ./pkg/agent ./pkg/bench ./cmd/lanekit-cni ./pkg/guest ./cmd/lanekitd
test-go: $(if $(TESTSUMMARY_BUILT),,$(TESTSUMMARY))
	$(GO) vet ./...
	@mkdir -p $(RESULTS)
	set -o pipefail; $(TEST_ENV) $(GO) test -json -count=1 -timeout 30m $(TEST_GO_FIRST) ./... 2>&1 | $(TESTSUMMARY) go $(RESULTS)/go.json

# Rust backend. Root-only tests (AF_XDP in a netns, DPDK testpmd, a QEMU guest)
# are #[ignore]d: run one at a time as root, listed as skipped otherwise.
test-vhost: $(if $(TESTSUMMARY_BUILT),,$(TESTSUMMARY))
	@mkdir -p $(RESULTS)
	@if [ -f vhost/Cargo.toml ]; then \
		set -o pipefail; cd vhost && \
		$(CARGO) test --release --locked 2>&1 | $(TESTSUMMARY) cargo $(RESULTS)/vhost.cargo && \
		if [ "$$(id -u)" = 0 ]; then \
			$(CARGO) test --release --locked -- --ignored --test-threads=1 2>&1 | $(TESTSUMMARY) cargo $(RESULTS)/vhost-root.cargo; \
		else \
			echo "test-vhost: root-only tests not run (not root); the summary lists them as skipped"; \
		fi; \
	fi

# The generated tables of docs/configuration.md (lanekitd flags, ConfigMap
# keys, CNI config fields) from the code; TestConfigurationReferenceUpToDate
# (internal/tools/docgen) fails when they drift.
docs:
	$(GO) run ./internal/tools/docgen

# Static checks CI runs before the tests: formatting, vet, staticcheck, a tidy
# go.mod, BPF objects matching bpf/, and the Rust lints.
lint: lint-go check-generated lint-vhost

lint-go:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
		if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	@# The agent image builds the CLI without the lab and the bench.
	$(GO) vet -tags nolab ./cmd/...
	$(GO) tool staticcheck ./...
	$(GO) mod tidy -diff

lint-vhost:
	cd vhost && $(CARGO) fmt --check && $(CARGO) clippy --release --locked --all-targets -- -D warnings

# Lab up -> connectivity with the path proved -> one short side-by-side table
# (pods, services, the VM) -> lab down: the newcomer's coffee-break run. It needs
# no API server (LANEKIT_DEPS_K8S=0 skips building etcd + kube-apiserver) and
# no DPDK comparison; `make bench` is the long run.
demo: demo-deps build
	$(BIN)/lanekit lab down
	$(BIN)/lanekit lab up --nodes 2 --pods-per-node 2 --vm --vm-queues 2
	$(BIN)/lanekit lab check || { $(BIN)/lanekit lab down; exit 1; }
	$(BIN)/lanekit lab bench --repeat 3 --duration 3s --busy-cpus --services 10 --svc-repeat 1 --vm-backend off --chart bench.png; rc=$$?; $(BIN)/lanekit lab down; exit $$rc

demo-deps:
	LANEKIT_DEPS_K8S=0 ./scripts/deps.sh

# The whole benchmark (about an hour on two cores): pods, the VM, 0 and 1,000
# NetworkPolicies, services at 10 / 1,000 / 10,000 against kube-proxy, and the VM
# backend against DPDK testpmd. JSON in bench.json, chart in bench.png.
bench: build
	$(BIN)/lanekit lab down
	$(BIN)/lanekit lab up --nodes 2 --pods-per-node 2 --vm --vm-queues 2
	$(BIN)/lanekit lab bench --repeat 5 --busy-cpus --policies 0,1000 --services 10,1000,10000 --vm-backend on --json --chart bench.png > bench.json; rc=$$?; $(BIN)/lanekit lab down; exit $$rc

clean:
	rm -rf $(BIN) vhost/target
