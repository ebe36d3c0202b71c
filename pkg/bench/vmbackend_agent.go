package bench

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/xsk"
)

// benchAgent plays lanekitd for one VM in the comparison's namespace: the
// datapath loaded into a private pin directory, steer_vm attached to the VM
// device (native XDP), and the fd-passing server that opens one AF_XDP socket
// per queue (memfd UMEM, pkg/xsk), publishes it in lk_xsks and hands it to
// lanekit-vhost --xsk-socket. It mirrors pkg/agent's AddVM/serveVM for the
// parts the frames pass through; there is no store, IPAM or pod device.
type benchAgent struct {
	nsPath, pinDir, sock string
	loader               *datapath.Loader
	vm                   datapath.VM
	srv                  *xsk.Server
	attached             bool
	handovers            atomic.Int64 // socket sets handed to a backend
}

const (
	benchVMName = "vmbench"
	benchVMID   = 1 // endpoint id of the VM (its counters' key)
	// agentBusyWait bounds the EBUSY retries of a reconnecting backend's
	// queues (the kernel frees a closed socket's UMEM asynchronously).
	agentBusyWait = 3 * time.Second
)

// newBenchAgent loads the datapath into pinDir, attaches steer_vm to vmDev
// in the namespace at nsPath and serves sockets for benchVMName at sock.
func newBenchAgent(nsPath, vmDev, pinDir, sock string, mac net.HardwareAddr) (_ *benchAgent, err error) {
	a := &benchAgent{nsPath: nsPath, pinDir: pinDir, sock: sock}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// No uplink: nothing is attached outside the namespace.
	if a.loader, err = datapath.Open(datapath.Config{PinDir: pinDir}, quiet); err != nil {
		return nil, fmt.Errorf("bench agent: %w", err)
	}
	err = netdev.InNetns(nsPath, func() error {
		ifc, err := net.InterfaceByName(vmDev)
		if err != nil {
			return err
		}
		a.vm = datapath.VM{ID: benchVMID, IfIndex: ifc.Index, MAC: mac, Queues: 1}
		return a.loader.AttachVM(a.vm)
	})
	if err != nil {
		return nil, fmt.Errorf("bench agent: %w", err)
	}
	a.attached = true
	if a.srv, err = xsk.Listen(sock, benchVMName, a.provide, quiet); err != nil {
		return nil, fmt.Errorf("bench agent: %w", err)
	}
	return a, nil
}

// provide opens fresh sockets on the VM device's queues and publishes them
// in lk_xsks, as the agent's provider does for every backend connection.
func (a *benchAgent) provide(req xsk.Request) ([]*xsk.Socket, error) {
	var socks []*xsk.Socket
	err := netdev.InNetns(a.nsPath, func() error {
		var err error
		for deadline := time.Now().Add(agentBusyWait); ; time.Sleep(20 * time.Millisecond) {
			socks, err = xsk.OpenQueues(a.vm.IfIndex, a.vm.Queues, xsk.SizesFor(req))
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			return err
		}
		for q, s := range socks {
			if err := a.loader.SetVMSocket(a.vm, q, s.FD); err != nil {
				xsk.CloseAll(socks)
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bench agent sockets: %w", err)
	}
	a.handovers.Add(1)
	return socks, nil
}

// steerDrops returns the VM endpoint's steer_vm drops by reason.
func (a *benchAgent) steerDrops() (map[datapath.DropReason]uint64, error) {
	c, err := a.loader.Counters(a.vm.ID)
	if err != nil {
		return nil, fmt.Errorf("vm endpoint counters: %w", err)
	}
	return c.Drops, nil
}

// xdpProgram names the XDP program attached to dev in the namespace.
func (a *benchAgent) xdpProgram(dev string) (string, error) {
	var id uint32
	err := netdev.InNetns(a.nsPath, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		if x := l.Attrs().Xdp; x != nil && x.Attached {
			id = x.ProgId
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("xdp program of %s: %w", dev, err)
	}
	if id == 0 {
		return "", fmt.Errorf("xdp program of %s: none attached", dev)
	}
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return "", fmt.Errorf("xdp program %d of %s: %w", id, dev, err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return "", fmt.Errorf("xdp program %d of %s: %w", id, dev, err)
	}
	return info.Name, nil
}

// close stops the server, detaches steer_vm and removes every pin.
func (a *benchAgent) close() error {
	var errs []error
	if a.srv != nil {
		errs = append(errs, a.srv.Close())
	}
	if a.attached {
		errs = append(errs, netdev.InNetns(a.nsPath, func() error { return a.loader.DetachVM(a.vm) }))
	}
	if a.loader != nil {
		errs = append(errs, a.loader.Close())
	}
	if _, err := os.Stat(a.pinDir); err == nil {
		errs = append(errs, datapath.Unpin(a.pinDir), os.RemoveAll(a.pinDir))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench agent cleanup: %w", err)
	}
	return nil
}

// sendRaw sends n copies of frame on dev in the namespace (AF_PACKET).
func sendRaw(nsPath, dev string, frame []byte, n int) error {
	return netdev.InNetns(nsPath, func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: ifc.Index, Halen: 6}
		copy(sa.Addr[:], frame[:6])
		for i := 0; i < n; i++ {
			if err := unix.Sendto(fd, frame, 0, sa); err != nil {
				return fmt.Errorf("send on %s: %w", dev, err)
			}
		}
		return nil
	})
}

// probeFrame is a minimal Ethernet frame (IPv4 ethertype, zero payload) from
// src to dst.
func probeFrame(dst, src net.HardwareAddr) []byte {
	f := make([]byte, 60)
	copy(f[0:6], dst)
	copy(f[6:12], src)
	f[12], f[13] = 0x08, 0x00
	return f
}
