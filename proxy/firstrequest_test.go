package proxy

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// These tests hold the first request after something broke to the
// invariant docs/failures-and-retries.md promises under "Giving up": when a target of the
// route can answer within the deadline, the client gets that answer.

// maxJitter draws the full-jitter backoff at its bound, so a backoff
// slept before a failover shows in the time a request takes.
func maxJitter(n int64) int64 { return n - 1 }

// TestAKilledPrimaryFailsOverOnTheNextRequest: with the default attempts
// (max_attempts 4, max_total_attempts 4 + fallbacks), a primary killed
// after a warm connection — one endpoint, or a pool of two — is left for
// the fallback by the very next request: the dead keep-alive connection's
// resend takes no attempt, and a target that refused every connection is
// left at once. Before, the stale resend and four connects used all five
// attempts: 502 retries_exhausted, the fallback never tried.
func TestAKilledPrimaryFailsOverOnTheNextRequest(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{1, 2} {
		t.Run(map[int]string{1: "one endpoint", 2: "a pool of two"}[replicas], func(t *testing.T) {
			t.Parallel()
			var rs []*replica
			var urls []string
			for i := 0; i < replicas; i++ {
				r := startReplica(t, freePort(t)) // no other test's server takes its port once it is killed
				rs, urls = append(rs, r), append(urls, r.url)
			}
			fallback := upstreamtest.Start(t, upstreamtest.Step{Body: "from the fallback"})
			h := startProxy(t, "", func(o *Options) {
				o.Upstreams[0].URL, o.Upstreams[0].Endpoints = "", urls
				o.Upstreams[0].Breaker = breaker.Settings{} // the defaults: 5 in a row
				o.Upstreams = append(o.Upstreams, testUpstream("hosted", fallback.URL))
				o.Routes[0].Fallbacks = []Target{{Upstream: "hosted"}}
				o.Routes[0].Retry.MaxTotalAttempts = 0 // the default
				o.Rand = maxJitter
			})
			for i := 0; i < 2*replicas; i++ { // warm connections to every replica
				if resp, _ := h.chat(""); resp.StatusCode != 200 {
					t.Fatalf("warming: %d", resp.StatusCode)
				}
			}
			for _, r := range rs {
				r.stop() // killed: its keep-alive connections close, nothing listens
			}
			start := time.Now()
			resp, body := h.chat("")
			if resp.StatusCode != 200 || string(body) != "from the fallback" {
				t.Fatalf("the first request after the kill: %d %s", resp.StatusCode, body)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("it took %v: backoffs before the failover", d)
			}
		})
	}
}

// TestTheRetryAServerWaitWasHonouredForGoesToThatServer: a 429 with a
// wait on a route with a fallback is waited, then retried on the primary:
// the cooldown the same 429 started (its end moved later by the jitter)
// does not send it to the fallback. Before, the request waited the whole
// wait and then failed over anyway, its wait logged shorter than the gap.
func TestTheRetryAServerWaitWasHonouredForGoesToThatServer(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After-Ms", "300"}}},
		upstreamtest.Step{Body: "from the primary"})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Body: "from the fallback"})
	h := startProxy(t, primary.URL, func(o *Options) {
		withFallbacks(o, []string{fallback.URL})
		o.Rand = maxJitter // the cooldown ends the most it can past the wait: 10 %
	})
	start := time.Now()
	resp, body := h.chat("")
	if resp.StatusCode != 200 || string(body) != "from the primary" || fallback.Count() != 0 {
		t.Fatalf("%d %s, the fallback saw %d", resp.StatusCode, body, fallback.Count())
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 2*time.Second {
		t.Fatalf("took %v, want the 300 ms the server asked for", d)
	}
	r := h.accessLines(1)[0]["retries"].([]any)[0].(map[string]any)
	if r["wait_ms"] != 300.0 {
		t.Fatalf("the retry's wait logged as %v ms", r["wait_ms"])
	}
	// Another request of the same key meets the cooldown (with its
	// jitter) and goes to the fallback: the exemption was the retry's.
	primary.SetScript(upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After-Ms", "300"}}})
	h.chat("")
	if _, body := h.chat(""); string(body) != "from the fallback" {
		t.Fatalf("another request during the cooldown: %s", body)
	}
}

// TestABare429FailsOverWithoutABackoff: a 429 that gives no wait starts a
// cooldown the retry would meet; with a fallback left the request goes
// there at once. Before, a backoff was slept first, then the cooldown
// sent it to the fallback anyway.
func TestABare429FailsOverWithoutABackoff(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, upstreamtest.Step{Status: 429})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Body: "from the fallback"})
	h := startProxy(t, primary.URL, func(o *Options) {
		withFallbacks(o, []string{fallback.URL})
		o.Routes[0].Retry.BaseDelay, o.Routes[0].Retry.MaxDelay = time.Second, time.Second // a backoff slept is a second: far past a loaded machine's noise
		o.Rand = maxJitter
	})
	start := time.Now()
	resp, body := h.chat("")
	if resp.StatusCode != 200 || string(body) != "from the fallback" || primary.Count() != 1 {
		t.Fatalf("%d %s, the primary saw %d", resp.StatusCode, body, primary.Count())
	}
	if d := time.Since(start); d > 300*time.Millisecond {
		t.Fatalf("took %v: the 400 ms backoff was slept before a failover already decided", d)
	}
}

