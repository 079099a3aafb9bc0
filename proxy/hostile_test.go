package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
)

func TestOversizedHeadersGet431AndTheProxyKeepsServing(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	for _, raw := range []string{
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 40_000) + "\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + strings.Repeat("X-Many: header-value-here\r\n", 2_000) + "\r\n",
	} {
		resp, body := h.raw(raw)
		if code, _ := errorOf(t, body); resp.StatusCode != 431 || code != CodeHeadersTooLarge || resp.Header.Get("X-Request-Id") == "" {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	if resp, _ := h.do("GET", "/v1/models", ""); resp.StatusCode != 200 || up.Count() != 1 {
		t.Fatal("proxy stopped serving after oversized headers")
	}
}

func TestMalformedRequestClosesTheConnection(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GARBAGE\x00\x01 not http\r\n\r\n")
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if code, _ := errorOf(t, body); resp.StatusCode != 400 || code != CodeBadRequest {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("connection left open after a malformed request: %v", err)
	}
}

func TestRequestSmugglingIsRefused(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	resp, body := h.raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
	if code, _ := errorOf(t, body); resp.StatusCode != 400 || code != CodeBadRequest || !resp.Close {
		t.Fatalf("%d %s close=%v", resp.StatusCode, body, resp.Close)
	}
	if up.Count() != 0 {
		t.Fatalf("upstream saw %d requests", up.Count())
	}
}

func TestSlowlorisIsCutAndOthersAreServed(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) { o.Server.ReadTimeout = 500 * time.Millisecond })
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	cut := make(chan time.Duration, 1)
	go func() {
		// One header byte every 100 ms, for up to 5 s.
		header := "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("s", 100)
		for i := 0; i < len(header); i++ {
			if _, err := conn.Write([]byte{header[i]}); err != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
			if time.Since(start) > 5*time.Second {
				break
			}
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.ReadAll(conn)
		cut <- time.Since(start)
	}()
	// Meanwhile another client is served normally.
	time.Sleep(200 * time.Millisecond)
	if resp, _ := h.do("GET", "/v1/models", ""); resp.StatusCode != 200 {
		t.Fatal("a normal client was not served during a slowloris")
	}
	if d := <-cut; d > 3*time.Second {
		t.Fatalf("slowloris connection lived %v with a 500ms read timeout", d)
	}
}

// TestClientThatStopsReadingDoesNotGrowMemory is not parallel: it
// measures the process's heap.
func TestClientThatStopsReadingDoesNotGrowMemory(t *testing.T) {
	const chunk = 1 << 20
	big := strings.Repeat("x", chunk)
	chunks := make([]string, 64) // 64 MiB, sent as fast as the proxy takes it
	for i := range chunks {
		chunks[i] = big
	}
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"Content-Type", "application/octet-stream"}}, Chunks: chunks})
	h := startProxy(t, up.URL, nil)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	before := heap()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET /v1/files/big/content HTTP/1.1\r\nHost: x\r\n\r\n")
	time.Sleep(1500 * time.Millisecond) // the client reads nothing
	if grown := int64(heap()) - int64(before); grown > 16<<20 {
		t.Fatalf("heap grew %d MiB while the client did not read: the stream is being buffered", grown>>20)
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || n != int64(len(chunks)*chunk) {
		t.Fatalf("read %d bytes, err %v", n, err)
	}
}

func TestBinaryAndInvalidUTF8BodiesPassUntouched(t *testing.T) {
	t.Parallel()
	payload := []byte{0xff, 0xfe, 0x00, 0x01, 'a', 0xc3, 0x28, 0xe2, 0x82, '\n', 0x00}
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"Content-Type", "application/octet-stream"}}, Body: string(payload)})
	h := startProxy(t, up.URL, nil)
	resp, body := h.do("POST", "/v1/chat/completions", string(payload), "Content-Type", "application/json")
	if resp.StatusCode != 200 || !bytes.Equal(body, payload) || !bytes.Equal(up.Requests()[0].Body, payload) {
		t.Fatalf("got %d %x; upstream got %x", resp.StatusCode, body, up.Requests()[0].Body)
	}
}

func TestErrorPathsKeepServingOtherClients(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) { o.Routes[0].MaxBody = 10 })
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			switch i % 4 {
			case 0:
				h.raw("BROKEN\r\n\r\n")
			case 1:
				h.raw("CONNECT x:443 HTTP/1.1\r\nHost: x\r\n\r\n")
			case 2:
				h.do("POST", "/v1/chat/completions", strings.Repeat("x", 11))
			default:
				if resp, _ := h.do("GET", "/v1/models", ""); resp.StatusCode != 200 {
					t.Errorf("good request failed: %d", resp.StatusCode)
				}
			}
		}(i)
	}
	wg.Wait()
}

