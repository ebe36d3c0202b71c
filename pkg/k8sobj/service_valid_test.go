package k8sobj

import "testing"

// TestServicesAccepted: what a real application's manifest holds applies
// whole — ExternalName and headless Services (nothing to program), traffic
// policies, external IPs, LoadBalancer ingress (IPs, hostnames, ipMode),
// loadBalancerSourceRanges and the health check port, validated as the API
// server does.
func TestServicesAccepted(t *testing.T) {
	for name, in := range map[string]string{
		"externalname":       svcHead + "spec: {type: ExternalName, externalName: db.example.com.}\n",
		"externalname ports": svcHead + "spec: {type: ExternalName, externalName: db.example.com, ports: [{port: 5432}]}\n",
		"headless":           svcHead + "spec: {clusterIP: None}\n",
		"headless ports":     svcHead + "spec: {clusterIP: None, ports: [{port: 80}]}\n",
		// What the API server makes of a headless Service without a selector.
		"headless dual stack":   svcHead + "spec: {clusterIP: None, clusterIPs: [None], ipFamilyPolicy: RequireDualStack, ipFamilies: [IPv4, IPv6]}\n",
		"etp local nodeport":    svcHead + "spec: {type: NodePort, clusterIP: 10.96.0.1, externalTrafficPolicy: Local, ports: [{port: 80, nodePort: 30000}]}\n",
		"etp local external ip": svcHead + "spec: {clusterIP: 10.96.0.1, externalTrafficPolicy: Local, externalIPs: [192.0.2.1], ports: [{port: 80}]}\n",
		"itp local":             svcHead + "spec: {clusterIP: 10.96.0.1, internalTrafficPolicy: Local, ports: [{port: 80}]}\n",
		"lb local health": svcHead + "spec: {type: LoadBalancer, clusterIP: 10.96.0.1, externalTrafficPolicy: Local, healthCheckNodePort: 31000, " +
			"sessionAffinity: ClientIP, ports: [{port: 80, nodePort: 30000}]}\n" +
			"status: {loadBalancer: {ingress: [{ip: 198.51.100.1}, {ip: 198.51.100.2, ipMode: Proxy}, {hostname: lb.example.com}]}}\n",
		// Source ranges of both families, white space padded (the API
		// allows it), host bits set; in the annotation; an empty annotation.
		"source ranges": svcHead + "spec: {type: LoadBalancer, clusterIP: 10.96.0.1, loadBalancerSourceRanges: [' 10.0.0.0/8', 192.0.2.7/24, '2001:db8::/32 '], ports: [{port: 80, nodePort: 30000}]}\n",
		"source range annotation": "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1, annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: '10.0.0.0/8, 2001:db8::/32'}}\n" +
			"spec: {type: LoadBalancer, clusterIP: 10.96.0.1, ports: [{port: 80, nodePort: 30000}]}\n",
		"single stack": svcHead + "spec: {clusterIP: 10.96.0.1, ipFamilyPolicy: PreferDualStack, ipFamilies: [IPv4], ports: [{port: 80}]}\n",
	} {
		if _, err := Decode([]byte(in)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
