package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path"
	"strings"
	"testing"
)

// TestFakeRegistryLayout: the pause image laid out for agnhost's
// fake-registry-server resolves the way that server and a puller walk it:
// tag file -> manifest by digest -> config and layer blobs by digest, each
// file's content hashing to its name.
func TestFakeRegistryLayout(t *testing.T) {
	in := fakeInputs(t)
	ps, err := specFor("pause", in)
	if err != nil {
		t.Fatal(err)
	}
	img, err := build(ps)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := registryEntries(img, "pause", "testing")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		files[e.Path] = e.Data
	}
	byDigest := func(kind, digest string) []byte {
		t.Helper()
		algo, h, ok := strings.Cut(digest, ":")
		if !ok || algo != "sha256" || len(h) != 64 {
			t.Fatalf("digest %q", digest)
		}
		p := path.Join("/var/registry/pause", kind, "sha256", h[:2], h, "data")
		data, ok := files[p]
		if !ok {
			t.Fatalf("%s missing", p)
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != h {
			t.Fatalf("%s: content hashes to %x", p, sum)
		}
		return data
	}
	tag, ok := files["/var/registry/pause/manifests/testing"]
	if !ok {
		t.Fatal("no tag file pause/manifests/testing")
	}
	var m struct {
		MediaType string `json:"mediaType"`
		Config    struct{ Digest string }
		Layers    []struct{ Digest string }
	}
	if err := json.Unmarshal(byDigest("manifests", strings.TrimSpace(string(tag))), &m); err != nil {
		t.Fatal(err)
	}
	if m.MediaType == "" || len(m.Layers) == 0 {
		t.Fatalf("manifest %+v: want a media type (the server sends it as Content-Type) and layers", m)
	}
	byDigest("blobs", m.Config.Digest)
	for _, l := range m.Layers {
		byDigest("blobs", l.Digest)
	}
	if _, err := registryEntries(img, "a/b", "testing"); err == nil {
		t.Error("a repository with a slash: no error")
	}
}
