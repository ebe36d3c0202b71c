package lab

import (
	"slices"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/internal/k8stest"
)

func TestDocCommands(t *testing.T) {
	md := "# T\n\n## Other\n\n```sh\nbin/helm install nope\n```\n\n## Install with Helm\n\ntext\n\n```sh\n" +
		"bin/helm install a b \\\n  --set x=<API server address> \\\n  --set y=1   # a comment\nbin/helm show values b   # not an install\n```\n"
	got, err := DocCommands([]byte(md), installHelmSection, "bin/helm install ")
	if err != nil {
		t.Fatal(err)
	}
	if want := "bin/helm install a b --set x=<API server address> --set y=1"; len(got) != 1 || got[0] != want {
		t.Fatalf("commands %q, want [%q]", got, want)
	}
	for name, bad := range map[string]string{
		"no section":      "## Elsewhere\n```sh\nbin/helm install a\n```\n",
		"no block":        "## Install with Helm\ntext\n## Next\n```sh\nbin/helm install a\n```\n",
		"unclosed":        "## Install with Helm\n```sh\nbin/helm install a\n",
		"ends continued":  "## Install with Helm\n```sh\nbin/helm install a \\\n```\n",
		"no such command": "## Install with Helm\n```sh\nbin/helm show values b\n```\n",
	} {
		if c, err := DocCommands([]byte(bad), installHelmSection, "bin/helm install "); err == nil {
			t.Errorf("%s: got %q, want an error", name, c)
		}
	}
}

// TestHelmInstallFromDocs: the install page's Helm command, with the lab's
// values, is one `bin/helm install` that sets the API server's address and
// port and the image the lab's nodes hold; a placeholder the lab does not
// know is refused.
func TestHelmInstallFromDocs(t *testing.T) {
	srv := &k8stest.Server{Address: "10.99.0.254", APIPort: 34567}
	cmds, err := helmInstallCommands(repoRoot(t), srv)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 1 {
		t.Fatalf("commands %q, want one bin/helm install", cmds)
	}
	for _, want := range []string{"bin/helm install lanekit deploy/helm/lanekit", "-n " + LanekitNamespace,
		"--set config.k8sServiceHost=10.99.0.254", "--set config.k8sServicePort=34567",
		"--set image.repository=ghcr.io/lanekit/lanekit-agent"} {
		if !strings.Contains(cmds[0], want) {
			t.Errorf("documented install %q lacks %q", cmds[0], want)
		}
	}
}

// TestDigestRefs: an import's digest name is tagged under each repository
// the same import added, and nothing older is.
func TestDigestRefs(t *testing.T) {
	before := map[string]bool{"import-2026-11-29@sha256:aa": true, "quay.io/kubevirt/virt-launcher:v1.9.0": true}
	after := map[string]bool{"import-2026-11-29@sha256:aa": true, "quay.io/kubevirt/virt-launcher:v1.9.0": true,
		"import-2026-11-29@sha256:bb": true, "ghcr.io/lanekit/lanekit-guest:v0.1.0": true, "localhost:5000/x/y:1": true}
	got := digestRefs(before, after)
	want := [][2]string{
		{"import-2026-11-29@sha256:bb", "ghcr.io/lanekit/lanekit-guest@sha256:bb"},
		{"import-2026-11-29@sha256:bb", "localhost:5000/x/y@sha256:bb"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("digestRefs = %v, want %v", got, want)
	}
}
