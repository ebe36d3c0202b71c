package dpu

import (
	"errors"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev"
)

func TestCheckIPsecOffload(t *testing.T) {
	no := netdev.Feature{Detail: "ESP with rfc4106(gcm(aes)): protocol not supported"}
	yes := netdev.Feature{Supported: true, Detail: "accepted"}
	if err := CheckIPsecOffload("off", no); err != nil {
		t.Errorf("off refused: %v", err)
	}
	if err := CheckIPsecOffload("on", no); !errors.Is(err, datapath.ErrNotSupported) || !strings.Contains(err.Error(), "protocol not supported") {
		t.Errorf("on without ESP: %v", err)
	}
	if err := CheckIPsecOffload("on", yes); err == nil || errors.Is(err, datapath.ErrNotSupported) {
		t.Errorf("on with ESP: %v, want refused as not implemented", err)
	}
	if err := CheckIPsecOffload("maybe", yes); err == nil {
		t.Error("a bad value was accepted")
	}
}
