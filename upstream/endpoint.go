package upstream

import (
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"sturdy/breaker"
	"sturdy/policy"
)

// endpointSpec is what an endpoint is built from: two endpoints with the
// same spec are interchangeable, so a reload keeps the one it has (its
// connections, breakers and health).
type endpointSpec struct {
	url string // scheme://host[:port][/prefix]
	// hostName is the DNS name:port a discovered address was found under:
	// the Host header and the name TLS verifies ("": the url's host).
	hostName  string
	connect   time.Duration
	firstByte time.Duration
	idle      time.Duration
	maxConns  int
	queue     time.Duration
	// concurrency is the endpoint's limit (a reload that keeps it keeps
	// the endpoint, and so what an adaptive limit learned).
	concurrency Concurrency
	breaker     breaker.Settings // OnStateChange left out
	caFile      string
	insecure    bool
}

// Endpoint is one replica of an upstream: its connection pool, its
// connection breaker and reply breakers per model, its connection places
// (max_connections), its load and its health.
type Endpoint struct {
	spec endpointSpec
	// addr names the endpoint in logs, metrics and /debug/upstreams.
	addr string
	// server and port are server.address and server.port for an
	// attempt's span.
	server string
	port   int
	env    *Env
	// base is scheme://host[:port][/prefix] without a trailing slash; the
	// client's request URI is appended to it as received.
	base []byte
	// host is the Host header to send instead of base's (discovered
	// endpoints), or nil.
	host []byte
	// id is a stable hash of addr, for affinity.
	id      uint64
	tls     *tls.Config
	client  *fasthttp.HostClient
	breaker *breaker.Breaker
	models  *breaker.Group
	// conns holds a place per open connection (max_connections): an
	// attempt takes one before it is sent and gives it back when its body
	// is closed, so fasthttp never waits for a connection itself. Places
	// in use are the endpoint's load.
	conns Slots
	// conc is its concurrency limit and queue (nil: concurrency off).
	conc *concurrency
	// samples counts the samples that count its leases reported
	// (Lease.Release); lastTTFT is the last one's (nanoseconds).
	samples, lastTTFT atomic.Int64

	// claimMu and claimant tell which connection fasthttp gives an
	// attempt: Send holds claimMu and names the attempt's Hold; the
	// connection fasthttp then dials or takes from its pool (dial, or
	// LocalAddr when fasthttp reads its addresses) takes the claim and
	// unlocks. Every request on client goes through send.
	claimMu  sync.Mutex
	claimant atomic.Pointer[Hold]

	// owner is the upstream whose pool the endpoint is in now (a reload
	// may move it to a new one); ejected is set while its connection
	// breaker is not closed, counted against max_ejected.
	owner   atomic.Pointer[Upstream]
	ejected atomic.Bool
	// hintedUntil is when another replica's breaker expects to probe ep
	// (UnixNano; 0: no hint), for share_breakers.
	hintedUntil atomic.Int64
	// failing is the moving share of its recent attempts that failed
	// (float64 bits): a replica that fails fast looks idle by its load
	// alone, so picks weigh it down by this.
	failing atomic.Uint64

	// healthy is false while an active health check has it out; back is
	// when it last came back (UnixNano, for slow start; 0: never out);
	// draining is set once DNS no longer lists it; ejections counts its
	// breaker opening; health is the last health check's result.
	healthy   atomic.Bool
	back      atomic.Int64
	draining  atomic.Bool
	ejections atomic.Int64
	health    atomic.Pointer[string]
	// checker is the health checks' own client (never send's: a probe
	// takes no connection place and no claim); passes and fails count
	// the results in a row.
	checker       atomic.Pointer[checker]
	passes, fails atomic.Int32

	// attempts holds the endpoint's attempt counters by result.
	attempts sync.Map // result label → prometheus.Counter
}

