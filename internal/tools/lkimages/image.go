package main

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is every timestamp the tool writes (files and the image's created
// time), so the same inputs give the same image digest.
var epoch = time.Unix(0, 0).UTC()

// entry is one path in a layer: a regular file copied from Src, a directory
// (Src and Link empty, Mode has fs.ModeDir) or a symlink to Link.
type entry struct {
	Path string // inside the image, absolute
	Src  string // host file (regular files)
	Data []byte // the content instead of Src (regular files made here)
	Link string // symlink target
	Mode fs.FileMode
	// Caps are file capabilities (permitted and effective), written as
	// the security.capability extended attribute (PAX SCHILY.xattr.*),
	// which containerd applies when it unpacks the layer.
	Caps []uint
	// Owner is the uid and gid (0: root).
	Owner int
}

// ownedBy gives e the owner uid (and gid) id.
func ownedBy(e entry, id int) entry {
	e.Owner = id
	return e
}

// withCaps gives regular file e the file capabilities caps (setcap
// CAPS=ep).
func withCaps(e entry, caps ...uint) entry {
	e.Caps = caps
	return e
}

// fileCaps is the security.capability value (struct vfs_cap_data,
// revision 2: magic with the effective flag, then permitted and
// inheritable for capabilities 0-31 and 32-63, little-endian).
func fileCaps(caps []uint) string {
	const vfsCapRevision2, vfsCapFlagsEffective = 0x02000000, 0x1
	var permitted [2]uint32
	for _, c := range caps {
		permitted[c/32] |= 1 << (c % 32)
	}
	b := binary.LittleEndian.AppendUint32(nil, vfsCapRevision2|vfsCapFlagsEffective)
	for _, p := range permitted {
		b = binary.LittleEndian.AppendUint32(b, p)
		b = binary.LittleEndian.AppendUint32(b, 0)
	}
	return string(b)
}

// regular is a regular file Src installed at dst with mode perm.
func regular(dst, src string, perm fs.FileMode) entry { return entry{Path: dst, Src: src, Mode: perm} }

// content is a regular file with the given bytes at dst.
func content(dst string, data []byte, perm fs.FileMode) entry {
	return entry{Path: dst, Data: data, Mode: perm}
}

// tree is the regular files and directories under the host directory src,
// installed under dst (files 0644, or 0755 if executable; no symlinks).
func tree(dst, src string) ([]entry, error) {
	var out []entry
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := path.Join(dst, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			out = append(out, dir(target, 0o755))
		case info.Mode().IsRegular():
			perm := fs.FileMode(0o644)
			if info.Mode().Perm()&0o111 != 0 {
				perm = 0o755
			}
			out = append(out, regular(target, p, perm))
		default:
			return fmt.Errorf("%s: not a regular file or directory", p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("tree %s: %w", src, err)
	}
	return out, nil
}

// dir is a directory dst with mode perm.
func dir(dst string, perm fs.FileMode) entry { return entry{Path: dst, Mode: fs.ModeDir | perm} }

// symlink is a symlink dst -> target.
func symlink(dst, target string) entry {
	return entry{Path: dst, Link: target, Mode: fs.ModeSymlink | 0o777}
}

// spec describes one image: an optional base rootfs (a tar file, e.g. from
// mmdebstrap), one layer of files on top, the config and its tags.
type spec struct {
	Name       string   // archive file name without .tar
	Tags       []string // the names the manifests and the e2e tests pull
	Base       string   // base rootfs tar file; "" builds from scratch
	Files      []entry  // the layer on top of Base
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	User       string // the image's user ("": root)
}

// layerTar returns the uncompressed tar of the entries, with parent
// directories added (0755) and every header's owner root and time epoch.
func layerTar(entries []entry) ([]byte, error) {
	byPath := map[string]entry{}
	for _, e := range entries {
		p := path.Clean("/" + e.Path)
		e.Path = p
		byPath[p] = e
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = dir(d, 0o755)
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths) // parents before children
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := byPath[p]
		h := &tar.Header{Name: p[1:], Mode: int64(e.Mode.Perm()), ModTime: epoch, Format: tar.FormatPAX, Uid: e.Owner, Gid: e.Owner}
		var data []byte
		switch {
		case e.Mode.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case e.Mode&fs.ModeSymlink != 0:
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.Link
		default:
			var err error
			if data = e.Data; data == nil {
				if data, err = os.ReadFile(e.Src); err != nil {
					return nil, fmt.Errorf("layer file %s: %w", p, err)
				}
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
			if len(e.Caps) > 0 {
				h.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": fileCaps(e.Caps)}
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer header %s: %w", p, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("layer file %s: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// build assembles the image of s.
func build(s spec) (v1.Image, error) {
	var layers []v1.Layer
	if s.Base != "" {
		base, err := tarball.LayerFromFile(s.Base)
		if err != nil {
			return nil, fmt.Errorf("%s: base layer %s: %w", s.Name, s.Base, err)
		}
		layers = append(layers, base)
	}
	if len(s.Files) > 0 {
		data, err := layerTar(s.Files)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		})
		if err != nil {
			return nil, fmt.Errorf("%s: layer: %w", s.Name, err)
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, fmt.Errorf("%s: append layers: %w", s.Name, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w", s.Name, err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.Cmd = s.Cmd
	cf.Config.Env = s.Env
	cf.Config.WorkingDir = s.WorkingDir
	cf.Config.User = s.User
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("%s: set config: %w", s.Name, err)
	}
	return img, nil
}

// write builds the image of s and writes it to file as a docker-archive
// tarball (manifest.json + config + layers) carrying every tag of s, the
// format `ctr images import` and `docker load` read.
func write(s spec, file string) error {
	if len(s.Tags) == 0 {
		return fmt.Errorf("%s: no tags", s.Name)
	}
	img, err := build(s)
	if err != nil {
		return err
	}
	refs := map[name.Reference]v1.Image{}
	for _, t := range s.Tags {
		tag, err := name.NewTag(t, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("%s: tag %q: %w", s.Name, t, err)
		}
		refs[tag] = img
	}
	tmp := file + ".tmp"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%s: write %s: %w", s.Name, file, err)
	}
	return os.Rename(tmp, file)
}
