package main

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sturdy/internal/otlptest"
	"sturdy/internal/upstreamtest"
)

// TestLogsCarryNoSecrets runs a full scenario through the binary at debug
// level, traced — successes, retries, a stream, pass-through and auth
// failures, a rejected reload — and checks that no API key, Authorization
// value, body or query string reaches its output or an exported span
// (spans exported when it shuts down, before the SDK's 5 s batch).
func TestLogsCarryNoSecrets(t *testing.T) {
	t.Parallel()
	const (
		upstreamKey = "sk-UPSTREAM-SECRET-0001"
		clientKey   = "sturdy-CLIENT-SECRET-0002"
		bodyMarker  = "BODY-SECRET-0003"
		queryMarker = "QUERY-SECRET-0004"
		otlpToken   = "OTLP-TOKEN-SECRET-0005"
	)
	rcv := otlptest.Start(t)
	up := upstreamtest.Start(t,
		upstreamtest.Step{Status: 503, Body: `{"error":"` + bodyMarker + `"}`},
		upstreamtest.Step{Body: `{"echo":"` + bodyMarker + `"}`},
		upstreamtest.Step{Status: 400, Body: `{"error":{"message":"` + bodyMarker + `"}}`},
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: upstreamtest.SSE(bodyMarker)[:1], Fault: upstreamtest.Cut},
		upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After", "60"}}, Body: bodyMarker},
	)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "upstream.key")
	cfgFile := filepath.Join(dir, "sturdy.yaml")
	if err := os.WriteFile(keyFile, []byte(upstreamKey), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg string
	p := runBinary(t, func(listen, admin string) []string {
		cfg = "listen: " + listen + "\nadmin_listen: " + admin + "\nlog: {level: debug}\nauth: {keys: [" + clientKey + "]}\n" +
			"upstreams:\n  - {name: m, url: " + up.URL + ", api_key_file: " + keyFile + "}\n" +
			"routes:\n  - {name: r, upstream: m, retry: {base_delay: 1ms, max_delay: 2ms}}\n" +
			"tracing: {endpoint: '" + rcv.URL + "', headers: {authorization: 'Bearer " + otlpToken + "'}}\n"
		if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{"-config", cfgFile}
	})
	addr, logs := p.addr, p.logs

	send := func(auth string) int {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions?key="+queryMarker,
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"`+bodyMarker+`"}]}`))
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for i, want := range []int{200, 400, 200, 429, 401} {
		auth := "Bearer " + clientKey
		if want == 401 {
			auth = "Bearer " + clientKey + "-wrong"
		}
		if got := send(auth); got != want {
			t.Fatalf("request %d: %d, want %d", i, got, want)
		}
	}
	// A rejected reload logs the config problem, not the file's secrets.
	writeFile(t, cfgFile, cfg+"bogus: "+clientKey+"\n") // atomically, as docs/operations.md says to
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "config rejected") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	_ = p.waitExit(t, 10*time.Second)
	out := logs.String()
	if !strings.Contains(out, `"message":"request"`) || !strings.Contains(out, "config rejected") {
		t.Fatalf("scenario did not run as planned:\n%s", out)
	}
	spans := string(rcv.Raw())
	if n := len(rcv.Spans()); n < 5 || rcv.Headers()[0].Get("Authorization") != "Bearer "+otlpToken {
		t.Fatalf("spans not exported at shutdown with the configured headers: %d spans", n)
	}
	for _, secret := range []string{upstreamKey, clientKey, bodyMarker, queryMarker, otlpToken} {
		if strings.Contains(out, secret) {
			t.Errorf("%s reached the log:\n%s", secret, out)
		}
		if strings.Contains(spans, secret) {
			t.Errorf("%s reached an exported span", secret)
		}
	}
}

// TestTLSListener serves the listener over TLS from the config.
func TestTLSListener(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	certPEM, keyPEM := upstreamtest.SelfSigned(t)
	dir := t.TempDir()
	certFile, keyFile, cfgFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem"), filepath.Join(dir, "s.yaml")
	for f, b := range map[string][]byte{certFile: certPEM, keyFile: keyPEM} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr := runBinary(t, func(listen, admin string) []string {
		cfg := "listen: " + listen + "\nadmin_listen: " + admin + "\ntls: {cert_file: " + certFile + ", key_file: " + keyFile + "}\n" +
			"upstreams: [{name: m, url: " + up.URL + "}]\n"
		if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{"-config", cfgFile}
	}).addr
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := client.Get("https://" + addr + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok" || resp.TLS == nil {
		t.Fatalf("%d %q tls=%v", resp.StatusCode, body, resp.TLS != nil)
	}
}
