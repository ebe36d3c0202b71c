package k8sobj

import (
	"reflect"
	"strings"
	"testing"
)

// TestDecodeJSONRoundTrip: what EncodeJSON stores (the agent's store)
// decodes back equal, strict and validated like Decode: an unknown field,
// an invalid object or YAML is refused.
func TestDecodeJSONRoundTrip(t *testing.T) {
	objs, err := Decode(mustRead(t, "valid.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		js, err := EncodeJSON(o)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeJSON(js)
		if err != nil {
			t.Fatalf("%s: %v", o, err)
		}
		want, _ := Decode(js)
		if got.Key() != o.Key() || !reflect.DeepEqual(got, want[0]) {
			t.Errorf("%s: DecodeJSON %+v, want what Decode gives %+v", o, got, want[0])
		}
	}
	for _, bad := range []struct{ in, want string }{
		{`{"apiVersion":"v1","kind":"Service","metadata":{"name":"x"},"spec":{"portz":[]}}`, "unknown field"},
		{`{"apiVersion":"v1","kind":"Service","metadata":{"name":"x"},"spec":{"ports":[{"port":0}]}}`, "port"},
		{"apiVersion: v1\nkind: Service\nmetadata: {name: x}\n", "not an object"},
	} {
		if _, err := DecodeJSON([]byte(bad.in)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("DecodeJSON(%q) = %v, want an error with %q", bad.in, err, bad.want)
		}
	}
}
