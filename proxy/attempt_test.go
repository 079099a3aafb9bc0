package proxy

import (
	"testing"
	"time"

	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// released waits until ep holds no connection place: every lease given
// back, with its sample.
func released(t *testing.T, ep *upstream.Endpoint) {
	t.Helper()
	waitFor(t, 2*time.Second, "a lease is still held", func() bool { return ep.Load() == 0 })
}

// TestAnAttemptReportsItsTimeToFirstToken: an attempt that reached the
// upstream gives its lease back with its time to first token, which
// counts; one that could not connect (nothing was sent) reports a sample
// that does not. (A stale connection's replay: TestStaleKeepAlive…; a
// client that left: TestClientThatLeavesStopsTheUpstream.)
func TestAnAttemptReportsItsTimeToFirstToken(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Delay: 80 * time.Millisecond, Body: "ok"})
	h := startProxy(t, up.URL, nil)
	ep := h.p.tbl.Load().upstreams[0].Endpoints()[0]
	if resp, _ := h.chat(""); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	released(t, ep)
	if n, last := ep.Samples(); n != 1 || last < 80*time.Millisecond || last > 2*time.Second {
		t.Fatalf("%d samples, the last %v: want 1, of the 80 ms the upstream took", n, last)
	}

	dead := startProxy(t, "http://"+freePort(t), func(o *Options) { o.Routes[0].Retry.MaxAttempts = 2 })
	ep = dead.p.tbl.Load().upstreams[0].Endpoints()[0]
	if resp, _ := dead.chat(""); resp.StatusCode != 502 {
		t.Fatalf("nothing listening: status %d", resp.StatusCode)
	}
	released(t, ep)
	if n, _ := ep.Samples(); n != 0 {
		t.Fatalf("attempts that were never sent reported %d samples that count", n)
	}
}
