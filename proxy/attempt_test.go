package proxy

import (
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"sturdy/internal/upstreamtest"
)

// TestASmallReplyLetsItsConnectionGoBeforeTheAttemptReturns: a reply read
// whole with its head comes back with its connection already pooled and
// no longer the attempt's, so a client leaving now closes nothing.
func TestASmallReplyLetsItsConnectionGoBeforeTheAttemptReturns(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	p, err := New(Options{Upstreams: []Upstream{testUpstream("up", up.URL)}, Routes: []Route{testRoute("up")}, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ep := p.tbl.Load().upstreams[0].endpointsNow()[0]
	for i := range 3 { // a fresh connection, then the pooled one
		ex := &exchange{req: outbound{msg: new(fasthttp.Request)}}
		ex.req.msg.SetRequestURI(up.URL + "/v1/models")
		resp := new(fasthttp.Response)
		if err := ep.send(ex, resp, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if resp.BodyStream() != nil || string(resp.Body()) != "ok" || ex.upConn != nil {
			t.Fatalf("send %d: streamed %v, body %q, still holding a connection %v", i, resp.BodyStream() != nil, resp.Body(), ex.upConn != nil)
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
	up := upstreamtest.Start(t, upstreamtest.Step{Body: strings.Repeat("x", headSize+1)})
	p, err := New(Options{Upstreams: []Upstream{testUpstream("up", up.URL)}, Routes: []Route{testRoute("up")}, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ep := p.tbl.Load().upstreams[0].endpointsNow()[0]
	var wrong atomic.Int32
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				ex := &exchange{req: outbound{msg: new(fasthttp.Request)}}
				ex.req.msg.SetRequestURI(up.URL + "/v1/models")
				resp := new(fasthttp.Response)
				if err := ep.send(ex, resp, 5*time.Second); err != nil {
					t.Error(err)
					return
				}
				if a, ok := resp.LocalAddr().(*connAddr); !ok || a.conn != ex.upConn {
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
