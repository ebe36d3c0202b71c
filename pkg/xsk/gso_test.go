package xsk

import (
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestOfferCarriesGSOSocketsOnlyWhenAsked: a queue with a GSO socket puts its
// fd right after its [xsk, umem] pair and says "gso":true; the fds arrive in
// that order (a backend taking the third fd of queue 0 for queue 1's AF_XDP
// socket would break). A backend that does not ask gets no GSO fd. The same
// for the wire -> guest socket ("rx_gso"), which comes after the GSO socket.
func TestOfferCarriesGSOSocketsOnlyWhenAsked(t *testing.T) {
	memfd := func(name string, size int64) int {
		fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		unix.Ftruncate(fd, size)
		return fd
	}
	path := filepath.Join(t.TempDir(), "vm1.sock")
	srv, err := Listen(path, "vm1", func(req Request) ([]*Socket, error) {
		var socks []*Socket
		for q := uint32(0); q < 2; q++ {
			s := &Socket{FD: memfd("xsk", 1), UmemFD: memfd("umem", 2), GSOFD: -1, RxGSOFD: -1, Config: QueueConfig{Queue: q}}
			if req.TxGSO {
				s.GSOFD, s.Config.GSO = memfd("gso", 3), true
			}
			if req.RxGSO {
				s.RxGSOFD, s.Config.RxGSO = memfd("rxgso", 4), true
			}
			socks = append(socks, s)
		}
		return socks, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, c := range []struct{ gso, rx bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		offer, fds, err := FetchRequest(path, Request{Version: ProtocolVersion, VM: "vm1", TxGSO: c.gso, RxGSO: c.rx}, 5*time.Second)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		var sizes []int64
		for _, fd := range fds {
			var st unix.Stat_t
			unix.Fstat(fd, &st)
			sizes = append(sizes, st.Size)
			unix.Close(fd)
		}
		var want []int64
		for q := 0; q < 2; q++ {
			want = append(want, 1, 2)
			if c.gso {
				want = append(want, 3)
			}
			if c.rx {
				want = append(want, 4)
			}
			if offer.Queues[q].GSO != c.gso || offer.Queues[q].RxGSO != c.rx {
				t.Fatalf("%+v: offer %+v", c, offer.Queues)
			}
		}
		if len(sizes) != len(want) {
			t.Fatalf("%+v: fds sized %v, want %v", c, sizes, want)
		}
		for i := range want {
			if sizes[i] != want[i] {
				t.Fatalf("%+v: fds sized %v, want %v (per queue: xsk, umem, gso, rx gso)", c, sizes, want)
			}
		}
	}
}
