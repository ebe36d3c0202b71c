package k8stest

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestFrontProxyAuthentication: the API server publishes the request-header
// CA and header names in kube-system/extension-apiserver-authentication (what
// aggregated API servers such as KubeVirt's virt-api read at start), and it
// accepts the X-Remote-* headers only from a client presenting the
// front-proxy client certificate.
func TestFrontProxyAuthentication(t *testing.T) {
	s := StartT(t)
	kc := kubernetes.NewForConfigOrDie(s.RESTConfig())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var data map[string]string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		cm, err := kc.CoreV1().ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		data = cm.Data
		return data["requestheader-client-ca-file"] != "", nil
	})
	if err != nil {
		t.Fatalf("extension-apiserver-authentication has no requestheader-client-ca-file (%v): %v", err, data)
	}
	ca, err := os.ReadFile(filepath.Join(s.Dir, frontProxyCA))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(data["requestheader-client-ca-file"]) != strings.TrimSpace(string(ca)) {
		t.Errorf("requestheader-client-ca-file is not the front-proxy CA")
	}
	for key, want := range map[string]string{
		"requestheader-allowed-names":        `["` + FrontProxyClient + `"]`,
		"requestheader-username-headers":     `["X-Remote-User"]`,
		"requestheader-group-headers":        `["X-Remote-Group"]`,
		"requestheader-extra-headers-prefix": `["X-Remote-Extra-"]`,
	} {
		if data[key] != want {
			t.Errorf("%s = %q, want %q", key, data[key], want)
		}
	}

	// Who the API server says a request carrying X-Remote-User: alice is.
	whoami := func(cfg *rest.Config) string {
		t.Helper()
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return headerRT{rt} })
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r, err := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			return "error: " + err.Error()
		}
		b, _ := json.Marshal(r.Status.UserInfo)
		return r.Status.UserInfo.Username + " " + string(b)
	}
	proxy := rest.AnonymousClientConfig(s.RESTConfig())
	proxy.CertFile, proxy.KeyFile = filepath.Join(s.Dir, frontProxyCert), filepath.Join(s.Dir, frontProxyKey)
	if got := whoami(proxy); !strings.HasPrefix(got, "alice ") || !strings.Contains(got, "lanekit-test-group") {
		t.Errorf("with the front-proxy client certificate, X-Remote-User alice is %q", got)
	}
	// Without it (the admin's token, or no credentials) the headers count
	// for nothing.
	for name, cfg := range map[string]*rest.Config{"admin token": s.RESTConfig(), "anonymous": rest.AnonymousClientConfig(s.RESTConfig())} {
		if got := whoami(cfg); strings.HasPrefix(got, "alice ") {
			t.Errorf("%s: X-Remote-User was trusted: %q", name, got)
		}
	}
	// A client certificate the front-proxy CA did not sign is not trusted
	// either (the serving key pair, signed by the cluster CA).
	other := rest.AnonymousClientConfig(s.RESTConfig())
	other.CertFile, other.KeyFile = filepath.Join(s.Dir, "apiserver.crt"), filepath.Join(s.Dir, "apiserver.key")
	if _, err := tls.LoadX509KeyPair(other.CertFile, other.KeyFile); err != nil {
		t.Fatal(err)
	}
	if got := whoami(other); strings.HasPrefix(got, "alice ") {
		t.Errorf("a certificate not signed by the front-proxy CA: X-Remote-User was trusted: %q", got)
	}
}

// headerRT adds the front proxy's identity headers.
type headerRT struct{ rt http.RoundTripper }

func (h headerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Remote-User", "alice")
	r.Header.Set("X-Remote-Group", "lanekit-test-group")
	return h.rt.RoundTrip(r)
}
