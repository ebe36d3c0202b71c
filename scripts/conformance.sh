#!/usr/bin/env bash
# `make conformance`: the upstream Kubernetes e2e tests (e2e.test from
# scripts/k8s-node-bins.sh, run by ginkgo) against the real-node lab
# (`lanekit lab up --k8s --kubelet`: kubelet + containerd per node, lanekit from
# deploy/, no kube-proxy). Writes docs/conformance.json (ginkgo's JSON report cut to the
# run's facts and the specs in focus; the full one stays in bin/)
# and docs/conformance.md (passed, failed, skipped; each failure with its cause).
#
#   CONFORMANCE_FOCUS   ginkgo --focus (default: '\[sig-network\]')
#   CONFORMANCE_SKIP    file of skip entries (default: test/conformance/skip.txt)
#   CONFORMANCE_PROCS   parallel ginkgo processes (default: 4); [Serial] specs run alone
#   CONFORMANCE_TIMEOUT ginkgo --timeout (default: 6h)
#   CONFORMANCE_DEADLINE a time (date -d syntax, e.g. 23:30) the run must end by:
#                       the timeout is what is left once the lab is up
#   CONFORMANCE_OUT     directory for the two reports (default: docs)
#   CONFORMANCE_LB_POOL  the lab's --lb-pool: lanekit's LB IPAM + L2 announcement serve the
#                       [Feature:LoadBalancer] tests (default 10.77.0.200-10.77.0.239 on the IPv4
#                       lab, plus fd00:77::c8-fd00:77::ef on the dual-stack one; set it empty for none)
#   CONFORMANCE_NODES   the lab's nodes (default 2)
#   CONFORMANCE_ZONES   the nodes' zones, round robin (lab up --zones; e.g. a,b,c with
#                       CONFORMANCE_NODES=3 for the Topology Hints and Traffic Distribution tests)
#   CONFORMANCE_CNI     the lab's --cni (default lanekit): a rival's network (cilium,
#                       kube-proxy-iptables, kube-proxy-nftables; `make k8s-rival-images`)
#                       run with lanekit's skip list as the reference for what lanekit
#                       should pass (plus LoadBalancer: no LB IPAM there; bin/skip-<cni>.txt);
#                       the reports are conformance-<cni>.{json,md}
#   CONFORMANCE_IP_FAMILY the lab's --ip-family: ipv4 (default) or dual (then the
#                       reports are conformance-dualstack.{json,md} and the skip
#                       list defaults to test/conformance/skip-dualstack.txt)
#
# Holds the lab lock (/tmp/lanekit-lab.lock) for the whole run and takes the lab
# down at the end, also on failure or interrupt.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PATH=$PATH:/usr/local/go/bin

[ "$(id -u)" = 0 ] || { echo "conformance: needs root (the lab's namespaces)" >&2; exit 1; }
nodebins=$(scripts/k8s-node-bins.sh dir)
for b in e2e.test ginkgo kubectl kubelet containerd regression-issue-74839; do
  [ -x "$nodebins/$b" ] || { echo "conformance: $nodebins/$b missing: run make k8s-node-bins" >&2; exit 1; }
done
[ -x bin/lanekit ] && [ -f bin/images/agent.tar ] || { echo "conformance: run make k8s-node-images first" >&2; exit 1; }
# The conntrack test's server: make k8s-node-images leaves its image out when
# only make k8s-lab-bins had run; without it that test fails after its timeout.
[ -f bin/images/regression.tar ] || { echo "conformance: bin/images/regression.tar missing: run make k8s-node-bins, then make k8s-node-images" >&2; exit 1; }

family=${CONFORMANCE_IP_FAMILY:-ipv4}
case $family in
  ipv4) name=conformance; defskip=test/conformance/skip.txt ;;
  dual) name=conformance-dualstack; defskip=test/conformance/skip-dualstack.txt ;;
  *) echo "conformance: CONFORMANCE_IP_FAMILY=$family: want ipv4 or dual" >&2; exit 1 ;;
esac
cni=${CONFORMANCE_CNI:-lanekit}
if [ "$cni" != lanekit ]; then
  [ "$family" = ipv4 ] || { echo "conformance: CONFORMANCE_CNI=$cni runs on the IPv4 lab only" >&2; exit 1; }
  name=conformance-$cni