// TestTheFirstRequestOfAnOutageRidesThrough: the only endpoint refuses
// connections (its breaker far from open), ride_through is set, no
// fallback: the request rides through — its probes uncounted — and gets
// the answer once the server is up. Before, it got 502 in milliseconds
// (stale, connect, connect: max_attempts).
func TestTheFirstRequestOfAnOutageRidesThrough(t *testing.T) {
	t.Parallel()
	addr := freePort(t)
	h := startProxy(t, "http://"+addr, func(o *Options) {
		o.Upstreams[0].RideThrough = 4 * time.Second
		o.Routes[0].Retry.MaxAttempts = 3
		o.Routes[0].Retry.BaseDelay, o.Routes[0].Retry.MaxDelay = 50*time.Millisecond, 200*time.Millisecond
	})
	go func() {
		time.Sleep(500 * time.Millisecond)
		startReplica(t, addr)
	}()
	start := time.Now()
	resp, body := h.chat("")
	if resp.StatusCode != 200 || time.Since(start) < 400*time.Millisecond {
		t.Fatalf("after %v: %d %s", time.Since(start), resp.StatusCode, body)
	}
	if line := h.accessLines(1)[0]; line["outcome"] != outcomeOK {
		t.Fatalf("logged %v", line)
	}
}

// TestAFailedProbeFailsOverWithoutABackoff: a half-open breaker's probe
// fails, the breaker opens again and the target is out: the request goes
// to the fallback at once. Before, a retry backoff was slept first.
func TestAFailedProbeFailsOverWithoutABackoff(t *testing.T) {
	t.Parallel()
	primary := startReplica(t, "")
	primary.status.Store(500)
	fallback := upstreamtest.Start(t, upstreamtest.Step{Body: "from the fallback"})
	h := startProxy(t, primary.url, func(o *Options) {
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000, OpenFor: 200 * time.Millisecond}
		withFallbacks(o, []string{fallback.URL})
		o.Routes[0].Retry.BaseDelay, o.Routes[0].Retry.MaxDelay = time.Second, time.Second // a backoff slept is a second: far past a loaded machine's noise
		o.Rand = maxJitter
	})
	h.chat("") // the 500 opens the model's reply breaker: the request fails over
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	resp, body := h.chat("") // the probe: 500 again
	if resp.StatusCode != 200 || string(body) != "from the fallback" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if d := time.Since(start); d > 600*time.Millisecond {
		t.Fatalf("took %v: a backoff was slept after the failed probe", d)
	}
	if n := primary.served.Load(); n != 2 {
		t.Fatalf("the primary saw %d requests, want 2 (the first and the probe)", n)
	}
}

// TestAClientThatLeavesAfterDONEHasItsAnswer: a client that reads a
// stream to its [DONE] and closes before the upstream's last chunk is
// logged as delivered — 200, outcome ok, no rescue refused, no client
// gone. Before, it was logged rescue_refused: unsafe and counted gone.
func TestAClientThatLeavesAfterDONEHasItsAnswer(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	defer close(gate)
	primary := upstreamtest.Server{URL: gatedStream(t, "text/event-stream", upstreamtest.SSE("Hel", "lo"), gate)}
	fallback := upstreamtest.Start(t, continuationOf(" wor", "ld"))
	h := startRescue(t, &primary, fallback, upstream.ContinuePrefill, nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(streamChat), streamChat)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got []byte
	buf := make([]byte, 4096)
	for !strings.Contains(string(got), "data: [DONE]") {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("before [DONE]: %v (%q)", err, got)
		}
		got = append(got, buf[:n]...)
	}
	conn.Close() // the upstream has not ended its body yet
	line := h.accessLines(1)[0]
	if line["status"] != 200.0 || line["outcome"] != outcomeOK || line["rescue_refused"] != nil || line["phase"] != nil {
		t.Fatalf("logged %v", line)
	}
	var m dto.Metric
	_ = h.p.m.ClientGone.WithLabelValues("stream").Write(&m)
	if m.GetCounter().GetValue() != 0 || fallback.Count() != 0 {
		t.Fatalf("counted gone %v, continuations %d", m.GetCounter().GetValue(), fallback.Count())
	}
}

