package datapath

import (
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/service"
)

// Malformed updates are refused before anything is written, with an error
// naming the entry (unprivileged: checkUpdate runs before any map access).
func TestApplyServicesRefusesBadUpdates(t *testing.T) {
	good := func() *service.Update {
		return &service.Update{
			Backends: map[service.BackendKey]service.BackendValue{{ID: 7}: {Addr: [4]byte{10, 0, 0, 1}, Port: 80, Proto: 6, FrontendID: 3}},
			Maglev:   map[uint32]service.MaglevIDs{3: service.MaglevIDsOf(sevens(service.MaglevFloor))},
			RevNat:   map[service.RevNatKey]service.RevNatValue{{FrontendID: 3}: {Addr: [4]byte{10, 96, 0, 1}, Port: 80}},
			Services: map[service.ServiceKey]service.ServiceValue{{Addr: [4]byte{10, 96, 0, 1}, Port: 80, Proto: 6}: {FrontendID: 3, MaglevSize: service.MaglevFloor}},
		}
	}
	if err := checkUpdate(good()); err != nil {
		t.Fatalf("good update refused: %v", err)
	}
	cases := []struct {
		name, want string
		mod        func(u *service.Update)
	}{
		{"frontend ID 0", "service 10.96.0.1:80/6 scope 0: frontend ID 0", func(u *service.Update) {
			u.Services[service.ServiceKey{Addr: [4]byte{10, 96, 0, 1}, Port: 80, Proto: 6}] = service.ServiceValue{MaglevSize: 3}
		}},
		{"size mismatch", "MaglevSize 5 but its Maglev table has 251 slots", func(u *service.Update) {
			u.Services[service.ServiceKey{Addr: [4]byte{10, 96, 0, 1}, Port: 80, Proto: 6}] = service.ServiceValue{FrontendID: 3, MaglevSize: 5}
		}},
		{"SCTP", "protocol 132 is not TCP or UDP", func(u *service.Update) {
			u.Services[service.ServiceKey{Addr: [4]byte{10, 96, 0, 2}, Port: 80, Proto: 132}] = service.ServiceValue{FrontendID: 4}
		}},
		{"backend 0 in a table", "maglev table of frontend 3: slot 1 holds backend ID 0", func(u *service.Update) { t := u.Maglev[3].Table(); t[1] = 0; u.Maglev[3] = service.MaglevIDsOf(t) }},
		{"table below the floor", "maglev table of frontend 6: 3 slots, fewer than", func(u *service.Update) { u.Maglev[6] = service.MaglevIDsOf([]uint32{7, 7, 7}) }},
		{"empty table", "maglev table of frontend 5: empty", func(u *service.Update) { u.Maglev[5] = service.MaglevIDsOf([]uint32{}) }},
		{"foreign backend", "maglev table of frontend 3: backend 7 belongs to frontend 9", func(u *service.Update) {
			u.Backends[service.BackendKey{ID: 7}] = service.BackendValue{FrontendID: 9}
		}},
		{"backend ID 0", "backend 0: ID or frontend ID 0", func(u *service.Update) {
			u.Backends[service.BackendKey{}] = service.BackendValue{FrontendID: 3}
		}},
	}
	for _, c := range cases {
		u := good()
		c.mod(u)
		err := checkUpdate(u)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
	}
}

func sevens(n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = 7
	}
	return t
}
