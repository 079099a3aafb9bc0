//go:build !race

package proxy

import (
	"testing"

	"github.com/valyala/fasthttp"
)

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

// holdAllocs fails t when a case's request allocates more than it may:
// testing.AllocsPerRun over sequential requests, the proxy's and the
// upstream's goroutines counted with the client's.
func holdAllocs(t *testing.T, cases []allocCase) {
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			upLn, body := benchUpstream(t), benchChat
			if tt.stream {
				upLn, body = benchStreamUpstream(t), benchStreamedChat
			}
			client := benchClient(serveInMemory(t, upLn, tt.edit(t)))
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for range 200 { // pools and connections warm, as in a benchmark's later rounds
				benchRoundTrip(t, client, req, resp, body)
			}
			if n := testing.AllocsPerRun(2000, func() { benchRoundTrip(t, client, req, resp, body) }); int64(n) > tt.most {
				t.Fatalf("a proxied request makes %.2f allocations, want at most %d", n, tt.most)
			}
		})
	}
}
