package datapath

import (
	"crypto/sha256"
	"encoding/hex"
)

// ObjectsDigest identifies the BPF programs this build carries (a digest of
// the embedded objects): an agent image stamped with another digest runs
// other programs than this binary would load.
func ObjectsDigest() string {
	h := sha256.New()
	for _, b := range [][]byte{_PodBytes, _UplinkBytes, _VmBytes, _SockBytes} {
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
