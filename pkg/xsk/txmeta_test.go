package xsk_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/xsk"
	"github.com/vishvananda/netlink"
)

// TestOpenWithTxMetadata: a backend that asks for TX metadata ("tx_meta")
// gets a UMEM registered with XDP_UMEM_TX_METADATA_LEN and tx_metadata_len
// 24 (this kernel has it: >= 6.8), and the offer says so; one that does not
// ask gets the old registration and an offer without the field.
func TestOpenWithTxMetadata(t *testing.T) {
	testutil.RequireRoot(t)
	h := newTestNS(t)
	for _, c := range []struct {
		req  xsk.Request
		want uint32
		dev  string
	}{{xsk.Request{Version: 1, VM: "v", TxMeta: true}, xsk.TxMetadataLen, "lk-tm0"}, {xsk.Request{Version: 1, VM: "v"}, 0, "lk-tm1"}} {
		var cfg xsk.QueueConfig
		must(t, "open", testutil.InNetns(h, func() error {
			attrs := netlink.LinkAttrs{Name: c.dev, NumTxQueues: 1, NumRxQueues: 1}
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: c.dev + "p"}); err != nil {
				return err
			}
			l, err := netlink.LinkByName(c.dev)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			s, err := xsk.Open(l.Attrs().Index, 0, xsk.SizesFor(c.req))
			if err != nil {
				return err
			}
			cfg = s.Config
			return s.Close()
		}))
		if cfg.TxMetadataLen != c.want {
			t.Errorf("tx_meta %t: UMEM tx_metadata_len %d, want %d", c.req.TxMeta, cfg.TxMetadataLen, c.want)
		}
		body, _ := json.Marshal(xsk.Offer{Version: 1, Queues: []xsk.QueueConfig{cfg}})
		if got := strings.Contains(string(body), `"tx_metadata_len":24`); got != (c.want != 0) {
			t.Errorf("tx_meta %t: offer %s", c.req.TxMeta, body)
		}
	}
}
