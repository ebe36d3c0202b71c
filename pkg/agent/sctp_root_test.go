package agent

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

const ipProtoSCTP = 132

// TestSCTPPolicyIsolatesAgent: a NetworkPolicy whose only ingress rule
// allows SCTP/80, applied to the agent running the BPF datapath, isolates
// the pod it selects, checked with real traffic between two pods of the
// agent: before the policy TCP/80, UDP/80 and raw IP protocol 132 packets
// reach web; after it TCP/80 and UDP/80 are dropped by web's ingress policy
// (its DROP_POLICY_INGRESS counter grows), an IP protocol 132 packet to port
// 80 (an SCTP common header; this kernel has no SCTP sockets, any pod can
// send the packet raw) still arrives and one to port 81 is dropped. Before,
// the agent refused the object (web stayed open), and a compiler turning
// SCTP into TCP opened TCP/80.
func TestSCTPPolicyIsolatesAgent(t *testing.T) {
	fx := newFixture(t)
	a, dp := startBPFAgent(t, fx, "sctp", nil)

	add := func(what, app string) (ns.NetNS, uint32, netip.Addr) {
		n := netnstest.New(t, what)
		ep, err := a.Add(AddRequest{ContainerID: what, IfName: "eth0", Netns: n.Path(),
			Labels: map[string]string{ArgPodNamespace: "tel", ArgPodName: what, ArgLabelPrefix + "app": app}})
		if err != nil {
			t.Fatalf("add %s: %v", what, err)
		}
		return n, ep.ID, ep.IP
	}
	clientNS, _, _ := add("sctpcli", "client")
	webNS, webID, webIP := add("sctpweb", "web")

	// web listens on TCP/80 and UDP/80 and reads IP protocol 132 raw.
	var tcpLn net.Listener
	var udpLn net.PacketConn
	rawFD := -1
	if err := webNS.Do(func(ns.NetNS) error {
		var err error
		if tcpLn, err = net.Listen("tcp4", ":80"); err != nil {
			return err
		}
		if udpLn, err = net.ListenPacket("udp4", ":80"); err != nil {
			return err
		}
		rawFD, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW, ipProtoSCTP)
		return err
	}); err != nil {
		t.Fatalf("listen in web: %v", err)
	}
	t.Cleanup(func() { tcpLn.Close(); udpLn.Close(); unix.Close(rawFD) })
	tv := unix.NsecToTimeval((300 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(rawFD, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}

	inClient := func(f func() error) error {
		return clientNS.Do(func(ns.NetNS) error { return f() })
	}
	tcpReaches := func() bool {
		var c net.Conn
		err := inClient(func() (err error) {
			c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(webIP, 80).String(), time.Second)
			return err
		})
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	udpReaches := func() bool {
		if err := inClient(func() error {
			c, err := net.Dial("udp4", netip.AddrPortFrom(webIP, 80).String())
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("sctp test"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		udpLn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, _, err := udpLn.ReadFrom(make([]byte, 64))
		return err == nil
	}
	// sctpReaches sends an SCTP common header to web:dport as a raw IP
	// protocol 132 packet and says whether web's raw socket read it.
	sctpReaches := func(dport uint16) bool {
		hdr := make([]byte, 12+4)
		binary.BigEndian.PutUint16(hdr[0:], 40000)
		binary.BigEndian.PutUint16(hdr[2:], dport)
		binary.BigEndian.PutUint32(hdr[4:], 0x5c7a9001)
		if err := inClient(func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, ipProtoSCTP)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return unix.Sendto(fd, hdr, 0, &unix.SockaddrInet4{Addr: webIP.As4()})
		}); err != nil {
			t.Fatalf("send IP protocol 132: %v", err)
		}
		buf := make([]byte, 256)
		for {
			n, _, err := unix.Recvfrom(rawFD, buf, 0)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				return false
			}
			if err != nil {
				t.Fatalf("read IP protocol 132: %v", err)
			}
			if ihl := int(buf[0]&0x0f) * 4; n >= ihl+4 && binary.BigEndian.Uint16(buf[ihl+2:]) == dport {
				return true
			}
		}
	}
	policyDrops := func() uint64 {
		c, err := dp.Counters(webID)
		if err != nil {
			t.Fatal(err)
		}
		return c.Drops[datapath.DropPolicyIngress]
	}

	if !tcpReaches() || !udpReaches() || !sctpReaches(80) || !sctpReaches(81) {
		t.Fatal("without a policy, TCP/80, UDP/80 or IP protocol 132 does not reach web: the test cannot tell isolation from a broken path")
	}
	// As the API-server watcher hands it over (ReplaceObjects checks each
	// object and refuses what it cannot take).
	sctp := corev1.ProtocolSCTP
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tel", Name: "sctp-only"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
				{Protocol: &sctp, Port: ptr.To(intstr.FromInt32(80))}}}},
		},
	}
	if refused, err := a.ReplaceObjects(k8sobj.KindNetworkPolicy, []k8sobj.Object{{NetworkPolicy: np}}); err != nil || len(refused) != 0 {
		t.Fatalf("a NetworkPolicy allowing SCTP is refused (its pods would stay open): %v %v", refused, err)
	}
	for _, c := range []struct {
		what    string
		reaches func() bool
		want    bool
	}{
		{"TCP/80", tcpReaches, false},
		{"UDP/80", udpReaches, false},
		{"IP protocol 132 (SCTP) to port 80", func() bool { return sctpReaches(80) }, true},
		{"IP protocol 132 (SCTP) to port 81", func() bool { return sctpReaches(81) }, false},
	} {
		before := policyDrops()
		got := c.reaches()
		drops := policyDrops() - before
		switch {
		case got != c.want:
			t.Errorf("%s reaches web: %v, want %v (policy drops +%d)", c.what, got, c.want, drops)
		case !c.want && drops == 0:
			t.Errorf("%s did not reach web, but web's ingress policy drop counter did not grow", c.what)
		case c.want && drops != 0:
			t.Errorf("%s reached web, yet its ingress policy drop counter grew by %d", c.what, drops)
		}
	}
}
