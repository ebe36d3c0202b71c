package datapath

import "testing"

const ipProtoSCTP = 132

// polWebSCTP selects web with one ingress rule that allows SCTP only: the
// pods it selects must stay isolated (the upstream e2e "should properly
// isolate pods that are selected by a policy allowing SCTP, even if the
// plugin doesn't support SCTP"); before, the agent refused the object and
// web was open to everyone.
const polWebSCTP = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-sctp, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - ports:
    - {protocol: SCTP, port: 8080}
`

// TestPolicySCTPRuleIsolates compiles a NetworkPolicy whose only rule allows
// SCTP/8080 and judges packets through from_pod and from_uplink: TCP and UDP
// to 8080 are dropped by ingress policy (counted, charged to web, denied by
// that policy), and so is an IP protocol 132 packet: the datapath reads no
// SCTP ports, so an SCTP rule with a port admits no packet.
func TestPolicySCTPRuleIsolates(t *testing.T) {
	denied := func(name string, in func(e *fixtureEnv) []byte, remote bool) policyCase {
		c := policyCase{name: name, prog: fromPod, ifindex: ifH1, in: in, verdict: tcActShot,
			dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-sctp"}
		if remote {
			c.prog, c.ifindex = fromUplink, ifUp
		}
		return c
	}
	runPolicyScenarios(t, []policyScenario{{
		name: "a policy allowing only SCTP isolates its pods", policies: polWebSCTP,
		cases: []policyCase{
			denied("local client to web:8080/TCP: ingress denied", fromPodTo("10.244.1.11", ipProtoTCP, 8080), false),
			denied("local client to web:8080/UDP: ingress denied", fromPodTo("10.244.1.11", ipProtoUDP, 8080), false),
			denied("remote client to web:8080/TCP: ingress denied", fromWire("10.244.2.5", "10.244.1.11", ipProtoTCP, 8080), true),
			denied("local client to web, IP protocol 132: ingress denied", fromPodTo("10.244.1.11", ipProtoSCTP, 8080), false),
			{name: "the db VM (not selected) stays open", prog: fromUplink, ifindex: ifUp,
				in: fromWire("10.244.2.6", "10.244.1.12", ipProtoTCP, 5432), verdict: tcActRedirect},
		},
	}})
}
