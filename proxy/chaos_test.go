package proxy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"sturdy/internal/upstreamtest"
)

// throughToxiproxy puts an embedded Toxiproxy between Sturdy and upstreamAddr and
// returns it with its listen URL.
func throughToxiproxy(t *testing.T, upstreamAddr string) (*toxiproxy.Proxy, string) {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "upstream", "127.0.0.1:0", upstreamAddr)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p, "http://" + p.Listen
}

func addToxic(t *testing.T, p *toxiproxy.Proxy, kind, stream string, attrs string) {
	t.Helper()
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, kind, kind, stream, attrs)
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		t.Fatal(err)
	}
}

func removeToxic(t *testing.T, p *toxiproxy.Proxy, kind string) {
	t.Helper()
	if err := p.Toxics.RemoveToxic(context.Background(), kind); err != nil {
		t.Fatal(err)
	}
}

// chaosStack is a scripted upstream behind Toxiproxy with one toxic,
// behind Sturdy with chaosEdit's bounds (and edit's, if any).
func chaosStack(t *testing.T, step upstreamtest.Step, kind, stream, attrs string, edit func(*Options)) (*harness, *toxiproxy.Proxy) {
	t.Helper()
	up := upstreamtest.Start(t, step)
	tp, url := throughToxiproxy(t, up.Addr)
	addToxic(t, tp, kind, stream, attrs)
	return startProxy(t, url, func(o *Options) {
		chaosEdit(o)
		if edit != nil {
			edit(o)
		}
	}), tp
}

// chaosEdit gives every chaos test the same, short bounds.
func chaosEdit(o *Options) {
	o.Upstreams[0].Timeouts.FirstByte = 700 * time.Millisecond
	o.Upstreams[0].Timeouts.Idle = 700 * time.Millisecond
	o.Routes[0].Retry.MaxAttempts = 3
}

func TestChaosLatencyWithinBoundsSucceeds(t *testing.T) {
	t.Parallel()
	h, _ := chaosStack(t, upstreamtest.Step{Body: "ok"}, "latency", "downstream", `{"latency":300}`, nil)
	start := time.Now()
	resp, body := h.chat("")
	if el := time.Since(start); resp.StatusCode != 200 || string(body) != "ok" || el < 300*time.Millisecond {
		t.Fatalf("%d %q after %v", resp.StatusCode, body, el)
	}
}

func TestChaosLatencyPastFirstByteIsATimeoutNotAHang(t *testing.T) {
	t.Parallel()
	h, _ := chaosStack(t, upstreamtest.Step{Body: "ok"}, "latency", "downstream", `{"latency":2000}`, nil)
	start := time.Now()
	resp, body := h.chat("")
	// 3 attempts × 700 ms first_byte + backoff: well under 4 s.
	if el := time.Since(start); resp.StatusCode != 504 || el > 4*time.Second {
		t.Fatalf("%d %s after %v", resp.StatusCode, body, el)
	}
}

// TestChaosBandwidthLimitedStreamArrivesIntact is not parallel: the
// toxic holds the stream's first bytes about 650 ms, near first_byte's
// 700 ms, which the load of other tests could make a timeout.
func TestChaosBandwidthLimitedStreamArrivesIntact(t *testing.T) {
	chunks := upstreamtest.SSE(upstreamtest.Words(40, strings.Repeat("y", 500))...)
	h, _ := chaosStack(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: chunks}, "bandwidth", "downstream", `{"rate":40}`, nil)
	resp, body := h.chat(`{"stream":true}`)
	if resp.StatusCode != 200 || string(body) != strings.Join(chunks, "") {
		t.Fatalf("%d, %d bytes of %d", resp.StatusCode, len(body), len(strings.Join(chunks, "")))
	}
}

func TestChaosResetPeerIsRetriedThenReportedClearly(t *testing.T) {
	t.Parallel()
	h, tp := chaosStack(t, upstreamtest.Step{Body: "ok"}, "reset_peer", "upstream", `{"timeout":0}`, nil)
	start := time.Now()
	resp, body := h.chat("")
	code, _ := errorOf(t, body)
	if resp.StatusCode != 502 || code != CodeRetriesExhausted || time.Since(start) > 2*time.Second {
		t.Fatalf("%d %s after %v", resp.StatusCode, body, time.Since(start))
	}
	removeToxic(t, tp, "reset_peer")
	if resp, body := h.chat(""); resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("after the resets stopped: %d %q", resp.StatusCode, body)
	}
}

func TestChaosTimeoutToxicEndsAtFirstByte(t *testing.T) {
	t.Parallel()
	h, _ := chaosStack(t, upstreamtest.Step{Body: "ok"}, "timeout", "downstream", `{"timeout":0}`,
		func(o *Options) { o.Routes[0].Retry.MaxAttempts = 1 })
	start := time.Now()
	resp, body := h.chat("")
	if code, _ := errorOf(t, body); resp.StatusCode != 504 || code != CodeUpstreamTimeout || time.Since(start) > 2*time.Second {
		t.Fatalf("%d %s after %v", resp.StatusCode, body, time.Since(start))
	}
}

func TestChaosSlowCloseDoesNotDelayTheAnswer(t *testing.T) {
	t.Parallel()
	h, _ := chaosStack(t, upstreamtest.Step{Body: "ok"}, "slow_close", "downstream", `{"delay":1500}`, nil)
	for i := 0; i < 3; i++ {
		start := time.Now()
		if resp, body := h.chat(""); resp.StatusCode != 200 || string(body) != "ok" || time.Since(start) > time.Second {
			t.Fatalf("request %d: %d %q after %v", i, resp.StatusCode, body, time.Since(start))
		}
	}
}

func TestChaosLimitDataCutsAStreamWhichNeverLooksComplete(t *testing.T) {
	t.Parallel()
	chunks := upstreamtest.SSE(upstreamtest.Words(50, "token")...)
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: chunks,
		ChunkDelay: 5 * time.Millisecond})
	tp, url := throughToxiproxy(t, up.Addr)
	addToxic(t, tp, "limit_data", "downstream", `{"bytes":1200}`) // headers, then a few events
	h := startProxy(t, url, chaosEdit)
	resp, body := h.chat(`{"stream":true}`)
	s := string(body)
	if resp.StatusCode != 200 || strings.Contains(s, "[DONE]") || !strings.Contains(s, `"code":"stream_interrupted"`) ||
		!strings.HasPrefix(s, chunks[0]) {
		t.Fatalf("%d %q", resp.StatusCode, s)
	}
	// Cut before the first byte: retried, and told clearly when it keeps failing.
	removeToxic(t, tp, "limit_data")
	addToxic(t, tp, "limit_data", "downstream", `{"bytes":60}`)
	resp, body = h.chat(`{"stream":true}`)
	if code, _ := errorOf(t, body); resp.StatusCode != 502 || code != CodeRetriesExhausted {
		t.Fatalf("cut before the first byte: %d %s", resp.StatusCode, body)
	}
}
