//go:build !race

package proxy

import "testing"

// TestAProxiedRequestAllocatesAtMostTwice holds BenchmarkProxiedRequest's
// figure (client and upstream included): a change that moves per-request
// state to the heap — a value passed by pointer through an interface, a
// closure — fails here instead of only showing in a benchmark. Without
// -race only (the race detector makes sync.Pool drop items at random);
// .ci/run runs it so.
func TestAProxiedRequestAllocatesAtMostTwice(t *testing.T) {
	r := testing.Benchmark(func(b *testing.B) { benchProxied(b, nil) })
	if r.N == 0 {
		t.Fatal("the benchmark did not run")
	}
	if n := r.AllocsPerOp(); n > 2 {
		t.Fatalf("a proxied request makes %d allocations, want at most 2 (%s)", n, r.MemString())
	}
}
