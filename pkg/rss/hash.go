package rss

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
)

// Hasher runs bpf/rss_hash.c (the Toeplitz code of bpf/lib/toeplitz.h) on
// frames through BPF_PROG_TEST_RUN. Loading needs CAP_BPF (root).
type Hasher struct {
	objs rsshashObjects
}

// NewHasher loads the hash program.
func NewHasher() (*Hasher, error) {
	h := &Hasher{}
	if err := loadRsshashObjects(&h.objs, nil); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("load rss hash program (needs root or CAP_BPF): %w", err)
		}
		return nil, fmt.Errorf("load rss hash program: %w", err)
	}
	return h, nil
}

// Close releases the program and maps.
func (h *Hasher) Close() error { return h.objs.Close() }

// Result is the outcome of hashing one frame.
type Result struct {
	Hash     uint32
	Report   Report // ReportNone: the frame got no hash
	InputLen int    // bytes hashed
}

// HashFrame runs the BPF program on an Ethernet frame with key and the
// enabled hash types.
func (h *Hasher) HashFrame(key Key, types HashTypes, frame []byte) (Result, error) {
	zero := uint32(0)
	if err := h.objs.LkHashKey.Put(zero, key.qemuBytes()); err != nil {
		return Result{}, fmt.Errorf("write rss key: %w", err)
	}
	if err := h.objs.LkHashArgs.Put(zero, rsshashLkRssHashArgs{HashTypes: uint32(types)}); err != nil {
		return Result{}, fmt.Errorf("write hash types: %w", err)
	}
	ret, err := h.objs.RssHash.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		return Result{}, fmt.Errorf("run rss hash program: %w", err)
	}
	var res rsshashLkRssHashResult
	if err := h.objs.LkHashResult.Lookup(zero, &res); err != nil {
		return Result{}, fmt.Errorf("read hash result: %w", err)
	}
	if ret == 0 {
		return Result{Report: ReportNone}, nil
	}
	return Result{Hash: res.Hash, Report: Report(res.Report), InputLen: int(res.InputLen)}, nil
}

// Hash computes the hash of flow f for one hash type (TypeIPv4 ... TypeUDPv6):
// it builds a matching frame (TCP for tcp types, UDP for udp types, an IP
// packet with no L4 header for the address-only types) and runs the program
// with only that type enabled.
func (h *Hasher) Hash(key Key, t HashTypes, f Flow) (Result, error) {
	var proto uint8
	v4 := true
	switch t {
	case TypeIPv4:
		proto = ProtoNone
	case TypeTCPv4:
		proto = ProtoTCP
	case TypeUDPv4:
		proto = ProtoUDP
	case TypeIPv6:
		proto, v4 = ProtoNone, false
	case TypeTCPv6:
		proto, v4 = ProtoTCP, false
	case TypeUDPv6:
		proto, v4 = ProtoUDP, false
	default:
		return Result{}, fmt.Errorf("hash: want exactly one hash type, got %q", t)
	}
	if f.Src.Is4() != v4 || f.Dst.Is4() != v4 {
		return Result{}, fmt.Errorf("hash type %s needs %s addresses, got %s and %s", t, map[bool]string{true: "IPv4", false: "IPv6"}[v4], f.Src, f.Dst)
	}
	frame, err := BuildFrame(f, proto)
	if err != nil {
		return Result{}, err
	}
	res, err := h.HashFrame(key, t, frame)
	if err != nil {
		return Result{}, err
	}
	if res.Report == ReportNone {
		return Result{}, fmt.Errorf("hash: the program computed no %s hash for %s -> %s", t, f.Src, f.Dst)
	}
	return res, nil
}
