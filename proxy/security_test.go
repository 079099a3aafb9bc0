package proxy

import (
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

func TestClientAuthentication(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) {
		o.AuthKeys = []string{"sturdy-key-aaaaaaaaaaaa", "sturdy-key-bbbbbbbbbbbb"}
		o.Upstreams[0].APIKey = "sk-upstream-secret"
	})
	for _, bad := range []string{"", "Bearer wrong-key-xxxxxxxxxx", "Bearer sturdy-key-aaaaaaaaaaa", "sturdy-key-aaaaaaaaaaaa", "Bearer sturdy-key-aaaaaaaaaaaaX"} {
		var resp, body = h.chat("")
		if bad != "" {
			resp, body = h.chat("", "Authorization", bad)
		}
		code, _ := errorOf(t, body)
		if resp.StatusCode != 401 || code != CodeInvalidAPIKey || strings.Contains(string(body), "sk-upstream") {
			t.Fatalf("Authorization %q: %d %s", bad, resp.StatusCode, body)
		}
	}
	if up.Count() != 0 {
		t.Fatal("an unauthenticated request reached the upstream")
	}
	for _, key := range []string{"sturdy-key-aaaaaaaaaaaa", "sturdy-key-bbbbbbbbbbbb"} {
		if resp, _ := h.chat("", "Authorization", "Bearer "+key); resp.StatusCode != 200 {
			t.Fatalf("key %s refused: %d", key, resp.StatusCode)
		}
	}
	if got := up.Requests()[0].Header["Authorization"]; got != "Bearer sk-upstream-secret" {
		t.Fatalf("upstream got Authorization %q", got)
	}
}

func TestClientKeyNeverGoesUpstreamWithoutAnUpstreamKey(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) { o.AuthKeys = []string{"sturdy-key-aaaaaaaaaaaa"} })
	h.chat("", "Authorization", "Bearer sturdy-key-aaaaaaaaaaaa")
	if got, ok := up.Requests()[0].Header["Authorization"]; ok {
		t.Fatalf("Sturdy's client key went upstream: %q", got)
	}
}

func TestUpstreamTLSVerification(t *testing.T) {
	t.Parallel()
	cert, key := upstreamtest.SelfSigned(t)
	up := upstreamtest.StartTLS(t, cert, key, upstreamtest.Step{Body: "over tls"})
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, cert, 0o600); err != nil {
		t.Fatal(err)
	}
	// Verification is on by default: an unknown CA is a failure to connect.
	h := startProxy(t, up.URL, func(o *Options) { o.Routes[0].Retry.MaxAttempts = 1 })
	resp, body := h.chat("")
	if code, _ := errorOf(t, body); resp.StatusCode != 502 || code != CodeUpstreamUnreachable || up.Count() != 0 {
		t.Fatalf("unverified upstream: %d %s", resp.StatusCode, body)
	}
	for name, edit := range map[string]func(*upstream.Options){
		"ca_file":              func(u *upstream.Options) { u.TLS.CAFile = caFile },
		"insecure_skip_verify": func(u *upstream.Options) { u.TLS.InsecureSkipVerify = true },
	} {
		h := startProxy(t, up.URL, func(o *Options) { edit(&o.Upstreams[0]) })
		if resp, body := h.chat(""); resp.StatusCode != 200 || string(body) != "over tls" {
			t.Fatalf("%s: %d %q", name, resp.StatusCode, body)
		}
	}
	if _, err := New(Options{Upstreams: []upstream.Options{{Name: "x", URL: up.URL, TLS: upstream.TLS{CAFile: "/nonexistent.pem"}}}}); err == nil {
		t.Fatal("unreadable ca_file accepted")
	}
}

// TestRefusalOverTLSIsAnHTTPAnswer: past server.max_connections a TLS
// client still gets the polite 503, over TLS.
func TestRefusalOverTLSIsAnHTTPAnswer(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	o := Options{Upstreams: []upstream.Options{testUpstream("up", up.URL)}, Routes: []Route{testRoute("up")},
		Server: ServerLimits{MaxConnections: 1}, Log: zerolog.Nop()}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	hostPort, tlsConfig := serveTLS(t, p)
	client := func() *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	}
	addr := "https://" + hostPort
	// A client holds the one place: connected, handshaken, silent.
	held, err := tls.Dial("tcp", hostPort, tlsConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	resp, err := client().Get(addr + "/v1/models")
	if err != nil {
		t.Fatalf("the refused TLS client got no HTTP answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if code, _ := errorOf(t, body); resp.StatusCode != 503 || code != CodeTooManyConnections {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}