// TestCircuitOpenNamesWhatOpenedTheBreaker: a 503 circuit_open body and
// its access line say what put the target out — the counts that tripped
// its breaker and the last failure, or its health check — and
// /debug/upstreams keeps those counts while the breaker is open. An
// endpoint out by its health check is "unhealthy" in the log and the
// skips metric, not breaker_open. Before, circuit_open named no cause and
// /debug/upstreams showed "failures": 0 for an open breaker.
func TestCircuitOpenNamesWhatOpenedTheBreaker(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, says, result string
		setup              func(t *testing.T, r *replica, o *upstream.Options)
	}{
		{"5xx replies", "3 consecutive failures, the last: 500", "breaker_open", func(t *testing.T, r *replica, o *upstream.Options) {
			r.status.Store(500)
		}},
		{"refused connections", "3 consecutive failures, the last: connection refused", "breaker_open", nil},
		{"a health check", "health check: 503", "unhealthy", func(t *testing.T, r *replica, o *upstream.Options) {
			o.HealthCheck = upstream.HealthCheck{Path: "/health", Every: 20 * time.Millisecond, Timeout: time.Second, Healthy: 1, Unhealthy: 1}
			r.health.Store(503)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := startReplica(t, freePort(t)) // no other test's server takes its port once it is stopped
			h := startProxy(t, r.url, func(o *Options) {
				o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 3, MinRequests: 1000, OpenFor: time.Minute}
				o.Routes[0].Retry.MaxAttempts = 1
				if tt.setup != nil {
					tt.setup(t, r, &o.Upstreams[0])
				}
			})
			if tt.setup == nil { // nothing listens from now on
				h.chat("")
				r.stop()
			}
			var resp *http.Response
			var body []byte
			for i := 0; i < 10; i++ {
				if resp, body = h.chat(""); resp.StatusCode == 503 {
					break
				}
				time.Sleep(30 * time.Millisecond)
			}
			if code, _ := errorOf(t, body); resp.StatusCode != 503 || code != CodeCircuitOpen || !strings.Contains(string(body), tt.says) {
				t.Fatalf("%d %s, want circuit_open saying %q", resp.StatusCode, body, tt.says)
			}
			lines := h.accessLines(1)
			line := lines[len(lines)-1]
			target := line["targets"].([]any)[0].(map[string]any)
			if cause, _ := line["cause"].(string); !strings.Contains(cause, tt.says) || target["result"] != tt.result {
				t.Fatalf("logged cause %q, target %v", line["cause"], target)
			}
			var m dto.Metric
			_ = h.p.m.TargetSkips.WithLabelValues("up", tt.result).Write(&m)
			if m.GetCounter().GetValue() == 0 {
				t.Fatalf("sturdy_target_skips_total{reason=%q} not counted", tt.result)
			}
			if tt.result != "breaker_open" {
				return
			}
			st := h.p.Upstreams()[0]
			tripped := st.Endpoints[0].TrippedOn
			if len(st.ModelBreakers) > 0 && st.ModelBreakers[0].State == "open" {
				tripped = st.ModelBreakers[0].TrippedOn
			}
			if tripped == nil || tripped.ConsecutiveFailures != 3 {
				t.Fatalf("/debug/upstreams does not keep what tripped it: %+v", st)
			}
		})
	}
}

// TestTheModelBreakerThatOpensIsVisible: sturdy_model_breaker_state shows
// a model's reply breaker per endpoint — a model the config names by its
// name, the rest as "other", worst first.
func TestTheModelBreakerThatOpensIsVisible(t *testing.T) {
	t.Parallel()
	r := startReplica(t, "")
	r.status.Store(500)
	h := startProxy(t, r.url, func(o *Options) {
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000, OpenFor: time.Minute}
		o.Routes[0].Retry.MaxAttempts = 1
		o.Routes[0].Model = "gpt-*"
	})
	h.chat(`{"model":"gpt-4o","messages":[]}`)
	r.status.Store(200)
	h.chat(`{"model":"gpt-mini","messages":[]}`)
	h.p.RefreshBreakerGauges()
	ep := h.p.tbl.Load().upstreams[0].Endpoints()[0].Addr()
	var m dto.Metric
	if err := h.p.m.ModelBreakerState.WithLabelValues("up", ep, "gpt-*").Write(&m); err != nil || m.GetGauge().GetValue() != 2 {
		t.Fatalf("the route's model glob: %v (%v), want 2 (open: the worst of its models)", m.GetGauge().GetValue(), err)
	}
}
