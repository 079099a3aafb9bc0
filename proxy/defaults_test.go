package proxy

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"sturdy/internal/upstreamtest"
	"sturdy/listener"
	"sturdy/policy"
	"sturdy/upstream"
)

// TestZeroOptionsMeanTheDefaults: an upstream and a route with nothing
// but their names get every default — a zero timeout, deadline or body
// limit never means "at once" or "nothing".
func TestZeroOptionsMeanTheDefaults(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Delay: 100 * time.Millisecond, Body: "ok"})
	p, err := New(Options{Upstreams: []upstream.Options{{Name: "up", URL: up.URL}}, Routes: []Route{{Name: "r", Upstream: "up"}},
		Clients: []ClientLimit{{RequestsPerSecond: 2.5}}, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	tbl := p.tbl.Load()
	u, r, cl := tbl.upstreams[0], tbl.routes[0], tbl.clients[0]
	// What an upstream builds from its defaults: upstream's TestAnUpstreamOfDefaultsUsesThem.
	if want := (upstream.Options{Name: "up", URL: up.URL}).WithDefaults(); !reflect.DeepEqual(*u.Options(), want) {
		t.Errorf("upstream defaults: %+v", *u.Options())
	}
	if r.deadline != DefaultDeadline || r.maxBody != DefaultMaxBody || r.clientRetries != DefaultClientRetries ||
		r.retry != (policy.Retry{}).WithDefaults(0) || r.firstToken != 0 || tbl.maxBody != DefaultMaxBody ||
		r.maxRescueBytes != DefaultMaxRescueBytes {
		t.Errorf("route defaults: %+v", r)
	}
	if cl.opts.KeyHeader != DefaultKeyHeader || cl.opts.Burst != 3 || string(cl.header) != "Authorization" {
		t.Errorf("client limit defaults: %+v", cl.opts)
	}
	if p.limits != (ServerLimits{ReadTimeout: DefaultReadTimeout, IdleTimeout: DefaultServerIdle, MaxHeaderBytes: DefaultMaxHeaderBytes,
		MaxConnections: defaultMaxConnections(listener.OpenFileLimit()), WriteTimeout: DefaultWriteTimeout,
		MaxBufferedBytes: DefaultMaxBufferedBytes, MaxRequestBytes: DefaultMaxRequestBytes, ReduceMemoryAbove: DefaultReduceMemoryAbove}) ||
		p.held.max.Load() != DefaultMaxBufferedBytes || p.bodies.max.Load() != DefaultMaxRequestBytes {
		t.Errorf("server limits: %+v", p.limits)
	}
	h := &harness{t: t, p: p, url: serve(t, p), logs: &upstreamtest.LogBuffer{}}
	if resp, body := h.chat(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 100_000) + `"}]}`); resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("a request through zero-valued options: %d %q", resp.StatusCode, body)
	}
}