// TestHeaderValuesNeverReachTheLogOrTheBody sends an Authorization whose
// value carries a stray \r or control byte (a CRLF env file): fasthttp
// rejects it, and neither its one log line nor the 400 may quote the key.
func TestHeaderValuesNeverReachTheLogOrTheBody(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	for _, bad := range []string{"Bearer sk-live-SECRET\rtail", "Bearer sk-live-SECRET\x01tail", "Bearer sk-live-SECRET\x7f"} {
		resp, body := h.raw("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: " + bad + "\r\n\r\n")
		if code, _ := errorOf(t, body); resp.StatusCode != 400 || code != CodeBadRequest || strings.Contains(string(body), "SECRET") {
			t.Fatalf("%q: %d %s", bad, resp.StatusCode, body)
		}
	}
	time.Sleep(50 * time.Millisecond) // fasthttp would log after answering
	logs := h.logs.String()
	if strings.Contains(logs, "SECRET") || strings.Count(logs, `"error":"bad_request"`) != 3 || strings.Contains(logs, "error when serving") {
		t.Fatalf("the log quotes the header, or is not one line per refused request:\n%s", logs)
	}
}

// TestSlowRequestIs408WithoutAddresses: a request that does not arrive
// within read_timeout is answered 408 request_timeout, not a 400 that
// quotes socket addresses.
func TestSlowRequestIs408WithoutAddresses(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) { o.Server.ReadTimeout = 300 * time.Millisecond })
	for _, partial := range []string{
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: aaa",                                       // headers never end
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":", // body never ends
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(conn, partial); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil {
			t.Fatalf("%q: no answer: %v", partial, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if code, _ := errorOf(t, body); resp.StatusCode != 408 || code != CodeRequestTimeout || strings.Contains(string(body), "127.0.0.1") {
			t.Fatalf("%q: %d %s", partial, resp.StatusCode, body)
		}
	}
}

// TestDotSegmentsCannotLeaveTheRoutePrefix: a route for /v1/chat/ with the
// upstream's key must not reach /admin through dot-segments, in any
// spelling; paths that stay inside go upstream byte for byte.
func TestDotSegmentsCannotLeaveTheRoutePrefix(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Routes[0].PathPrefix = "/v1/"
		o.Upstreams[0].APIKey = "sk-upstream-key"
	})
	for _, p := range []string{"/v1/../admin", "/v1/%2e%2e/admin", "/v1/%2E./admin", "/v1/x/..%2F..%2Fadmin", "/v1/..%5Cadmin", "/v1/.."} {
		resp, body := h.raw("GET " + p + " HTTP/1.1\r\nHost: x\r\n\r\n")
		if code, _ := errorOf(t, body); resp.StatusCode != 400 || code != CodeBadRequest {
			t.Fatalf("%s: %d %s", p, resp.StatusCode, body)
		}
	}
	if up.Count() != 0 {
		t.Fatalf("the upstream saw %d escaping requests", up.Count())
	}
	for _, p := range []string{"/v1/./models", "/v1/x/../models", "/v1/models/org%2Fname", "/v1/models/llama3.1"} {
		if resp, _ := h.raw("GET " + p + " HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
	}
	for i, want := range []string{"/v1/./models", "/v1/x/../models", "/v1/models/org%2Fname", "/v1/models/llama3.1"} {
		if got := up.Requests()[i].RequestURI; got != want {
			t.Errorf("forwarded %q, want the raw %q", got, want)
		}
	}
}

// TestFragmentInTheRequestTargetIsRefused: an origin-form target has no
// fragment; fasthttp drops one before it goes upstream, so "/v1/..#x"
// passed the path_prefix check as one segment and reached "/v1/.." with
// the route's key. Any '#' is 400, before anything is sent.
func TestFragmentInTheRequestTargetIsRefused(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Routes[0].PathPrefix = "/v1/"
		o.Upstreams[0].APIKey = "sk-upstream-key"
	})
	for _, p := range []string{"/v1/..#x", "/v1/models#frag", "/v1/a/..%2F..#/x", "/v1/models?q=1#x"} {
		resp, body := h.raw("GET " + p + " HTTP/1.1\r\nHost: x\r\n\r\n")
		if code, _ := errorOf(t, body); resp.StatusCode != 400 || code != CodeBadRequest {
			t.Fatalf("%s: %d %s", p, resp.StatusCode, body)
		}
	}
	if up.Count() != 0 {
		t.Fatalf("the upstream saw %d requests with a fragment: %+v", up.Count(), up.Requests())
	}
	if resp, _ := h.raw("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("a plain path after them: %d", resp.StatusCode)
	}
}