// newEndpoint builds an endpoint of upstream name from spec; the breaker
// callbacks get the endpoint, onEvict hears of a model breaker dropped to
// make room for another.
func newEndpoint(env *Env, name string, spec endpointSpec, onState func(*Endpoint, breaker.State, breaker.State),
	onModelState func(*Endpoint, string, breaker.State, breaker.State), onEvict func()) (*Endpoint, error) {
	u, err := url.Parse(spec.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("upstream %q: invalid url %q", name, spec.url)
	}
	ep := &Endpoint{spec: spec, addr: u.Host, base: []byte(u.Scheme + "://" + u.Host + strings.TrimSuffix(u.EscapedPath(), "/")),
		conns: make(Slots, spec.maxConns), conc: newConcurrency(spec.concurrency), env: env}
	ep.healthy.Store(true)
	id := policy.NewKeyHash()
	id.WriteString(ep.addr)
	ep.id = uint64(id)
	serverName := u.Hostname()
	if spec.hostName != "" {
		ep.host = []byte(spec.hostName)
		serverName, _, _ = net.SplitHostPort(spec.hostName)
	}
	if u.Scheme == "https" {
		if ep.tls, err = tlsConfig(name, spec.caFile, spec.insecure, serverName); err != nil {
			return nil, err
		}
	}
	bs := spec.breaker
	bs.OnStateChange = func(_ string, from, to breaker.State) { onState(ep, from, to) }
	bs.MayOpen = func() bool { return ep.owner.Load().mayEject(ep) }
	ep.breaker = breaker.New(name, bs)
	ep.models = breaker.NewGroup(name, breaker.GroupSettings{Breaker: spec.breaker,
		OnStateChange: func(model string, from, to breaker.State) { onModelState(ep, model, from, to) },
		OnEvict:       onEvict})
	ep.client = &fasthttp.HostClient{
		Addr:                fasthttp.AddMissingPort(u.Host, ep.tls != nil),
		IsTLS:               ep.tls != nil,
		Dial:                ep.dial,
		Transport:           upstreamTransport{},
		MaxConns:            spec.maxConns,
		MaxConnWaitTimeout:  spec.queue, // conns makes this wait rare: a connection still closing
		MaxIdleConnDuration: maxIdleConnDuration,
		// Sturdy owns every retry: fasthttp's own are off.
		MaxIdemponentCallAttempts: 1,
		RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		ReadBufferSize:            ReadBuffer,
		DisablePathNormalizing:    true,
		NoDefaultUserAgentHeader:  true,
		StreamResponseBody:        true,
		SecureErrorLogMessage:     true,
	}
	ep.server, ep.port = SplitHostPort(ep.client.Addr, u.Scheme)
	return ep, nil
}

// Load is the endpoint's requests in flight (streams included).
func (ep *Endpoint) Load() int { return len(ep.conns) }

// Full reports whether every connection place of the endpoint is taken.
func (ep *Endpoint) Full() bool { return len(ep.conns) == cap(ep.conns) }

// Out reports whether the endpoint takes no requests: its connection
// breaker is open, a health check has it out, or DNS dropped it.
func (ep *Endpoint) Out() bool {
	return ep.breaker.State() == breaker.StateOpen || !ep.healthy.Load() || ep.draining.Load() || ep.hinted()
}

// hinted reports whether another replica's breaker has ep out for now
// (shared_state.share_breakers).
func (ep *Endpoint) hinted() bool {
	h := ep.hintedUntil.Load()
	return h != 0 && time.Now().UnixNano() < h
}

// weight is the endpoint's share while it ramps up after coming back
// (slow start): from a tenth to all of it over slowStart.
func (ep *Endpoint) weight(now time.Time, slowStart time.Duration) float64 {
	back := ep.back.Load()
	if slowStart <= 0 || back == 0 {
		return 1
	}
	since := now.Sub(time.Unix(0, back))
	if since >= slowStart {
		return 1
	}
	return max(0.1, float64(since)/float64(slowStart))
}

// Public is the endpoint's URL as an error message may show it: scheme,
// host and path prefix, never userinfo.
func (ep *Endpoint) Public() string {
	if u, err := url.Parse(ep.spec.url); err == nil {
		u.User = nil
		return u.String()
	}
	return ep.addr
}

// failingAlpha is the weight of the latest attempt in failing (about the
// last ten attempts count).
const failingAlpha = 0.1

