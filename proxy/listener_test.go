package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// TestConnectionsPastReduceMemoryAboveAreServedLean: with
// server.reduce_memory_above: 2, a third connection open at once is
// served by the lean server (fasthttp's ReduceMemoryUsage), plain and
// over TLS, and answered like the first two, kept alive; once fewer are
// open a new connection is served at full speed again; Shutdown closes
// the lean server's idle connection too and returns within its grace.
func TestConnectionsPastReduceMemoryAboveAreServedLean(t *testing.T) {
	t.Parallel()
	for _, overTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls %v", overTLS), func(t *testing.T) {
			t.Parallel()
			p, dial := leanProxy(t, overTLS)
			full, lean := p.Server(), p.leanServer()
			if full.ReduceMemoryUsage || lean == nil || !lean.ReduceMemoryUsage {
				t.Fatal("no lean twin beside a full-speed server")
			}
			// Served where, and counted so: sturdy_lean_client_connections
			// (set on scrape).
			served := func(want [2]int32) {
				t.Helper()
				for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					p.RefreshBreakerGauges()
					got := [2]int32{full.GetOpenConnectionsCount(), lean.GetOpenConnectionsCount()}
					if got == want && testutil.ToFloat64(p.m.LeanClientConnections) == float64(want[1]) &&
						testutil.ToFloat64(p.m.ClientConnections) == float64(want[0]+want[1]) {
						return
					}
					if time.Now().After(end) {
						t.Fatalf("open connections (full speed, lean): %v, want %v; gauges: %v lean of %v", got, want,
							testutil.ToFloat64(p.m.LeanClientConnections), testutil.ToFloat64(p.m.ClientConnections))
					}
				}
			}
			c1, c2, c3 := dial(), dial(), dial()
			served([2]int32{2, 1})
			c1.c.Close()
			c3.c.Close()
			served([2]int32{1, 0})
			c4 := dial() // one other open: full speed again
			served([2]int32{2, 0})
			c5 := dial()
			served([2]int32{2, 1})
			for _, c := range []*keptConn{c2, c4, c5} {
				c.get(t) // each answers again on its kept-alive connection
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := p.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown with a lean idle connection: %v", err)
			}
			if n, err := c5.c.Read(make([]byte, 1)); n != 0 || errors.Is(err, os.ErrDeadlineExceeded) || err == nil {
				t.Fatalf("the lean idle connection was not closed by Shutdown: %d %v", n, err)
			}
			// A connection is closed just after its server counts it out.
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				p.RefreshBreakerGauges()
				lean, all := testutil.ToFloat64(p.m.LeanClientConnections), testutil.ToFloat64(p.m.ClientConnections)
				if lean == 0 && all == 0 {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("after Shutdown the gauges count %v lean of %v open connections", lean, all)
				}
			}
		})
	}
}

// TestWithReduceMemoryEveryConnectionIsLean: server.reduce_memory makes
// the server itself lean (no twin), and every connection counts in
// sturdy_lean_client_connections.
func TestWithReduceMemoryEveryConnectionIsLean(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) { o.Server.ReduceMemory = true })
	if !h.p.Server().ReduceMemoryUsage || h.p.leanServer() != nil {
		t.Fatal("server.reduce_memory: the server is not lean, or has a twin")
	}
	addr := strings.TrimPrefix(h.url, "http://")
	keep(t, func() (net.Conn, error) { return net.Dial("tcp", addr) })
	keep(t, func() (net.Conn, error) { return net.Dial("tcp", addr) })
	h.p.RefreshBreakerGauges()
	if n := testutil.ToFloat64(h.p.m.LeanClientConnections); n != 2 {
		t.Fatalf("sturdy_lean_client_connections %v, want 2", n)
	}
}

// TestServeAfterShutdownServesNothing: a Serve that begins once Shutdown
// has (an embedder's race) closes the connection it accepts and returns,
// instead of serving on with no one to stop it.
func TestServeAfterShutdownServesNothing(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	p, err := New(Options{Upstreams: []upstream.Options{testUpstream("up", up.URL)}, Routes: []Route{testRoute("up")}, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() { served <- p.Serve(ln) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
	if n, err := c.Read(make([]byte, 64)); n != 0 || errors.Is(err, os.ErrDeadlineExceeded) || err == nil {
		t.Fatalf("a connection to a Serve begun after Shutdown was served: %d %v", n, err)
	}
	select {
	case <-served:
	case <-time.After(5 * time.Second):
		t.Fatal("a Serve begun after Shutdown did not return")
	}
}

// keptConn is a client connection kept alive between its requests.
type keptConn struct {
	c  net.Conn
	br *bufio.Reader
}

// get asks for /v1/models on the connection and needs a 200.
func (k *keptConn) get(t *testing.T) {
	t.Helper()
	_ = k.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(k.c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
}

// leanProxy serves a proxy with server.reduce_memory_above: 2, over TLS
// or not; dial opens a client connection to it and has one request
// answered on it.
func leanProxy(t *testing.T, overTLS bool) (p *Proxy, dial func() *keptConn) {
	t.Helper()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	p, err := New(Options{Upstreams: []upstream.Options{testUpstream("up", up.URL)}, Routes: []Route{testRoute("up")},
		Server: ServerLimits{ReduceMemoryAbove: 2}, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	stop := func() { _ = p.Shutdown(context.Background()) }
	if !overTLS {
		addr := strings.TrimPrefix(upstreamtest.ServeWith(t, p.Serve, stop), "http://")
		return p, func() *keptConn { return keep(t, func() (net.Conn, error) { return net.Dial("tcp", addr) }) }
	}
	addr, tlsConfig := serveTLS(t, p)
	return p, func() *keptConn {
		return keep(t, func() (net.Conn, error) { return tls.Dial("tcp", addr, tlsConfig) })
	}
}

// keep dials a connection, closed when the test ends, and has one
// request answered on it.
func keep(t *testing.T, dial func() (net.Conn, error)) *keptConn {
	t.Helper()
	c, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	k := &keptConn{c: c, br: bufio.NewReader(c)}
	k.get(t)
	return k
}
