package proxy

import (
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"

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
	breaker   breaker.Settings // OnStateChange left out
	caFile    string
	insecure  bool
}

// endpoint is one replica of an upstream: its connection pool, its
// connection breaker and reply breakers per model, its connection places
// (max_connections), its load and its health.
type endpoint struct {
	spec endpointSpec
	// addr names the endpoint in logs, metrics and /debug/upstreams.
	addr string
	// spanAddr is server.address and server.port for an attempt's span.
	spanAddr [2]attribute.KeyValue
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
	conns slots

	// claimMu and claimant tell which connection fasthttp gives an
	// attempt: send holds claimMu and names the attempt's exchange; the
	// connection fasthttp then dials or takes from its pool (dial, or
	// LocalAddr when fasthttp reads its addresses) takes the claim and
	// unlocks. Every request on client goes through send.
	claimMu  sync.Mutex
	claimant atomic.Pointer[exchange]

	// owner is the upstream whose pool the endpoint is in now (a reload
	// may move it to a new one); ejected is set while its connection
	// breaker is not closed, counted against max_ejected.
	owner   atomic.Pointer[upstream]
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
func newEndpoint(name string, spec endpointSpec, onState func(*endpoint, breaker.State, breaker.State),
	onModelState func(*endpoint, string, breaker.State, breaker.State), onEvict func()) (*endpoint, error) {
	u, err := url.Parse(spec.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("upstream %q: invalid url %q", name, spec.url)
	}
	ep := &endpoint{spec: spec, addr: u.Host, base: []byte(u.Scheme + "://" + u.Host + strings.TrimSuffix(u.EscapedPath(), "/")),
		conns: make(slots, spec.maxConns)}
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
		ReadBufferSize:            upstreamReadBuffer,
		DisablePathNormalizing:    true,
		NoDefaultUserAgentHeader:  true,
		StreamResponseBody:        true,
		SecureErrorLogMessage:     true,
	}
	host, port := splitHostPort(ep.client.Addr, u.Scheme)
	ep.spanAddr = [2]attribute.KeyValue{attrServerAddr.String(host), attrServerPort.Int(port)}
	return ep, nil
}

// load is the endpoint's requests in flight (streams included).
func (ep *endpoint) load() int { return len(ep.conns) }

// full reports whether every connection place of the endpoint is taken.
func (ep *endpoint) full() bool { return len(ep.conns) == cap(ep.conns) }

// out reports whether the endpoint takes no requests: its connection
// breaker is open, a health check has it out, or DNS dropped it.
func (ep *endpoint) out() bool {
	return ep.breaker.State() == breaker.StateOpen || !ep.healthy.Load() || ep.draining.Load() || ep.hinted()
}

// hinted reports whether another replica's breaker has ep out for now
// (shared_state.share_breakers).
func (ep *endpoint) hinted() bool {
	h := ep.hintedUntil.Load()
	return h != 0 && time.Now().UnixNano() < h
}

// weight is the endpoint's share while it ramps up after coming back
// (slow start): from a tenth to all of it over slowStart.
func (ep *endpoint) weight(now time.Time, slowStart time.Duration) float64 {
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

// public is the endpoint's URL as an error message may show it: scheme,
// host and path prefix, never userinfo.
func (ep *endpoint) public() string {
	if u, err := url.Parse(ep.spec.url); err == nil {
		u.User = nil
		return u.String()
	}
	return ep.addr
}

// failingAlpha is the weight of the latest attempt in failing (about the
// last ten attempts count).
const failingAlpha = 0.1

// outcome moves failing by one attempt's result.
func (ep *endpoint) outcome(failed bool) {
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
func (ep *endpoint) soundness() float64 {
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

// cameBack starts the endpoint's slow start.
func (ep *endpoint) cameBack(now time.Time) { ep.back.Store(now.UnixNano()) }

// countAttempt counts an attempt's result on the endpoint.
func (ep *endpoint) countAttempt(p *Proxy, upstream, result string) {
	c, ok := ep.attempts.Load(result)
	if !ok {
		c, _ = ep.attempts.LoadOrStore(result, p.m.Attempts.WithLabelValues(upstream, ep.addr, result))
	}
	c.(prometheus.Counter).Inc()
}

// send sends ex's request and reads the response head within timeout,
// with the connection it goes on known to ex (so it can be closed if the
// client leaves).
func (ep *endpoint) send(ex *exchange, resp *fasthttp.Response, timeout time.Duration) error {
	ep.claimMu.Lock()
	ep.claimant.Store(ex)
	err := ep.client.DoTimeout(ex.req.msg, resp, timeout)
	if ep.claimant.CompareAndSwap(ex, nil) { // no connection was given
		ep.claimMu.Unlock()
	}
	return err
}

// takeClaim hands the connection being given out to the attempt that
// claimed it, if one waits.
func (ep *endpoint) takeClaim() *exchange {
	ex := ep.claimant.Swap(nil)
	if ex != nil {
		ep.claimMu.Unlock()
	}
	return ex
}

// close lets the endpoint's connections go.
func (ep *endpoint) close() {
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
func (ep *endpoint) resetHealth() {
	ep.healthy.Store(true)
	ep.passes.Store(0)
	ep.fails.Store(0)
	ep.health.Store(nil)
	if c := ep.checker.Swap(nil); c != nil {
		c.client.CloseIdleConnections()
	}
}
