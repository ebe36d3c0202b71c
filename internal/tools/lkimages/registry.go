package main

import (
	"fmt"
	"io"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// fakeRegistryDir is where agnhost's fake-registry-server serves images from
// (test/images/agnhost/fakeregistryserver: registryDir).
const fakeRegistryDir = "/var/registry"

// digestPath is fake-registry-server's digestToPath: sha256/<2 hex>/<hex>/data.
func digestPath(base string, d v1.Hash) string {
	return path.Join(base, d.Algorithm, d.Hex[:2], d.Hex, "data")
}

// registryPause is the fake registry of the agnhost image: pause served as
// pause:testing, as upstream's image does, built here from this pause with
// a configuration of its own (an environment variable): an image of its
// own ID. A node that pulls it (the LocalhostNodePorts test) must not hold
// it as a second name of its sandbox image registry.k8s.io/pause: two names
// of one image ID share its fate in containerd's CRI image store, and the
// node once lost its pause image in the middle of a conformance run, with
// kubelet then trying registry.k8s.io on the internet (ImagePullBackOff).
func registryPause(in inputs) ([]entry, error) {
	ps, err := specFor("pause", in)
	if err != nil {
		return nil, err
	}
	ps.Env = append(ps.Env, "LANEKIT_IMAGE=fake-registry-pause")
	img, err := build(ps)
	if err != nil {
		return nil, err
	}
	return registryEntries(img, "pause", "testing")
}

// registryEntries lay img out the way upstream's prepare_registry.sh lays
// out the images of agnhost's fake registry (images.txt: pause 3.10.2 as
// "testing"): a tag file holding the manifest's digest, the manifest by
// digest, the config and layer blobs by digest. The LocalhostNodePorts
// e2e test pulls <registry>/pause:testing through a localhost NodePort.
func registryEntries(img v1.Image, repo, tag string) ([]entry, error) {
	if strings.Contains(repo, "/") || strings.Contains(tag, "/") {
		return nil, fmt.Errorf("registry entry %s:%s: one path element each", repo, tag)
	}
	base := path.Join(fakeRegistryDir, repo)
	manifest, err := img.RawManifest()
	if err != nil {
		return nil, err
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	configName, err := img.ConfigName()
	if err != nil {
		return nil, err
	}
	out := []entry{
		content(path.Join(base, "manifests", tag), []byte(digest.String()+"\n"), 0o644),
		content(digestPath(path.Join(base, "manifests"), digest), manifest, 0o644),
		content(digestPath(path.Join(base, "blobs"), configName), config, 0o644),
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, err
		}
		rc, err := l.Compressed()
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, content(digestPath(path.Join(base, "blobs"), d), data, 0o644))
	}
	return out, nil
}
