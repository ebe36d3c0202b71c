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
// socket would break). A backend that does not ask gets no GSO fd.
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
			s := &Socket{FD: memfd("xsk", 1), UmemFD: memfd("umem", 2), GSOFD: -1, Config: QueueConfig{Queue: q}}
			if req.TxGSO {
				s.GSOFD, s.Config.GSO = memfd("gso", 3), true
			}
			socks = append(socks, s)
		}
		return socks, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, gso := range []bool{false, true} {
		offer, fds, err := FetchRequest(path, Request{Version: ProtocolVersion, VM: "vm1", TxGSO: gso}, 5*time.Second)
		if err != nil {
			t.Fatalf("gso %t: %v", gso, err)
		}
		var sizes []int64
		for _, fd := range fds {
			var st unix.Stat_t
			unix.Fstat(fd, &st)
			sizes = append(sizes, st.Size)
			unix.Close(fd)
		}
		want := []int64{1, 2, 1, 2}
		if gso {
			want = []int64{1, 2, 3, 1, 2, 3}
		}
		if len(sizes) != len(want) || offer.Queues[0].GSO != gso || offer.Queues[1].GSO != gso {
			t.Fatalf("gso %t: offer %+v, fds sized %v, want %v", gso, offer.Queues, sizes, want)
		}
		for i := range want {
			if sizes[i] != want[i] {
				t.Fatalf("gso %t: fds sized %v, want %v (per queue: xsk, umem, gso)", gso, sizes, want)
			}
		}
	}
}
