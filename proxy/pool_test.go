package proxy

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
	"sturdy/policy"
	"sturdy/upstream"
)

// replica is a model server of a pool, for these tests: it counts the
// requests it serves, answers them after delay with status, and its
// /health with health.
type replica struct {
	url    string
	srv    *fasthttp.Server
	served atomic.Int64
	delay  atomic.Int64 // time.Duration
	status atomic.Int64
	health atomic.Int64
	// failModel, when set, is a model this replica answers 500 for.
	failModel atomic.Pointer[string]
}

func startReplica(t *testing.T, addr string, edit ...func(*fasthttp.Server)) *replica {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{url: "http://" + ln.Addr().String()}
	r.status.Store(200)
	r.health.Store(200)
	r.srv = &fasthttp.Server{Handler: r.handle, Logger: upstreamtest.Quiet{}, CloseOnShutdown: true}
	for _, e := range edit {
		e(r.srv)
	}
	go func() { _ = r.srv.Serve(ln) }()
	t.Cleanup(r.stop)
	return r
}

func (r *replica) stop() { _ = r.srv.Shutdown() }

func (r *replica) handle(ctx *fasthttp.RequestCtx) {
	if string(ctx.Path()) == "/health" {
		ctx.SetStatusCode(int(r.health.Load()))
		return
	}
	r.served.Add(1)
	time.Sleep(time.Duration(r.delay.Load()))
	status := int(r.status.Load())
	if m := r.failModel.Load(); m != nil && strings.Contains(string(ctx.PostBody()), `"model":"`+*m+`"`) {
		status = 500
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"id":"x","choices":[]}`)
}

// startPool runs Sturdy over an upstream "up" of the replicas' URLs.
func startPool(t *testing.T, edit func(*upstream.Options), rs ...*replica) *harness {
	t.Helper()
	var urls []string
	for _, r := range rs {
		urls = append(urls, r.url)
	}
	return startProxy(t, "", func(o *Options) {
		u := &o.Upstreams[0]
		u.URL, u.Endpoints = "", urls
		if edit != nil {
			edit(u)
		}
	})
}

// burst sends n requests from workers clients at once and fails the
// test on any that is not a 200.
func (h *harness) burst(n, workers int, header ...string) {
	h.t.Helper()
	var wg sync.WaitGroup
	var next atomic.Int64
	var failed atomic.Int64
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if resp, body := h.chat("", header...); resp.StatusCode != 200 {
					failed.Add(1)
					h.t.Errorf("%d %s", resp.StatusCode, body)
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		h.t.Fatalf("%d of %d requests failed", f, n)
	}
}

// endpoint returns the pool's endpoint for r.
func (h *harness) endpoint(r *replica) *upstream.Endpoint {
	for _, ep := range h.p.tbl.Load().upstreams[0].Endpoints() {
		if "http://"+ep.Addr() == r.url {
			return ep
		}
	}
	h.t.Fatalf("no endpoint for %s", r.url)
	return nil
}

// TestLeastRequestsSendsLessToASlowEndpoint: by requests in flight, a
// replica three times slower than the others gets well under its fair
// share. Not parallel: the load of other tests, adding the same delay to
// every replica, would even out their speeds.
func TestLeastRequestsSendsLessToASlowEndpoint(t *testing.T) {
	fast1, fast2, slow := startReplica(t, ""), startReplica(t, ""), startReplica(t, "")
	fast1.delay.Store(int64(10 * time.Millisecond))
	fast2.delay.Store(int64(10 * time.Millisecond))
	slow.delay.Store(int64(30 * time.Millisecond))
	h := startPool(t, nil, fast1, fast2, slow)
	h.burst(300, 6)
	total := fast1.served.Load() + fast2.served.Load() + slow.served.Load()
	if share := float64(slow.served.Load()) / float64(total); share >= 0.3 {
		t.Fatalf("the slow replica served %.0f%% (fast: %d, %d; slow: %d), its fair share is 33%%", 100*share,
			fast1.served.Load(), fast2.served.Load(), slow.served.Load())
	}
}

// TestRoundRobinTakesTurns: each endpoint in turn.
func TestRoundRobinTakesTurns(t *testing.T) {
	t.Parallel()
	a, b := startReplica(t, ""), startReplica(t, "")
	h := startPool(t, func(u *upstream.Options) { u.Balance = upstream.BalanceRoundRobin }, a, b)
	h.burst(10, 1)
	if a.served.Load() != 5 || b.served.Load() != 5 {
		t.Fatalf("served %d and %d, want 5 each", a.served.Load(), b.served.Load())
	}
}

// TestAffinityIsStickyAndBounded: a session's requests stay on one
// endpoint, sessions spread over the pool, and a burst of one session
// spills over instead of piling above the load bound.
func TestAffinityIsStickyAndBounded(t *testing.T) {
	t.Parallel()
	rs := []*replica{startReplica(t, ""), startReplica(t, ""), startReplica(t, "")}
	h := startPool(t, func(u *upstream.Options) {
		u.Balance, u.Affinity = upstream.BalanceAffinity, upstream.Affinity{Header: "X-Session-Id"}
	}, rs...)
	servedBy := func() map[*replica]int64 {
		m := map[*replica]int64{}
		for _, r := range rs {
			m[r] = r.served.Load()
		}
		return m
	}
	for s := 0; s < 40; s++ { // (2/3)^40: no endpoint is left out by chance
		before := servedBy()
		h.burst(5, 1, "X-Session-Id", fmt.Sprintf("session-%d", s))
		moved := 0
		for _, r := range rs {
			if r.served.Load() != before[r] {
				moved++
			}
		}
		if moved != 1 {
			t.Fatalf("session %d's 5 requests went to %d endpoints", s, moved)
		}
	}
	for _, r := range rs {
		if r.served.Load() == 0 {
			t.Fatalf("40 sessions never reached %s", r.url)
		}
	}
	for _, r := range rs {
		r.delay.Store(int64(100 * time.Millisecond))
	}
	before := servedBy()
	h.burst(6, 6, "X-Session-Id", "busy")
	reached := 0
	for _, r := range rs {
		if r.served.Load() != before[r] {
			reached++
		}
	}
	if reached < 2 {
		t.Fatal("6 requests at once of one session all went to one endpoint, above 1.25x the mean load")
	}
}

// TestAffinityByPrefix keys on the conversation, not the raw body: the
// same conversation sticks whatever the model, another one may move.
func TestAffinityByPrefix(t *testing.T) {
	t.Parallel()
	rs := []*replica{startReplica(t, ""), startReplica(t, ""), startReplica(t, "")}
	h := startPool(t, func(u *upstream.Options) {
		u.Balance, u.Affinity = upstream.BalanceAffinity, upstream.Affinity{Prefix: 64}
	}, rs...)
	conv := `"messages":[{"role":"system","content":"You are a careful agent with a long shared prompt that every turn of this conversation repeats"},{"role":"user","content":"%d"}]`
	spread := map[*replica]bool{}
	for turn := 0; turn < 8; turn++ {
		before := [3]int64{rs[0].served.Load(), rs[1].served.Load(), rs[2].served.Load()}
		// The first 64 bytes are the system prompt: every turn stays.
		if resp, _ := h.chat(fmt.Sprintf(`{"model":"m%d",`+conv+`}`, turn, turn)); resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		for i, r := range rs {
			if r.served.Load() != before[i] {
				spread[r] = true
			}
		}
	}
	if len(spread) != 1 {
		t.Fatalf("one conversation prefix reached %d endpoints", len(spread))
	}
}

// TestDeadEndpointIsEjectedAndRetriedElsewhere: a replica that refuses
// connections costs no client an error — its attempts are retried on
// another — and once its breaker opens it gets none.
func TestDeadEndpointIsEjectedAndRetriedElsewhere(t *testing.T) {
	t.Parallel()
	live := startReplica(t, "")
	dead := &replica{url: "http://" + freePort(t)}
	h := startPool(t, func(u *upstream.Options) {
		u.Breaker = breaker.Settings{ConsecutiveFailures: 2, MinRequests: 1000, OpenFor: time.Minute}
	}, live, dead)
	h.burst(40, 4)
	ep := h.endpoint(dead)
	if ep.Breaker().State() != breaker.StateOpen {
		t.Fatalf("the dead endpoint's breaker is %v", ep.Breaker().State())
	}
	var st upstream.EndpointStatus
	for _, e := range h.p.Upstreams()[0].Endpoints {
		if e.Address == ep.Addr() {
			st = e
		}
	}
	if st.State != "ejected" || st.Ejections != 1 || st.TrippedOn == nil || st.TrippedOn.ConsecutiveFailures != 2 {
		t.Fatalf("/debug/upstreams shows the dead endpoint as %+v (tripped on %+v)", st, st.TrippedOn)
	}
	if live.served.Load() != 40 {
		t.Fatalf("the live replica served %d of 40", live.served.Load())
	}
	// The retries named the endpoint that failed.
	found := false
	for _, line := range h.accessLines(40) {
		if rs, ok := line["retries"].([]any); ok {
			found = found || rs[0].(map[string]any)["endpoint"] == ep.Addr()
			if line["endpoint"] != h.endpoint(live).Addr() {
				t.Fatalf("a retried request ended on %v", line["endpoint"])
			}
		}
	}
	if !found {
		t.Fatal("no access line names the dead endpoint in its retries")
	}
}

// TestMaxEjectedKeepsPartOfThePoolIn: with every replica failing, the
// breakers eject at most max_ejected of the pool (at least one).
func TestMaxEjectedKeepsPartOfThePoolIn(t *testing.T) {
	t.Parallel()
	var dead []*replica
	for i := 0; i < 4; i++ {
		dead = append(dead, &replica{url: "http://" + freePort(t)})
	}
	h := startPool(t, func(u *upstream.Options) {
		u.Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000, OpenFor: time.Minute}
		u.MaxEjected = 0.5
	}, dead...)
	for i := 0; i < 20; i++ {
		h.chat("")
	}
	open := 0
	for _, r := range dead {
		if h.endpoint(r).Breaker().State() == breaker.StateOpen {
			open++
		}
	}
	if open != 2 {
		t.Fatalf("%d of 4 endpoints ejected, max_ejected 50%% allows 2", open)
	}
}

// TestAModelFailingOnOneReplicaDoesNotEjectIt: a model's 5xx on one
// replica opens that replica's breaker for the model only: the model
// goes to the other replica, other models still reach both.
func TestAModelFailingOnOneReplicaDoesNotEjectIt(t *testing.T) {
	t.Parallel()
	a, b := startReplica(t, ""), startReplica(t, "")
	bad := "broken"
	a.failModel.Store(&bad)
	h := startPool(t, func(u *upstream.Options) {
		u.Breaker = breaker.Settings{ConsecutiveFailures: 2, MinRequests: 1000, OpenFor: time.Minute}
	}, a, b)
	for i := 0; i < 20; i++ {
		if resp, body := h.chat(`{"model":"broken","messages":[]}`); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	ep := h.endpoint(a)
	if ep.Breaker().State() != breaker.StateClosed || ep.ModelBreakerState("broken") != "open" {
		t.Fatalf("replica a: connection breaker %v, model breaker %v", ep.Breaker().State(), ep.ModelBreakerState("broken"))
	}
	before := a.served.Load()
	h.burst(40, 4) // requests in flight together: ties between the replicas are few (one of 9 full runs had none reach a with 2)
	if a.served.Load() == before {
		t.Fatal("replica a got no request for the other model")
	}
}

// waitFor polls cond every 10 ms for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
	}
}

// TestHealthCheckEjectsAndRestores: unhealthy failures in a row take an
// endpoint out (no request reaches it), healthy successes bring it back
// — with slow start: at first it gets a small share.
func TestHealthCheckEjectsAndRestores(t *testing.T) {
	t.Parallel()
	a, b := startReplica(t, ""), startReplica(t, "")
	h := startPool(t, func(u *upstream.Options) {
		u.HealthCheck = upstream.HealthCheck{Path: "/health", Every: 50 * time.Millisecond, Timeout: time.Second, Healthy: 2, Unhealthy: 2}
		u.SlowStart = new(10 * time.Second)
	}, a, b)
	ep := h.endpoint(a)
	a.health.Store(503)
	waitFor(t, 2*time.Second, "the unhealthy endpoint is still in", func() bool { return !ep.Healthy() })
	before := a.served.Load()
	h.burst(20, 2)
	if a.served.Load() != before {
		t.Fatalf("an unhealthy endpoint served %d requests", a.served.Load()-before)
	}
	if st := h.p.Upstreams()[0].Endpoints[0]; st.State != "unhealthy" || !strings.HasPrefix(st.Health, "503") {
		t.Fatalf("/debug/upstreams: %+v", st)
	}
	a.health.Store(200)
	waitFor(t, 2*time.Second, "the endpoint stayed out after its health came back", func() bool { return ep.Healthy() })
	before = a.served.Load()
	h.burst(100, 1)
	// At its weight's floor (0.1) its share is about 9 %: 25 is 5 sd off.
	if n := a.served.Load() - before; n > 25 {
		t.Fatalf("just back, with slow start, it served %d of 100 (over a quarter)", n)
	}
}

// TestARetryOnAnotherReplicaDoesNotWait: with a long backoff, a request
// whose first replica fails is retried on another at once.
func TestARetryOnAnotherReplicaDoesNotWait(t *testing.T) {
	t.Parallel()
	failing, live := startReplica(t, ""), startReplica(t, "")
	failing.status.Store(502)
	h := startPool(t, func(u *upstream.Options) { u.Balance = upstream.BalanceRoundRobin }, failing, live)
	h.p.tbl.Load().routes[0].retry.Backoff = policy.Backoff{Base: 5 * time.Second, Max: 5 * time.Second}
	for i := 0; i < 4; i++ {
		start := time.Now()
		if resp, body := h.chat(""); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("the retry on the other replica waited: %v", took)
		}
	}
	if failing.served.Load() == 0 {
		t.Fatal("the failing replica was never tried: the test proves nothing")
	}
}

// TestHealthChecksOutlastAShortKeepAlive: a server whose keep-alive
// timeout is shorter than the health checks' period (vLLM's is 5 s, the
// default period too) does not fail every other probe on a connection it
// closed, so a recovered endpoint comes back.
func TestHealthChecksOutlastAShortKeepAlive(t *testing.T) {
	t.Parallel()
	a := startReplica(t, "", func(s *fasthttp.Server) { s.IdleTimeout = 60 * time.Millisecond })
	b := startReplica(t, "")
	h := startPool(t, func(u *upstream.Options) {
		u.HealthCheck = upstream.HealthCheck{Path: "/health", Every: 150 * time.Millisecond, Timeout: time.Second, Healthy: 3, Unhealthy: 2}
	}, a, b)
	ep := h.endpoint(a)
	a.health.Store(503)
	waitFor(t, 3*time.Second, "the unhealthy endpoint is still in", func() bool { return !ep.Healthy() })
	a.health.Store(200)
	waitFor(t, 3*time.Second, "the endpoint never came back: probes fail on closed keep-alive connections",
		func() bool { return ep.Healthy() })
}

// TestAReloadWithoutHealthChecksBringsAnEndpointBack: an endpoint the
// health checks had out is judged afresh when a reload turns them off.
//
// Not parallel: a health check of the replaced upstream still in flight
// at the reload can take the endpoint out again once it was judged
// afresh, for good (no check runs after). Other tests' load makes the
// probe that overlaps the reload likely.
func TestAReloadWithoutHealthChecksBringsAnEndpointBack(t *testing.T) {
	a, b := startReplica(t, ""), startReplica(t, "")
	var o Options
	h := startProxy(t, "", func(opts *Options) {
		u := &opts.Upstreams[0]
		u.URL, u.Endpoints, u.SlowStart = "", []string{a.url, b.url}, new(time.Duration(0))
		u.HealthCheck = upstream.HealthCheck{Path: "/health", Every: 50 * time.Millisecond, Timeout: time.Second, Healthy: 1, Unhealthy: 1}
		o = *opts
	})
	ep := h.endpoint(a)
	a.health.Store(503)
	waitFor(t, 2*time.Second, "the unhealthy endpoint is still in", func() bool { return !ep.Healthy() })
	o.Upstreams[0].HealthCheck = upstream.HealthCheck{}
	if _, err := h.p.Reload(o); err != nil {
		t.Fatal(err)
	}
	if h.endpoint(a) != ep {
		t.Fatal("the reload did not keep the endpoint")
	}
	h.burst(40, 1)
	if a.served.Load() == 0 {
		t.Fatal("with health checks off, the endpoint they had out stayed out")
	}
}

// TestNoSlowStartSharesAtOnce: slow_start off, a returning endpoint takes
// its share at once.
func TestNoSlowStartSharesAtOnce(t *testing.T) {
	t.Parallel()
	a, b := startReplica(t, ""), startReplica(t, "")
	h := startPool(t, func(u *upstream.Options) { u.SlowStart = new(time.Duration(0)) }, a, b)
	h.endpoint(a).CameBack(time.Now())
	h.burst(40, 1)
	if n := a.served.Load(); n < 10 {
		t.Fatalf("without slow start it served %d of 40", n)
	}
}

// TestDNSDiscoveryAddsAndDrains: endpoints that appear in DNS join,
// those that vanish are drained, a failed resolution keeps the last good
// set — and no request fails meanwhile. The resolver is a hook; the two
// addresses are two loopback addresses on one port.
func TestDNSDiscoveryAddsAndDrains(t *testing.T) {
	t.Parallel()
	v4 := startReplica(t, "")
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(v4.url, "http://"))
	v6 := startReplica(t, "127.0.0.2:"+port) // another loopback address, same port
	var answer atomic.Pointer[[]string]
	set := func(addrs ...string) { answer.Store(&addrs) }
	set("127.0.0.1")
	lookups := atomic.Int64{}
	h := startProxy(t, "", func(o *Options) {
		u := &o.Upstreams[0]
		u.URL = ""
		u.Discover = upstream.Discover{DNS: "models.internal:" + port, Scheme: "http", Every: 50 * time.Millisecond}
		o.LookupHost = func(_ context.Context, host string) ([]string, error) {
			lookups.Add(1)
			if host != "models.internal" {
				return nil, fmt.Errorf("unexpected name %q", host)
			}
			a := *answer.Load()
			if len(a) == 0 {
				return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
			}
			return a, nil
		}
	})
	stop := make(chan struct{})
	var load sync.WaitGroup
	load.Add(1)
	go func() { // requests all along
		defer load.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if resp, body := h.chat(""); resp.StatusCode != 200 {
				t.Errorf("during discovery changes: %d %s", resp.StatusCode, body)
				return
			}
		}
	}()
	pool := func() int { return len(h.p.tbl.Load().upstreams[0].Endpoints()) }
	set("127.0.0.1", "127.0.0.2")
	waitFor(t, 2*time.Second, "the new address never joined", func() bool { return pool() == 2 })
	waitFor(t, 2*time.Second, "the new endpoint got no request", func() bool { return v6.served.Load() > 0 })
	set() // a failed resolution: the last good set stays
	time.Sleep(200 * time.Millisecond)
	if pool() != 2 {
		t.Fatalf("a failed resolution changed the pool to %d", pool())
	}
	set("127.0.0.2")
	waitFor(t, 2*time.Second, "the vanished address was never dropped", func() bool { return pool() == 1 })
	time.Sleep(100 * time.Millisecond)
	n := v4.served.Load()
	time.Sleep(200 * time.Millisecond)
	close(stop)
	load.Wait()
	if v4.served.Load() != n {
		t.Fatal("the dropped address still got requests")
	}
	if h.endpoint(v6).Host() == nil || string(h.endpoint(v6).Host()) != "models.internal:"+port {
		t.Fatal("a discovered endpoint does not send the DNS name as Host")
	}
}

// TestRideThroughWaitsForAnEndpoint: with every endpoint out, a request
// waits for one to come back (ride_through) instead of a 503 at once;
// without it, the 503 is immediate.
func TestRideThroughWaitsForAnEndpoint(t *testing.T) {
	t.Parallel()
	for _, ride := range []time.Duration{0, 3 * time.Second} {
		t.Run(fmt.Sprint("ride_through ", ride), func(t *testing.T) {
			t.Parallel()
			a := startReplica(t, "")
			h := startPool(t, func(u *upstream.Options) {
				u.HealthCheck = upstream.HealthCheck{Path: "/health", Every: 50 * time.Millisecond, Timeout: time.Second, Healthy: 1, Unhealthy: 1}
				u.RideThrough = ride
			}, a)
			ep := h.endpoint(a)
			a.health.Store(503)
			waitFor(t, 2*time.Second, "the endpoint stayed in", func() bool { return !ep.Healthy() })
			go func() {
				time.Sleep(400 * time.Millisecond)
				a.health.Store(200)
			}()
			start := time.Now()
			resp, body := h.chat("")
			took := time.Since(start)
			if ride == 0 {
				if code, _ := errorOf(t, body); resp.StatusCode != 503 || code != CodeCircuitOpen || took > 300*time.Millisecond {
					t.Fatalf("without ride-through: %d %s after %v", resp.StatusCode, body, took)
				}
				return
			}
			if resp.StatusCode != 200 || took < 300*time.Millisecond {
				t.Fatalf("riding through: %d %s after %v", resp.StatusCode, body, took)
			}
			if line := h.accessLines(1)[0]; line["outcome"] != "ok" {
				t.Fatalf("access line %v", line)
			}
		})
	}
}

// TestRideThroughABreakerOutage: a pool of one refusing connections,
// whose breaker opens on the first: the first request of the outage
// rides through it (its probes uncounted) and gets the answer once the
// server is back; one whose ride ends first gets the 502 of its one
// attempt. Before, the first request of an outage got 502 in
// milliseconds: the endpoint went out only on its last failure.
func TestRideThroughABreakerOutage(t *testing.T) {
	t.Parallel()
	addr := freePort(t)
	h := startProxy(t, "http://"+addr, func(o *Options) {
		u := &o.Upstreams[0]
		u.Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000, OpenFor: 300 * time.Millisecond}
		u.RideThrough = 5 * time.Second
		o.Routes[0].Retry.MaxAttempts = 1
	})
	go func() {
		time.Sleep(500 * time.Millisecond)
		startReplica(t, addr)
	}()
	start := time.Now()
	resp, body := h.chat("")
	if resp.StatusCode != 200 || time.Since(start) < 400*time.Millisecond {
		t.Fatalf("after riding through %v: %d %s", time.Since(start), resp.StatusCode, body)
	}
	if line := h.accessLines(1)[0]; line["outcome"] != outcomeOK {
		t.Fatalf("logged %v", line)
	}
}

// TestReloadKeepsEndpointState: a reload that changes the pool keeps the
// endpoints that stay, their breakers included.
func TestReloadKeepsEndpointState(t *testing.T) {
	t.Parallel()
	live := startReplica(t, "")
	dead := &replica{url: "http://" + freePort(t)}
	var o Options
	h := startProxy(t, "", func(opts *Options) {
		u := &opts.Upstreams[0]
		u.URL, u.Endpoints = "", []string{live.url, dead.url}
		u.Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000, OpenFor: time.Minute}
		o = *opts
	})
	h.burst(10, 1)
	before := h.endpoint(dead)
	if before.Breaker().State() != breaker.StateOpen {
		t.Fatal("the dead endpoint was not ejected")
	}
	third := startReplica(t, "")
	o.Upstreams[0].Endpoints = []string{live.url, dead.url, third.url}
	o.Upstreams[0].RideThrough = time.Second
	if _, err := h.p.Reload(o); err != nil {
		t.Fatal(err)
	}
	if after := h.endpoint(dead); after != before || after.Breaker().State() != breaker.StateOpen {
		t.Fatal("the reload lost the dead endpoint's state")
	}
	h.burst(20, 2)
	if third.served.Load() == 0 {
		t.Fatal("the added endpoint got nothing")
	}
}

// TestAModelServerStartedLateIsUsedWithinASecond: Sturdy started before
// its model server opens the breaker on refused connects, and probes
// again after about a second — not open_for — once the server is up.
func TestAModelServerStartedLateIsUsedWithinASecond(t *testing.T) {
	t.Parallel()
	addr := freePort(t)
	h := startProxy(t, "http://"+addr, func(o *Options) {
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 2, MinRequests: 1000, OpenFor: time.Minute}
		o.Routes[0].Retry.MaxAttempts = 1
	})
	for i := 0; i < 3; i++ {
		h.chat("")
	}
	if resp, _ := h.chat(""); resp.StatusCode != 503 {
		t.Fatalf("with nothing listening and the breaker open: %d", resp.StatusCode)
	}
	startReplica(t, addr)
	up := time.Now()
	for {
		resp, _ := h.chat("")
		if resp.StatusCode == 200 {
			break
		}
		if time.Since(up) > 3*time.Second {
			t.Fatalf("the server was up %v and Sturdy still answered %d (open_for is a minute)", time.Since(up), resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAReplicaThatFailsFastDrawsLittleTraffic: a replica answering 502 at
// once looks idle by its in-flight count; its recent failures weigh it
// down, so it gets a small share of the attempts (and every request
// still succeeds on the other), though its breaker never trips.
func TestAReplicaThatFailsFastDrawsLittleTraffic(t *testing.T) {
	t.Parallel()
	failing, live := startReplica(t, ""), startReplica(t, "")
	failing.status.Store(502)
	live.delay.Store(int64(5 * time.Millisecond))
	h := startPool(t, func(u *upstream.Options) {
		u.Breaker = breaker.Settings{ConsecutiveFailures: 1000, MinRequests: 1000}
	}, failing, live)
	h.burst(200, 4)
	f, l := failing.served.Load(), live.served.Load()
	if share := float64(f) / float64(f+l); share > 0.2 {
		t.Fatalf("the failing replica got %.0f%% of the attempts (%d of %d)", 100*share, f, f+l)
	}
	if h.endpoint(failing).Breaker().State() != breaker.StateClosed {
		t.Fatal("the breaker tripped: the test proves nothing about picking")
	}
}
