//go:build external

package proxy

import (
	"errors"
	"testing"
	"time"

	"sturdy/fleet"
	"sturdy/internal/redistest"
	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// TestAReloadAfterShutdownIsRefused: once Shutdown has closed the
// fleet's connection, a reload that would open another is refused —
// nothing would close it. Before, it connected to Redis and stayed so.
func TestAReloadAfterShutdownIsRefused(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	o := Options{Upstreams: []upstream.Options{testUpstream("up", up.URL)}, Routes: []Route{testRoute("up")}}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	o.SharedState = &SharedState{Config: fleet.Config{URL: r.URL, Prefix: "t:", Timeout: 500 * time.Millisecond}}
	if _, err := p.Reload(o); !errors.Is(err, errShutDown) {
		t.Fatalf("a reload after shutdown: %v, want %v", err, errShutDown)
	}
	if p.fleet.Load() != nil {
		t.Fatal("a fleet connection was opened after shutdown")
	}
}