// Outcome moves the endpoint's share of failing attempts by one
// attempt's result (failed: retryable).
func (ep *Endpoint) Outcome(failed bool) {
	x := 0.0
	if failed {
		x = 1
	}
	for {
		old := ep.failing.Load()
		f := math.Float64frombits(old)
		if f == 0 && x == 0 {
			return // the common case: nothing failing, nothing to write
		}
		next := f + failingAlpha*(x-f)
		if next < 1e-3 {
			next = 0
		}
		if ep.failing.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// soundness scales ep's share by its recent failures: (1 − failing)^8, at
// least a twentieth so it still gets the requests that show it recovered
// (30 % failing: about a twentieth; 2 %: 0.85).
func (ep *Endpoint) soundness() float64 {
	f := math.Float64frombits(ep.failing.Load())
	if f == 0 {
		return 1
	}
	h := 1 - f
	h *= h // ^2
	h *= h // ^4
	h *= h // ^8
	return max(h, 0.05)
}

// CameBack starts the endpoint's slow start (as a breaker closing or a
// health check passing again does).
func (ep *Endpoint) CameBack(now time.Time) { ep.back.Store(now.UnixNano()) }

// CountAttempt counts an attempt's result on the endpoint of upstream.
func (ep *Endpoint) CountAttempt(upstream, result string) {
	c, ok := ep.attempts.Load(result)
	if !ok {
		c, _ = ep.attempts.LoadOrStore(result, ep.env.Metrics.Attempts.WithLabelValues(upstream, ep.addr, result))
	}
	c.(prometheus.Counter).Inc()
}

// Send sends req and reads the response head within timeout, with the
// connection it goes on given to hold (so it can be closed if the client
// leaves: Hold.Sever).
func (ep *Endpoint) Send(hold *Hold, req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration) error {
	ep.claimMu.Lock()
	ep.claimant.Store(hold)
	err := ep.client.DoTimeout(req, resp, timeout)
	if ep.claimant.CompareAndSwap(hold, nil) { // no connection was given
		ep.claimMu.Unlock()
	}
	return err
}

// takeClaim hands the connection being given out to the attempt that
// claimed it, if one waits.
func (ep *Endpoint) takeClaim() *Hold {
	h := ep.claimant.Swap(nil)
	if h != nil {
		ep.claimMu.Unlock()
	}
	return h
}

// Lease takes a connection place on ep for one attempt, waiting as r
// allows; the Lease holds nothing unless the result is LeaseTaken or
// LeaseWaited.
func (ep *Endpoint) Lease(r LeaseRequest) (Lease, LeaseResult) {
	var l Lease
	res := LeaseTaken
	if c := ep.conc; c != nil {
		start := time.Now()
		r.Priority = min(r.Priority, PriorityBatch)
		var ra time.Duration
		if res, ra = c.acquire(r); res == LeaseTimedOut || res == LeaseCancelled {
			return Lease{by: "concurrency", retryAfter: ra}, res
		}
		l.conc, l.pr, l.taken = true, r.Priority, start
		if res == LeaseWaited {
			l.taken = time.Now()
		}
		r.Wait -= l.taken.Sub(start) // what is left of it for a connection place
	}
	cres := ep.conns.Acquire(r)
	if cres == LeaseTimedOut || cres == LeaseCancelled {
		if l.conc {
			ep.conc.release(l.pr, Sample{}, l.taken, time.Now())
		}
		return Lease{}, cres
	}
	l.ep = ep
	return l, max(res, cres)
}

// Samples returns how many samples that count ep's leases reported, and
// the last one's TTFT.
func (ep *Endpoint) Samples() (n int64, last time.Duration) {
	return ep.samples.Load(), time.Duration(ep.lastTTFT.Load())
}

// close lets the endpoint's connections go.
func (ep *Endpoint) close() {
	ep.client.CloseIdleConnections()
	if c := ep.checker.Load(); c != nil {
		c.client.CloseIdleConnections()
	}
}

// checker is an endpoint's health-check client, built for one setting.
type checker struct {
	hc     HealthCheck
	client *fasthttp.HostClient
}

// resetHealth forgets the health checks' verdict on ep: for a reload
// that turns them off or changes them (a new setting judges afresh).
func (ep *Endpoint) resetHealth() {
	ep.healthy.Store(true)
	ep.passes.Store(0)
	ep.fails.Store(0)
	ep.health.Store(nil)
	if c := ep.checker.Swap(nil); c != nil {
		c.client.CloseIdleConnections()
	}
}

// Addr names the endpoint (host:port) in logs, metrics and
// /debug/upstreams.
func (ep *Endpoint) Addr() string { return ep.addr }

// Base is scheme://host[:port][/prefix] without a trailing slash: the
// client's request URI is appended to it as received.
func (ep *Endpoint) Base() []byte { return ep.base }

// Host is the Host header to send instead of Base's (discovered
// endpoints), or nil.
func (ep *Endpoint) Host() []byte { return ep.host }

// Server is server.address and server.port, for an attempt's span.
func (ep *Endpoint) Server() (string, int) { return ep.server, ep.port }

// Breaker is the endpoint's connection breaker.
func (ep *Endpoint) Breaker() *breaker.Breaker { return ep.breaker }

// Models are the endpoint's reply breakers, one per model.
func (ep *Endpoint) Models() *breaker.Group { return ep.models }

// SplitHostPort splits a Host header or endpoint address; the port is
// the scheme's when none is written.
func SplitHostPort(hostport, scheme string) (string, int) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil { // no port
		host = strings.Trim(hostport, "[]")
	}
	if port, err := strconv.Atoi(p); err == nil {
		return host, port
	}
	if scheme == "https" {
		return host, 443
	}
	return host, 80
}

// Tickets are an attempt's passes from its endpoint's connection breaker
// and from the endpoint's reply breaker of its model.
type Tickets struct{ conn, model breaker.Ticket }

// Allow asks both of ep's breakers for an attempt: the connection breaker
// (connect refused, resets, TLS) and the reply breaker of the model as
// sent (5xx, timeouts), so one failing model neither ejects the endpoint
// for the others nor opens the breaker of a fallback to another model on
// the same upstream. refused names the breaker that said no.
func (ep *Endpoint) Allow(model string) (tk Tickets, refused string) {
	var ok bool
	if tk.conn, ok = ep.breaker.Allow(); !ok {
		return tk, "connection"
	}
	if tk.model, ok = ep.models.Get(model, time.Now()).Allow(); !ok {
		tk.conn.Done(breaker.Excluded)
		return tk, "model"
	}
	return tk, ""
}

// Report reports the attempt's result to both breakers; cause is what a
// breaker it opens says tripped it.
func (tk Tickets) Report(conn, model breaker.Result, cause string) {
	tk.conn.DoneWith(conn, cause)
	tk.model.DoneWith(model, cause)
}

// Healthy reports whether the health checks have the endpoint in (true
// without checks).
func (ep *Endpoint) Healthy() bool { return ep.healthy.Load() }
