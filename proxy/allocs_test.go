//go:build !race

package proxy

import "testing"

// allocCase is one request shape whose allocations a test holds: at
// most most, with the options edit makes (t given: a Redis to start).
type allocCase struct {
	name   string
	most   int64
	edit   func(t *testing.T) func(*Options)
	stream bool
}

// TestAProxiedRequestAllocatesAtMostTwice holds BenchmarkProxiedRequest's
// figure (client and upstream included): a change that moves per-request
// state to the heap — a value passed by pointer through an interface, a
// closure — fails here instead of only showing in a benchmark. A
// streamed reply (BenchmarkProxiedStream) adds its upstream body's
// reader and chunk decoder; its drain after the terminator took a 4 KiB
// buffer (5, 4376 B). With a fleet: allocs_external_test.go.
// Without -race only (the race detector makes sync.Pool drop items at
// random); .ci/run runs it so.
func TestAProxiedRequestAllocatesAtMostTwice(t *testing.T) {
	holdAllocs(t, []allocCase{
		{"defaults", 2, func(*testing.T) func(*Options) { return nil }, false},
		{"a streamed reply", 4, func(*testing.T) func(*Options) { return nil }, true},
	})
}

// holdAllocs fails t when a case's request allocates more than it may.
func holdAllocs(t *testing.T, cases []allocCase) {
	for _, tt := range cases {
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
