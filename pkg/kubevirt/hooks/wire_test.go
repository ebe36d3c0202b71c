package hooks

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/lanekit/lanekit/pkg/kubevirt/hooks/info"
	"github.com/lanekit/lanekit/pkg/kubevirt/hooks/v1alpha3"
)

// The wire format must be KubeVirt's: virt-launcher calls these full method
// names and reads these field numbers (kubevirt/kubevirt pkg/hooks protos).
func TestKubeVirtWireFormat(t *testing.T) {
	methods := map[string]string{
		info.Info_Info_FullMethodName:                     "/kubevirt.hooks.info.Info/Info",
		v1alpha3.Callbacks_OnDefineDomain_FullMethodName:  "/kubevirt.hooks.v1alpha3.Callbacks/OnDefineDomain",
		v1alpha3.Callbacks_PreCloudInitIso_FullMethodName: "/kubevirt.hooks.v1alpha3.Callbacks/PreCloudInitIso",
		v1alpha3.Callbacks_Shutdown_FullMethodName:        "/kubevirt.hooks.v1alpha3.Callbacks/Shutdown",
	}
	for got, want := range methods {
		if got != want {
			t.Errorf("method %q, want %q", got, want)
		}
	}

	str := func(b []byte, num protowire.Number, s string) []byte {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendString(b, s)
	}
	// InfoResult{name=1, hookPoints=3{name=1, priority=2}, versions=4}
	var hp []byte
	hp = str(hp, 1, "OnDefineDomain")
	hp = protowire.AppendTag(hp, 2, protowire.VarintType)
	hp = protowire.AppendVarint(hp, 5)
	var want []byte
	want = str(want, 1, "lanekit")
	want = protowire.AppendTag(want, 3, protowire.BytesType)
	want = protowire.AppendBytes(want, hp)
	want = str(want, 4, "v1alpha3")
	got, err := proto.Marshal(&info.InfoResult{Name: "lanekit", HookPoints: []*info.HookPoint{{Name: "OnDefineDomain", Priority: 5}}, Versions: []string{"v1alpha3"}})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("InfoResult wire %x, want %x", got, want)
	}

	// OnDefineDomainParams{domainXML=1, vmi=2}, OnDefineDomainResult{domainXML=1}
	want = str(str(nil, 1, "<domain/>"), 2, "{}")
	got, err = proto.Marshal(&v1alpha3.OnDefineDomainParams{DomainXML: []byte("<domain/>"), Vmi: []byte("{}")})
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("OnDefineDomainParams wire %x, want %x (%v)", got, want, err)
	}
	got, err = proto.Marshal(&v1alpha3.OnDefineDomainResult{DomainXML: []byte("<domain/>")})
	if err != nil || !bytes.Equal(got, str(nil, 1, "<domain/>")) {
		t.Errorf("OnDefineDomainResult wire %x (%v)", got, err)
	}
	// PreCloudInitIsoParams{cloudInitNoCloudSource=1, vmi=2, cloudInitData=3}
	want = str(str(str(nil, 1, "a"), 2, "b"), 3, "c")
	got, err = proto.Marshal(&v1alpha3.PreCloudInitIsoParams{CloudInitNoCloudSource: []byte("a"), Vmi: []byte("b"), CloudInitData: []byte("c")})
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("PreCloudInitIsoParams wire %x, want %x (%v)", got, want, err)
	}
}
