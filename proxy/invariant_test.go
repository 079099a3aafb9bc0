package proxy

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"sturdy/breaker"
	"sturdy/internal/chaos"
	"sturdy/upstream"
)

// The chaos property test: randomised fault schedules (internal/chaos) —
// primaries killed and restarted, resets, stalls, 429 storms with and
// without a wait, 5xx bursts, slow starts, streams cut after their commit
// point — over a pool and its fallback, where one target always stays
// able to answer. It asserts that no client sees a failure, and that the
// upstreams receive no more than the retry budget allows. Every fault is
// chosen from the seed, never the clock, so a failing seed replays:
// STURDY_CHAOS_SEED=<seed>.

const (
	chaosRequests = 300 // client requests per run
	chaosWorkers  = 4   // at once
)

// TestNoRequestFailsWhileATargetCanAnswer is the invariant docs/failures-and-retries.md
// promises under "Giving up", held under a seeded random schedule.
func TestNoRequestFailsWhileATargetCanAnswer(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	if s := os.Getenv("STURDY_CHAOS_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	defer func() {
		if t.Failed() {
			t.Logf("replay with STURDY_CHAOS_SEED=%d go test -run TestNoRequestFailsWhileATargetCanAnswer ./proxy", seed)
		}
	}()
	server := func(name string, schedule chaos.Schedule) *chaos.Server {
		s, err := chaos.Start(name, freePort(t), schedule, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Kill)
		return s
	}
	p1 := server("p1", chaos.Primary(seed, "p1", false))
	p2 := server("p2", chaos.Primary(seed, "p2", false))
	fb := server("fb", chaos.Steady(seed, "fb"))
	st := server("st", chaos.Primary(seed, "st", true))
	cont := server("cont", nil) // continues a cut stream: always answers
	servers := []*chaos.Server{p1, p2, fb, st, cont}

	upstreamOf := func(name string, endpoints ...*chaos.Server) upstream.Options {
		u := testUpstream(name, "")
		for _, e := range endpoints {
			u.Endpoints = append(u.Endpoints, e.URL())
		}
		u.Timeouts.FirstByte, u.Timeouts.Idle = 500*time.Millisecond, time.Second
		u.Breaker = breaker.Settings{OpenFor: time.Second} // the defaults, a short open
		return u
	}
	route := func(name, prefix, up string, fallbacks ...string) Route {
		r := testRoute(up)
		r.Name, r.PathPrefix, r.Deadline = name, prefix, 30*time.Second
		r.Retry.BaseDelay, r.Retry.MaxDelay = 20*time.Millisecond, 100*time.Millisecond
		// A fallback "can answer" within the attempts the route leaves
		// it: chaos.Steady answers within two, so the route leaves two
		// after the primary's max_attempts (the default leaves one).
		r.Retry.MaxTotalAttempts = r.Retry.MaxAttempts + 2*len(fallbacks)
		for _, f := range fallbacks {
			r.Fallbacks = append(r.Fallbacks, Target{Upstream: f})
		}
		return r
	}
	contUp := upstreamOf("cont", cont)
	contUp.Continuation = upstream.ContinuePrefill
	hold := route("hold", "/hold/", "st", "fb")
	hold.StreamHold = StreamHold{Max: 5 * time.Second, Bytes: 64 << 10}
	h := startProxy(t, "", func(o *Options) {
		o.Upstreams = []upstream.Options{upstreamOf("prim", p1, p2), upstreamOf("fb", fb), upstreamOf("st", st), contUp}
		o.Routes = []Route{route("plain", "/", "prim", "fb"), hold, route("cont", "/cont/", "st", "cont")}
		o.Rand = func(n int64) int64 { return int64(chaos.Rand(seed, "jitter", n) * float64(n)) }
		o.Log = zerolog.Nop() // hundreds of access lines: not read here
	})

	// Kills: a window of request indices (from the seed) in which one
	// primary endpoint, or both, is down.
	setDown := func(s *chaos.Server, i int) {
		if err := s.SetDown(chaos.Down(seed, s.Name, i)); err != nil {
			t.Error(err)
		}
	}

	start := time.Now()
	var next atomic.Int64
	var failures sync.Map
	var wg sync.WaitGroup
	for w := 0; w < chaosWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= chaosRequests || time.Since(start) > 60*time.Second {
					return
				}
				setDown(p1, i)
				setDown(p2, i)
				kind := []string{"/v1/chat/completions", "/v1/chat/completions", "/hold/v1/chat/completions", "/cont/v1/chat/completions"}[i%4]
				ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
				why := chaos.Ask(ctx, testClient, h.url+kind, !strings.HasPrefix(kind, "/v1/"), i)
				cancel()
				if why != "" {
					failures.Store(i, kind+": "+why)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	n := 0
	failures.Range(func(k, v any) bool {
		if n++; n <= 10 {
			t.Errorf("request %d failed: %v", k, v)
		}
		return true
	})
	if n > 0 {
		t.Errorf("%d of %d requests failed while a target could answer", n, chaosRequests)
	}

	var upstreamRequests int64
	for _, s := range servers {
		upstreamRequests += s.Requests()
	}
	stale := 0.0
	for _, up := range h.p.tbl.Load().upstreams {
		for _, ep := range up.Endpoints() {
			var m dto.Metric
			_ = h.p.m.Attempts.WithLabelValues(up.Name(), ep.Addr(), "stale").Write(&m)
			stale += m.GetCounter().GetValue()
		}
	}
	// The retry budget's bound, per upstream summed: retries add at most
	// ratio × the first attempts plus min_per_second per second; a stale
	// resend is free of it. Every client request is a first attempt on one
	// target at least, a failover a first attempt on another.
	bound := float64(chaosRequests)*(1+upstream.DefaultBudgetRatio)*2 + upstream.DefaultBudgetPerSecond*elapsed.Seconds()*4 + stale
	t.Logf("seed %d: %d requests in %v, %d upstream requests (%.2f×), %v stale resends, bound %.0f",
		seed, chaosRequests, elapsed.Round(time.Millisecond), upstreamRequests, float64(upstreamRequests)/chaosRequests, stale, bound)
	if float64(upstreamRequests) > bound {
		t.Errorf("amplification past the retry budget: %d upstream requests for %d", upstreamRequests, chaosRequests)
	}
}
