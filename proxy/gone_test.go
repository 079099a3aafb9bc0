package proxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// closeRecorder is an upstream that reads each request, answers it with
// reply (after delay; "" for never) and records when Sturdy closed the
// connection.
type closeRecorder struct {
	url   string
	mu    sync.Mutex
	reqs  int
	close []time.Time
}

func startCloseRecorder(t *testing.T, delay time.Duration, replies ...string) *closeRecorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	r := &closeRecorder{url: "http://" + ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.serve(c, delay, replies)
		}
	}()
	return r
}

func (r *closeRecorder) serve(c net.Conn, delay time.Duration, replies []string) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		req, err := http.ReadRequest(br)
		if err != nil {
			r.mu.Lock()
			r.close = append(r.close, time.Now())
			r.mu.Unlock()
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		r.mu.Lock()
		n := r.reqs
		r.reqs++
		r.mu.Unlock()
		reply := replies[min(n, len(replies)-1)]
		closed := make(chan struct{})
		go func() { // notice Sturdy closing while the reply is due
			one := make([]byte, 1)
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			if _, err := br.Read(one); err != nil {
				r.mu.Lock()
				r.close = append(r.close, time.Now())
				r.mu.Unlock()
			}
			close(closed)
		}()
		if reply == "" {
			<-closed
			return
		}
		select {
		case <-closed:
			return
		case <-time.After(delay):
		}
		_, _ = io.WriteString(c, reply)
		<-closed
		return
	}
}

func (r *closeRecorder) requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs
}

// closedAt returns when Sturdy first closed an upstream connection, or
// the zero time.
func (r *closeRecorder) closedAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.close) == 0 {
		return time.Time{}
	}
	return r.close[0]
}

// leaveAfter sends a request on a fresh connection and closes it after d;
// it returns when it closed.
func leaveAfter(t *testing.T, dial func() (net.Conn, error), request string, d time.Duration) time.Time {
	t.Helper()
	c, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	time.Sleep(d)
	c.Close()
	return time.Now()
}

// waitClosed waits up to 3 s for the upstream connection to be closed and
// returns how long after left it was.
func waitClosed(t *testing.T, up *closeRecorder, left time.Time) time.Duration {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); up.closedAt().IsZero(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the upstream connection stayed open after the client left")
		}
	}
	return up.closedAt().Sub(left)
}

const slowChat = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

