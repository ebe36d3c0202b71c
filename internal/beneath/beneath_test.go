package beneath

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestRel(t *testing.T) {
	for _, tc := range []struct {
		path, want string
		ok         bool
	}{
		{"/r/a.json", "a.json", true},
		{"/r/cni/a.json", "cni/a.json", true},
		{"/r", "", false},
		{"/r/../etc/passwd", "", false},
		{"/etc/passwd", "", false},
		{"/rx/a", "", false},
		{"r/a", "", false},
		{"/r//a", "", false},
	} {
		got, err := Rel("/r", tc.path)
		if tc.ok != (err == nil) || got != tc.want || (err != nil && !errors.Is(err, ErrOutside)) {
			t.Errorf("Rel(/r, %q) = %q, %v; want %q ok=%v", tc.path, got, err, tc.want, tc.ok)
		}
	}
}

// TestOpenDirRefusesLinks: a symbolic link anywhere below the root is
// refused, and nothing is created or written past it.
func TestOpenDirRefusesLinks(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	outside := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "ok"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.Symlink(outside, filepath.Join(root, "link"))
	os.Symlink("../..", filepath.Join(root, "ok", "up"))
	for _, rel := range []string{"link", "link/sub", "ok/up", "ok/up/x"} {
		d, err := OpenDir(root, rel, 0o700)
		if !errors.Is(err, ErrOutside) {
			t.Errorf("OpenDir(%s) = %v, %v; want ErrOutside", rel, d, err)
		}
		if d != nil {
			d.Close()
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("created outside the root through a link: %v", ents)
	}
	d, err := OpenDir(root, "ok/new/deeper", 0o700)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := WriteFileAt(d, "f.json", []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "ok/new/deeper/f.json")); err != nil || string(b) != "{}" {
		t.Fatalf("written %q, %v", b, err)
	}
	// A link at the file name is replaced, its target untouched.
	target := filepath.Join(outside, "target")
	os.WriteFile(target, []byte("keep"), 0o600)
	os.Symlink(target, filepath.Join(root, "ok/new/deeper/l.json"))
	if err := WriteFileAt(d, "l.json", []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("wrote through a link at the file name: target now %q", b)
	}
	os.Symlink(target, filepath.Join(root, "ok/new/deeper/r.json"))
	if err := RemoveAt(d, "r.json"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(target); err != nil {
		t.Errorf("RemoveAt removed a link's target: %v", err)
	}
	if err := RemoveAt(d, "missing.json"); err != nil {
		t.Errorf("RemoveAt of a missing file: %v", err)
	}
}
