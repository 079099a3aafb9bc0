//go:build !race

package proxy

import (
	"testing"
	"time"

	"sturdy/fleet"
	"sturdy/internal/redistest"
	"sturdy/upstream"
)

// TestAProxiedRequestAllocatesAtMostTwice holds BenchmarkProxiedRequest's
// figure (client and upstream included): a change that moves per-request
// state to the heap — a value passed by pointer through an interface, a
// closure — fails here instead of only showing in a benchmark. It holds
// with a fleet-wide pace spent from a lease too (its name was once
// concatenated per request: 3); a leased client limit adds its name, the
// credential's hash in hex (it was formatted: 8). A streamed reply
// (BenchmarkProxiedStream) adds its upstream body's reader and chunk
// decoder; its drain after the terminator took a 4 KiB buffer (5, 4376 B).
// Without -race only (the race detector makes sync.Pool drop items at
// random); .ci/run runs it so.
func TestAProxiedRequestAllocatesAtMostTwice(t *testing.T) {
	for _, tt := range []struct {
		name   string
		most   int64
		edit   func(t *testing.T) func(*Options)
		stream bool
	}{
		{"defaults", 2, func(*testing.T) func(*Options) { return nil }, false},
		{"a leased fleet pace", 2, func(t *testing.T) func(*Options) {
			r := redistest.Start(t)
			return func(o *Options) {
				o.SharedState = &SharedState{Config: fleet.Config{URL: r.URL, Prefix: "t:", Timeout: 500 * time.Millisecond}}
				o.Upstreams[0].RateLimit = upstream.RateLimit{RequestsPerSecond: 1e6, Burst: 1e5, MaxWait: time.Second}
			}
		}, false},
		{"a leased client limit", 3, func(t *testing.T) func(*Options) {
			r := redistest.Start(t)
			return func(o *Options) {
				o.SharedState = &SharedState{Config: fleet.Config{URL: r.URL, Prefix: "t:", Timeout: 500 * time.Millisecond}}
				o.Clients = []ClientLimit{{KeyHeader: "Authorization", RequestsPerSecond: 1e6, Burst: 1e5}}
			}
		}, false},
		{"a streamed reply", 4, func(*testing.T) func(*Options) { return nil }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			edit := tt.edit(t)
			r := testing.Benchmark(func(b *testing.B) {
				if tt.stream {
					benchProxiedFrom(b, benchStreamUpstream(b), benchStreamedChat, edit)
					return
				}
				benchProxied(b, edit)
			})
			if r.N == 0 {
				t.Fatal("the benchmark did not run")
			}
			if n := r.AllocsPerOp(); n > tt.most {
				t.Fatalf("a proxied request makes %d allocations, want at most %d (%s)", n, tt.most, r.MemString())
			}
		})
	}
}