// TestClientThatLeavesStopsTheUpstream: in every phase — waiting for the
// response head, waiting out a Retry-After, streaming — a client that
// closes its connection makes Sturdy close the upstream's within 300 ms,
// start nothing more, and log 499 client_gone with the phase.
func TestClientThatLeavesStopsTheUpstream(t *testing.T) {
	t.Parallel()
	sseOf := func(chunk string) string {
		return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(chunk), chunk)
	}
	sse := sseOf(`data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n")
	roleOnly := sseOf(`data: {"choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n")
	for _, tt := range []struct {
		name    string
		delay   time.Duration
		replies []string
		leave   time.Duration
		phase   string
		request string
		// samples is how many attempts report a time to first token that
		// counts: not one its client left before its first output.
		samples int64
	}{
		{"waiting for the response head", 0, []string{""}, 200 * time.Millisecond, "response_head", slowChat, 0},
		{"waiting out a Retry-After", 0, []string{"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n", ""},
			300 * time.Millisecond, "retry_after", slowChat, 1},
		{"streaming", 0, []string{sse}, 300 * time.Millisecond, "stream", slowChat, 1},
		// The stream's framing came, its first output has not: the client
		// leaving is no fault of the upstream's.
		{"before the first output", 0, []string{roleOnly}, 300 * time.Millisecond, "response_head", slowChat, 0},
		{"streaming to an HTTP/1.0 client", 0, []string{sse}, 300 * time.Millisecond, "stream",
			strings.Replace(slowChat, "HTTP/1.1", "HTTP/1.0", 1), 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			up := startCloseRecorder(t, tt.delay, tt.replies...)
			h := startProxy(t, up.url, func(o *Options) { o.Upstreams[0].Timeouts.FirstByte = 10 * time.Second })
			dial := func() (net.Conn, error) { return net.Dial("tcp", strings.TrimPrefix(h.url, "http://")) }
			left := leaveAfter(t, dial, tt.request, tt.leave)
			if tt.phase == "retry_after" {
				time.Sleep(1500 * time.Millisecond) // past the Retry-After (1 s after the 429): no retry may come
			} else if took := waitClosed(t, up, left); took > 300*time.Millisecond {
				t.Fatalf("the upstream connection closed %v after the client left", took)
			}
			if n := up.requests(); n != 1 {
				t.Fatalf("the upstream got %d requests: an attempt followed the client's leaving", n)
			}
			line := h.accessLines(1)[0]
			if line["status"] != 499.0 || line["outcome"] != "client_gone" || line["phase"] != tt.phase {
				t.Fatalf("access line %v", line)
			}
			if tried := line["targets"].([]any)[0].(map[string]any); tried["result"] == "reset" || tried["result"] == "timeout" {
				t.Fatalf("the client's leaving counted as the upstream's %v", tried["result"])
			}
			ep := h.p.tbl.Load().upstreams[0].Endpoints()[0]
			if c := ep.Breaker().Counts(); c.TotalFailures != 0 {
				t.Fatalf("the client's leaving counted against the breaker: %+v", c)
			}
			released(t, ep)
			if n, _ := ep.Samples(); n != tt.samples {
				t.Fatalf("%d samples count, want %d", n, tt.samples)
			}
		})
	}
}

// TestKeepAliveClientIsNotTakenForGone: a client that sends its second
// request on the same connection after the first completed, and one that
// pipelines two, are served as usual — with server.reduce_memory too
// (the connection's context and buffers given back between requests).
func TestKeepAliveClientIsNotTakenForGone(t *testing.T) {
	t.Parallel()
	for _, reduce := range []bool{false, true} {
		t.Run(fmt.Sprintf("reduce_memory %v", reduce), func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.Start(t, upstreamtest.Step{Delay: 100 * time.Millisecond, Body: "ok"})
			h := startProxy(t, up.URL, func(o *Options) { o.Server.ReduceMemory = reduce })
			c, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			req := "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
			for i := 0; i < 2; i++ {
				_, _ = io.WriteString(c, req)
				resp, err := http.ReadResponse(br, nil)
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("request %d on a kept-alive connection: %v", i, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
			}
			_, _ = io.WriteString(c, req+req) // pipelined
			for i := 0; i < 2; i++ {
				resp, err := http.ReadResponse(br, nil)
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("pipelined request %d: %v", i, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
			}
			if strings.Contains(h.logs.String(), "client_gone") {
				t.Fatalf("a kept-alive client was taken for gone:\n%s", h.logs.String())
			}
		})
	}
}

// TestClientThatLeavesOverTLS: the watch works under a TLS listener.
func TestClientThatLeavesOverTLS(t *testing.T) {
	t.Parallel()
	up := startCloseRecorder(t, 0, "")
	logs := &upstreamtest.LogBuffer{}
	o := Options{Upstreams: []upstream.Options{testUpstream("up", up.url)}, Routes: []Route{testRoute("up")}}
	o.Upstreams[0].Timeouts.FirstByte = 10 * time.Second
	o.Log = zerolog.New(logs)
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	addr, tlsConfig := serveTLS(t, p)
	dial := func() (net.Conn, error) { return tls.Dial("tcp", addr, tlsConfig) }
	left := leaveAfter(t, dial, slowChat, 200*time.Millisecond)
	if took := waitClosed(t, up, left); took > 300*time.Millisecond {
		t.Fatalf("over TLS, the upstream connection closed %v after the client left", took)
	}
}
