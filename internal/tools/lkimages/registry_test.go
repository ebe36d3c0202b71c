package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path"
	"slices"
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
	img, err := build(ps) // the node's sandbox image
	if err != nil {
		t.Fatal(err)
	}
	entries, err := registryPause(in)
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
	var cf struct{ Config struct{ Env []string } }
	if err := json.Unmarshal(byDigest("blobs", m.Config.Digest), &cf); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cf.Config.Env, "LANEKIT_IMAGE=fake-registry-pause") {
		t.Errorf("the registry's pause config: env %q", cf.Config.Env)
	}
	for _, l := range m.Layers {
		byDigest("blobs", l.Digest)
	}
	// An image of its own: neither its ID (the config digest) nor its
	// manifest digest is the sandbox image's.
	sandboxID, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	sandboxManifest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.Digest == sandboxID.String() || strings.TrimSpace(string(tag)) == sandboxManifest.String() {
		t.Errorf("the fake registry's pause:testing is the sandbox image (config %s, manifest %s): a node pulling it holds "+
			"registry.k8s.io/pause under a second name of the same image ID", m.Config.Digest, strings.TrimSpace(string(tag)))
	}
	if _, err := registryEntries(img, "a/b", "testing"); err == nil {
		t.Error("a repository with a slash: no error")
	}
}