// TestClientsThatNeverReadCannotOpenTheBreaker: clients that stop reading
// hold every upstream connection; others get 503 upstream_busy within
// queue_timeout (Sturdy's congestion, not the upstream's fault: the
// breaker stays closed), and write_timeout cuts the stalled clients, so
// the connections come back.
func TestClientsThatNeverReadCannotOpenTheBreaker(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 1<<20)
	chunks := make([]string, 64)
	for i := range chunks {
		chunks[i] = big
	}
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"Content-Type", "application/octet-stream"}}, Chunks: chunks})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].MaxConnections = 2
		o.Upstreams[0].QueueTimeout = 300 * time.Millisecond
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000}
		o.Server.WriteTimeout = time.Second
	})
	for i := 0; i < 2; i++ {
		conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "GET /v1/files/big/content HTTP/1.1\r\nHost: x\r\n\r\n") // and never read
	}
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	resp, body := h.do("GET", "/v1/models", "")
	if code, _ := errorOf(t, body); resp.StatusCode != 503 || code != CodeUpstreamBusy || time.Since(start) > 2*time.Second {
		t.Fatalf("while every connection is held: %d %s after %v", resp.StatusCode, body, time.Since(start))
	}
	if st := h.p.tbl.Load().upstreams[0].Endpoints()[0].Breaker().State(); st != breaker.StateClosed {
		t.Fatalf("waiting for a connection counted against the breaker: %v", st)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		up.SetScript(upstreamtest.Step{Body: "ok"})
		if resp, body := h.do("GET", "/v1/models", ""); resp.StatusCode == 200 && string(body) == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stalled clients were never cut: their connections stay held")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A cut client's line is written as its request ends, which may be
	// just after its connection came back: waited for, up to 5 s.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(h.logs.String(), `"outcome":"client_gone"`); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the cut clients are not logged as gone:\n%s", h.logs.String())
		}
	}
}

// trickler is an upstream that answers every request with a Content-Length
// of total bytes: burst of them at once, then one byte per gap.
func trickler(t *testing.T, total, burst int, gap time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = http.ReadRequest(bufio.NewReader(c))
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", total, strings.Repeat("x", burst))
				for i := burst; i < total; i++ {
					select {
					case <-done:
						return
					case <-time.After(gap):
					}
					if _, err := c.Write([]byte("x")); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// TestTricklingUpstreamIsBounded: a non-streamed reply that drips under
// the idle timeout must neither hold the client without headers (its
// first bytes must reach the client within first_byte, else it is a
// timeout) nor run forever (max_duration cuts it, never as if whole).
func TestTricklingUpstreamIsBounded(t *testing.T) {
	t.Parallel()
	t.Run("from the start: a timeout", func(t *testing.T) {
		t.Parallel()
		h := startProxy(t, trickler(t, 100_000, 10, 50*time.Millisecond), func(o *Options) {
			o.Upstreams[0].Timeouts.FirstByte = 400 * time.Millisecond
			o.Routes[0].Retry.MaxAttempts = 2
		})
		start := time.Now()
		resp, body := h.do("GET", "/v1/files/x/content", "")
		if code, _ := errorOf(t, body); resp.StatusCode != 504 || code != CodeUpstreamTimeout || time.Since(start) > 3*time.Second {
			t.Fatalf("%d %s after %v", resp.StatusCode, body, time.Since(start))
		}
	})
	t.Run("after the first bytes: max_duration", func(t *testing.T) {
		t.Parallel()
		h := startProxy(t, trickler(t, 100_000, 40_000, 50*time.Millisecond), func(o *Options) {
			o.Routes[0].MaxDuration = time.Second
		})
		start := time.Now()
		req, _ := http.NewRequest("GET", h.url+"/v1/files/x/content", nil)
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Fatalf("headers took %v: the client was held without them", took)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil || n >= 100_000 || time.Since(start) > 3*time.Second {
			t.Fatalf("read %d bytes, err %v, after %v: a cut reply must never look whole", n, err, time.Since(start))
		}
		if line := h.accessLines(1)[0]; line["outcome"] != "stream_interrupted" {
			t.Fatalf("access line: %v", line)
		}
	})
}
