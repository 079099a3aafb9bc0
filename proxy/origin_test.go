package proxy

import (
	"strconv"
	"strings"
	"testing"

	"sturdy/internal/upstreamtest"
)

// TestALoopbackListenerRefusesForeignHostsAndOrigins: on a loopback
// address, a CORS-simple cross-site POST (text/plain) under a rebound
// name, or from a foreign page, is refused 403 origin_not_allowed and
// never reaches the upstream with its key; local names and pages pass.
// Before, it was forwarded with the configured upstream key — the class
// of Ollama's CVE-2024-28224.
func TestALoopbackListenerRefusesForeignHostsAndOrigins(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: upstreamtest.ChatCompletion("ok"),
		Header: [][2]string{{"Content-Type", "application/json"}, {"Access-Control-Allow-Origin", "*"}}})
	h := startProxy(t, up.URL, func(o *Options) { o.AllowedHosts = []string{"box.lan"} })
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, tt := range []struct {
		name   string
		header []string
		status int
	}{
		{"a rebound name", []string{"Host", "rebind.attacker.example", "Content-Type", "text/plain"}, 403},
		{"a foreign page", []string{"Origin", "https://attacker.example", "Content-Type", "text/plain"}, 403},
		{"a sandboxed page", []string{"Origin", "null"}, 403},
		{"a local page", []string{"Origin", "http://localhost:3000"}, 200},
		{"an allowed name", []string{"Host", "box.lan:8080", "Origin", "http://box.lan:8080"}, 200},
		{"no browser", nil, 200},
	} {
		before := up.Count()
		raw := "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n"
		if len(tt.header) == 0 || tt.header[0] != "Host" {
			raw += "Host: 127.0.0.1\r\n"
		}
		for i := 0; i+1 < len(tt.header); i += 2 {
			raw += tt.header[i] + ": " + tt.header[i+1] + "\r\n"
		}
		resp, b := h.raw(raw + "\r\n" + body)
		if resp.StatusCode != tt.status {
			t.Fatalf("%s: %d %s", tt.name, resp.StatusCode, b)
		}
		if got := up.Count() - before; (got == 1) != (tt.status == 200) {
			t.Fatalf("%s: the upstream saw %d requests", tt.name, got)
		}
		if tt.status == 403 && !strings.Contains(string(b), CodeOriginNotAllowed) {
			t.Fatalf("%s: %s", tt.name, b)
		}
		if acao := resp.Header.Get("Access-Control-Allow-Origin"); acao != "" && strings.Contains(raw, "Origin:") {
			t.Fatalf("%s: the upstream's Access-Control-Allow-Origin %q reached a browser", tt.name, acao)
		}
	}
}

// TestCORSPreflightsAreAnsweredHereAndOnlyForCORSOrigins: a preflight is
// never forwarded; a page server.cors_origins lists gets permission, and
// its answers carry it; any other gets 403 and none.
func TestCORSPreflightsAreAnsweredHereAndOnlyForCORSOrigins(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: upstreamtest.ChatCompletion("ok"), Header: [][2]string{{"Access-Control-Allow-Origin", "*"}}})
	h := startProxy(t, up.URL, func(o *Options) { o.CORSOrigins = []string{"https://app.example"} })
	preflight := func(origin string) (int, string) {
		resp, _ := h.do("OPTIONS", "/v1/chat/completions", "", "Origin", origin, "Access-Control-Request-Method", "POST",
			"Access-Control-Request-Headers", "authorization, content-type")
		return resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin") + "|" + resp.Header.Get("Access-Control-Allow-Headers")
	}
	if status, acao := preflight("https://app.example"); status != 204 || acao != "https://app.example|authorization, content-type" {
		t.Fatalf("a listed origin's preflight: %d %q", status, acao)
	}
	if status, acao := preflight("http://localhost:3000"); status != 403 || acao != "|" {
		t.Fatalf("an unlisted origin's preflight: %d %q", status, acao)
	}
	if up.Count() != 0 {
		t.Fatalf("the upstream saw %d preflights", up.Count())
	}
	resp, _ := h.chat("", "Origin", "https://app.example")
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example" || resp.Header.Get("Vary") != "Origin" {
		t.Fatalf("a listed origin's answer: %d %v", resp.StatusCode, resp.Header)
	}
}
