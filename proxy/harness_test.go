package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// harness is a running Sturdy in front of test upstreams.
type harness struct {
	t    *testing.T
	p    *Proxy
	url  string
	logs *upstreamtest.LogBuffer
}

// testUpstream is an upstream with test-sized timeouts and a breaker that
// does not trip unless a test asks for it.
func testUpstream(name, url string) upstream.Options {
	return upstream.Options{Name: name, URL: url, Timeouts: upstream.Timeouts{Connect: 500 * time.Millisecond,
		FirstByte: 2 * time.Second, Idle: time.Second}, MaxConnections: 64,
		Breaker: breaker.Settings{ConsecutiveFailures: 1000, MinRequests: 1000}}
}

// testRoute is a catch-all route with fast backoff.
func testRoute(upstream string) Route {
	return Route{Name: "default", PathPrefix: "/", Upstream: upstream, Deadline: 10 * time.Second, MaxBody: 1 << 20,
		Retry: Retry{MaxAttempts: 4, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond,
			MaxRetryAfter: 5 * time.Second}}
}

// startProxy runs Sturdy on 127.0.0.1:0 with one upstream at upstreamURL,
// after edit (if any) adjusts the options.
func startProxy(t *testing.T, upstreamURL string, edit func(*Options)) *harness {
	t.Helper()
	logs := &upstreamtest.LogBuffer{}
	o := Options{
		Upstreams: []upstream.Options{testUpstream("up", upstreamURL)},
		Routes:    []Route{testRoute("up")},
		Log:       zerolog.New(logs).With().Timestamp().Logger(),
	}
	if edit != nil {
		edit(&o)
	}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, p: p, url: serve(t, p), logs: logs}
}

// serve runs p on a fresh 127.0.0.1 port, through its listener guard as
// in production, until the test ends, and returns its http:// URL.
func serve(t testing.TB, p *Proxy) string {
	t.Helper()
	return upstreamtest.ServeWith(t, p.Serve, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
}

// serveTLS runs p over TLS, with a throwaway certificate for 127.0.0.1,
// on a fresh port until the test ends, through its listener guard as in
// production; it returns the address and a client TLS config that
// trusts the certificate.
func serveTLS(t testing.TB, p *Proxy) (addr string, client *tls.Config) {
	t.Helper()
	certPEM, keyPEM := upstreamtest.SelfSigned(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if os.WriteFile(certFile, certPEM, 0o600) != nil || os.WriteFile(keyFile, keyPEM, 0o600) != nil {
		t.Fatal("writing the key pair")
	}
	url := upstreamtest.ServeWith(t, func(ln net.Listener) error { return p.ServeTLS(ln, certFile, keyFile) },
		func() { _ = p.Shutdown(context.Background()) })
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	return strings.TrimPrefix(url, "http://"), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
}

var testClient = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{DisableCompression: true, Proxy: nil, MaxIdleConnsPerHost: 16},
}

// do sends a request and reads the whole response.
func (h *harness) do(method, path, body string, header ...string) (*http.Response, []byte) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("reading body: %v", err)
	}
	return resp, b
}

// chat posts a chat completion request.
func (h *harness) chat(body string, header ...string) (*http.Response, []byte) {
	h.t.Helper()
	if body == "" {
		body = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	}
	return h.do("POST", "/v1/chat/completions", body, append([]string{"Content-Type", "application/json"}, header...)...)
}

// accessLines returns the parsed access-log lines so far, waiting briefly
// for at least want of them (stream lines are written when streams end).
func (h *harness) accessLines(want int) []map[string]any {
	h.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		var out []map[string]any
		sc := bufio.NewScanner(strings.NewReader(h.logs.String()))
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				h.t.Fatalf("log line is not JSON: %q", sc.Text())
			}
			if m["message"] == "request" {
				out = append(out, m)
			}
		}
		if len(out) >= want || time.Now().After(deadline) {
			return out
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// errorBody decodes a Sturdy error body and checks its shape.
func errorOf(t *testing.T, body []byte) (code string, sturdy map[string]any) {
	t.Helper()
	var e struct {
		Error struct {
			Message string         `json:"message"`
			Type    string         `json:"type"`
			Code    string         `json:"code"`
			Param   any            `json:"param"`
			Sturdy  map[string]any `json:"sturdy"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body is not JSON: %q", body)
	}
	if e.Error.Type != ErrorType || e.Error.Message == "" || e.Error.Code == "" || e.Error.Param != nil {
		t.Fatalf("error body not OpenAI-shaped: %s", body)
	}
	if strings.Contains(e.Error.Message, "\n") || strings.Contains(e.Error.Message, ".go:") {
		t.Fatalf("error message has a trace or newline: %q", e.Error.Message)
	}
	return e.Error.Code, e.Error.Sturdy
}

// raw sends raw bytes on a new connection and reads one response (after
// any 100 Continue).
func (h *harness) raw(request string) (*http.Response, []byte) {
	h.t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		h.t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, request); err != nil {
		h.t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err == nil && resp.StatusCode == 100 {
		resp, err = http.ReadResponse(br, nil)
	}
	if err != nil {
		h.t.Fatalf("%q: %v", request, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

// freePort returns a loopback address nothing listens on. Its port is
// one the kernel gives no listener on port 0 and no outgoing connection:
// below the ephemeral range (ip_local_port_range), and not given out
// before in this run (until all ~22,000 were). Every other server of
// these tests listens on port 0, so none running in parallel can take
// the port while this test counts on nothing answering there, or before
// it listens there itself. Where the range leaves no room below it, it
// is a port 0 the kernel picked, closed at once.
func freePort(t *testing.T) string {
	t.Helper()
	room := freePortRoom()
	for i := 0; i < room; i++ {
		port := freePortFloor + int((nextFreePort.Add(1)-1)%int64(room))
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // something listens there: the next one
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// freePortFloor is the lowest port freePort gives out.
const freePortFloor = 10000

// nextFreePort counts the ports freePort has tried; it starts at a
// random place, so two test processes at once seldom try the same ones.
var nextFreePort = func() *atomic.Int64 {
	var n atomic.Int64
	n.Store(rand.Int64N(1 << 20))
	return &n
}()

// freePortRoom is how many ports there are from freePortFloor up to the
// ephemeral range (0 when none).
var freePortRoom = sync.OnceValue(func() int {
	low := 32768 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	return max(0, low-freePortFloor)
})

// io_ReadAll drains and closes a response body.
func io_ReadAll(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// traceExportEvery is the OpenTelemetry SDK's export delay in ms
// (OTEL_BSP_SCHEDULE_DELAY) for the tests: spans reach a test's
// receiver at once.
const traceExportEvery = "20"

// TestMain sets the trace export delay for the whole run, once (a test
// that needs another sets it with t.Setenv and is not parallel), and
// runs at least 8 parallel tests at once (upstreamtest.RaiseParallel).
func TestMain(m *testing.M) {
	if err := os.Setenv("OTEL_BSP_SCHEDULE_DELAY", traceExportEvery); err != nil {
		panic(err)
	}
	upstreamtest.RaiseParallel(8)
	os.Exit(m.Run())
}