fi
focus=${CONFORMANCE_FOCUS:-'\[sig-network\]'}
skipfile=${CONFORMANCE_SKIP:-$defskip}
if [ "$cni" != lanekit ]; then
  # lanekit's list, plus what only lanekit's lab provides: LoadBalancer
  # addresses (its LB IPAM on the lab's pool). Without one each of those
  # tests waits 15 minutes for an address and fails.
  mkdir -p bin
  { cat "$skipfile"
    echo 'LoadBalancer # the rival labs run no load-balancer IPAM (lanekit serves these tests from its own, lab up --lb-pool)'
  } >"bin/skip-$cni.txt"
  skipfile=bin/skip-$cni.txt
fi
procs=${CONFORMANCE_PROCS:-4}
timeout=${CONFORMANCE_TIMEOUT:-6h}
out=${CONFORMANCE_OUT:-docs}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# The skip entries, joined into one alternation.
skip=$(sed -e '/^\s*#/d' -e '/^\s*$/d' -e 's/ # .*$//' "$skipfile" | paste -sd '|')

exec 9>/tmp/lanekit-lab.lock
echo "conformance: waiting for the lab lock" >&2
flock 9
work=$(mktemp -d)
cleanup() {
  bin/lanekit lab down >&2 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bin/lanekit lab down >&2
start=$SECONDS
# LoadBalancer Services: lanekit's LB IPAM + L2 announcement with a pool on
# the underlay, which the runner reaches from outside the nodes' subnet.
# (pkg/lab LabLBPool, and LabLBPool6 beside it on the dual-stack lab).
lbpool=${CONFORMANCE_LB_POOL-10.77.0.200-10.77.0.239}
[ "$family" = ipv4 ] || lbpool=${CONFORMANCE_LB_POOL-10.77.0.200-10.77.0.239,fd00:77::c8-fd00:77::ef}
[ "$cni" = lanekit ] || lbpool=  # lanekit's LB IPAM; the rivals' labs have none
nodes=${CONFORMANCE_NODES:-2}
zones=${CONFORMANCE_ZONES:-}
bin/lanekit lab up --k8s --kubelet --cni "$cni" --nodes "$nodes" ${zones:+--zones "$zones"} --ip-family "$family" ${lbpool:+--lb-pool "$lbpool"} >&2
if [ -n "${CONFORMANCE_DEADLINE:-}" ]; then
  left=$(( $(date -d "$CONFORMANCE_DEADLINE" +%s) - $(date +%s) - 60 ))
  [ "$left" -gt 120 ] || { echo "conformance: deadline $CONFORMANCE_DEADLINE too close" >&2; exit 1; }
  timeout=${left}s
  echo "conformance: ginkgo --timeout=$timeout (deadline $CONFORMANCE_DEADLINE)" >&2
fi

# The runner lives on the underlay (lk-wire), beside the API server: it
# reaches the nodes and, through the underlay's routes, their pods.
rc=0
nsenter --net=/run/netns/lk-wire -- "$nodebins/ginkgo" run --procs="$procs" --timeout="$timeout" \
  --focus="$focus" --skip="$skip" --no-color --silence-skips \
  --json-report="$name.json" --output-dir="$work" \
  "$nodebins/e2e.test" -- \
  --kubeconfig=/run/lanekit/lab/k8s/kubeconfig --provider=skeleton --num-nodes="$nodes" \
  --kubectl-path="$nodebins/kubectl" --dns-domain=cluster.local --allowed-not-ready-nodes=0 --disable-log-dump \
  --report-dir="$work" >"$work/ginkgo.log" 2>&1 || rc=$?
echo "conformance: ginkgo exited $rc after $((SECONDS - start)) s (full log: bin/$name.log)" >&2
cp "$work/ginkgo.log" "bin/$name.log"
[ -f "$work/$name.json" ] || { echo "conformance: no JSON report; tail of the log:" >&2; tail -40 "$work/ginkgo.log" >&2; exit 1; }
# ginkgo's full report (~10 MB: every spec's output and events, and the
# 3,000 specs outside the focus) stays in bin/; docs/ gets the slim one.
cp "$work/$name.json" "bin/$name.full.json"
go run ./internal/tools/conformancereport -focus "$focus" -skip-file "$skipfile" -procs "$procs" \
  -raw "docs/$name.json" -ip-family "$family" -nodes "$nodes" -zones "$zones" -cni "$cni" \
  -slim "$out/$name.json" "$work/$name.json" >"$out/$name.md"
sed -n '1,/^## Failed/p' "$out/$name.md" >&2
exit $rc
