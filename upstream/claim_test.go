package upstream

import (
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"sturdy/internal/upstreamtest"
	"sturdy/metrics"
)

// TestASmallReplyLetsItsConnectionGoBeforeTheAttemptReturns: a reply read
// whole with its head comes back with its connection already pooled and
// no longer the attempt's, so a client leaving now closes nothing.
func TestASmallReplyLetsItsConnectionGoBeforeTheAttemptReturns(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	ep := startUpstream(t, up.URL).Endpoints()[0]
	for i := range 3 { // a fresh connection, then the pooled one
		hold, req := new(Hold), new(fasthttp.Request)
		req.SetRequestURI(up.URL + "/v1/models")
		resp := new(fasthttp.Response)
		if err := ep.Send(hold, req, resp, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if resp.BodyStream() != nil || string(resp.Body()) != "ok" || hold.conn != nil {
			t.Fatalf("send %d: streamed %v, body %q, still holding a connection %v", i, resp.BodyStream() != nil, resp.Body(), hold.conn != nil)
		}
		if n := ep.client.ConnsCount(); n != 1 {
			t.Fatalf("send %d: %d connections, want the one pooled", i, n)
		}
	}
}

// TestEachAttemptClaimsItsOwnConnection: under concurrent sends, fresh
// and pooled connections alike, the connection an attempt records (the
// one a client leaving would close) is the one its response came on. The
// body is larger than the head, so it streams and the attempt holds its
// connection until the body is closed (a small one is read with the head
// and let go of at once: TestAPooledConnectionIsLetGoFirst).
func TestEachAttemptClaimsItsOwnConnection(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: strings.Repeat("x", HeadSize+1)})
	ep := startUpstream(t, up.URL).Endpoints()[0]
	var wrong atomic.Int32
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				hold, req := new(Hold), new(fasthttp.Request)
				req.SetRequestURI(up.URL + "/v1/models")
				resp := new(fasthttp.Response)
				if err := ep.Send(hold, req, resp, 5*time.Second); err != nil {
					t.Error(err)
					return
				}
				if a, ok := resp.LocalAddr().(*connAddr); !ok || a.conn != hold.conn {
					wrong.Add(1)
				}
				_, _ = io.Copy(io.Discard, resp.BodyStream())
				_ = resp.CloseBodyStream() // read whole: the connection goes back to the pool
				if i%3 == 0 {
					ep.close() // some sends dial afresh
				}
			}
		}()
	}
	wg.Wait()
	if n := wrong.Load(); n != 0 {
		t.Fatalf("%d of 1600 attempts recorded another attempt's connection", n)
	}
}

// startUpstream builds an upstream of one endpoint at url, with
// test-sized timeouts, in an environment of its own; it is closed when
// the test ends.
func startUpstream(t *testing.T, url string) *Upstream {
	t.Helper()
	o := Options{Name: "up", URL: url, Timeouts: Timeouts{Connect: 500 * time.Millisecond, FirstByte: 2 * time.Second,
		Idle: time.Second}, MaxConnections: 64}
	up, err := New(testEnv(), o.WithDefaults(), nil)
	if err != nil {
		t.Fatal(err)
	}
	up.Own()
	t.Cleanup(up.Close)
	return up
}

// testEnv is an environment that logs and announces nothing, with
// metrics of its own.
func testEnv() *Env {
	return &Env{Log: zerolog.Nop(), Metrics: metrics.New(), Lookup: net.DefaultResolver.LookupHost,
		IsSelf: func(string) bool { return false }, Stopping: make(chan struct{}),
		Evicted: func(string) func() { return func() {} }, ModelLabel: func(string) string { return "other" },
		Announcer: func() func(string, string, time.Time) { return nil }}
}

// TestAConnectionSeveredAsItsStreamEndsIsNotPooled: a client that leaves
// as its stream ends closes the connection (Hold.Sever) before the
// request lets go of it (Drop) and closes the body: that connection is
// not pooled, and the next send on the endpoint reaches the upstream.
// Before, the body's close pooled it (read to its end, no error) and the
// next request failed at once, as a reset, without being sent.
func TestAConnectionSeveredAsItsStreamEndsIsNotPooled(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: strings.Repeat("x", HeadSize+1)})
	ep := startUpstream(t, up.URL).Endpoints()[0]
	for i := range 3 {
		hold, req, resp := new(Hold), new(fasthttp.Request), new(fasthttp.Response)
		req.SetRequestURI(up.URL + "/v1/models")
		if err := ep.Send(hold, req, resp, 5*time.Second); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		if _, err := io.Copy(io.Discard, resp.BodyStream()); err != nil {
			t.Fatal(err)
		}
		hold.Sever() // the client left as the stream ended
		hold.Drop()
		_ = resp.CloseBodyStream()
		if n := ep.client.ConnsCount(); n != 0 {
			t.Fatalf("send %d: %d connections pooled, want the severed one closed", i, n)
		}
	}
	if got := up.Count(); got != 3 {
		t.Fatalf("the upstream saw %d requests, want 3", got)
	}
}

// TestAClosedPooledConnectionIsUnsent: a send on a pooled connection that
// was closed fails before a byte is written, and says so (Unsent), so
// the request path resends it as a stale one, never as a reset.
func TestAClosedPooledConnectionIsUnsent(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	ep := startUpstream(t, up.URL).Endpoints()[0]
	hold, req, resp := new(Hold), new(fasthttp.Request), new(fasthttp.Response)
	req.SetRequestURI(up.URL + "/v1/models")
	if err := ep.Send(hold, req, resp, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var pooled *upstreamConn
	if a, ok := resp.LocalAddr().(*connAddr); ok {
		pooled = a.conn
	}
	_ = pooled.Conn.Close() // closed under the pool, as a severed one was
	err := ep.Send(new(Hold), req, new(fasthttp.Response), 5*time.Second)
	if err == nil || !Unsent(err) {
		t.Fatalf("a send on a closed pooled connection: %v, want an unsent failure", err)
	}
	if got := up.Count(); got != 1 {
		t.Fatalf("the upstream saw %d requests", got)
	}
}
