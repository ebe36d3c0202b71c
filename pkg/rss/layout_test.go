package rss

import (
	"bytes"
	"testing"
)

// TestQEMULayout pins the map shapes of bpf/tun_steer.c to QEMU's
// tools/ebpf/rss.bpf.c (tap_rss_map_configurations, tap_rss_map_toeplitz_key,
// tap_rss_map_indirection_table): u32 keys, a packed 10-byte config, a
// 40-byte key, 128 u16 table entries, all mmapable, so QEMU's loader
// (ebpf_rss_set_all) can write lanekit's maps and the other way round.
func TestQEMULayout(t *testing.T) {
	spec, err := loadTunsteer()
	if err != nil {
		t.Fatal(err)
	}
	const mmapable = 1 << 10 // BPF_F_MMAPABLE
	for _, want := range []struct {
		name              string
		value, maxEntries uint32
	}{{MapConfig, 10, 1}, {MapKey, 40, 1}, {MapTable, 2, 128}} {
		m := spec.Maps[want.name]
		if m == nil {
			t.Fatalf("no map %s", want.name)
		}
		if m.KeySize != 4 || m.ValueSize != want.value || m.MaxEntries != want.maxEntries || m.Flags&mmapable == 0 {
			t.Errorf("%s: key %d value %d entries %d flags %#x, want 4/%d/%d mmapable",
				want.name, m.KeySize, m.ValueSize, m.MaxEntries, m.Flags, want.value, want.maxEntries)
		}
	}

	// The byte images QEMU writes: struct rss_config_t {u8 redirect;
	// u8 populate_hash; u32 hash_types; u16 indirections_len;
	// u16 default_queue} packed, and the key with its first word ntohl'ed.
	cfg := Config{Redirect: true, HashTypes: TypeTCPv4 | TypeIPv6, Table: make([]uint16, 64), DefaultQueue: 5}
	if got, want := cfg.qemuBytes(), []byte{1, 0, 0x0a, 0, 0, 0, 64, 0, 5, 0}; !bytes.Equal(got, want) {
		t.Errorf("config bytes % x, want % x", got, want)
	}
	kb := DefaultKey.qemuBytes()
	if want := []byte{0xda, 0x56, 0x5a, 0x6d, 0x25, 0x5b}; !bytes.Equal(kb[:6], want) {
		t.Errorf("key bytes % x..., want % x...", kb[:6], want)
	}
}
