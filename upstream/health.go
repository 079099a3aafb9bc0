package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// background runs the upstream's health checks and DNS discovery until
// the upstream is replaced or Sturdy shuts down.
func (up *Upstream) background() {
	var health, discover <-chan time.Time
	if hc := up.opts.HealthCheck; hc.Path != "" {
		t := time.NewTicker(hc.Every)
		defer t.Stop()
		health = t.C
		up.checkAll() // at once: a dead endpoint need not wait a period
	}
	if d := up.opts.Discover; d.DNS != "" {
		t := time.NewTicker(d.Every)
		defer t.Stop()
		discover = t.C
		up.rediscover()
	}
	for {
		select {
		case <-health:
			up.checkAll()
		case <-discover:
			up.rediscover()
		case <-up.quit:
			return
		case <-up.env.Stopping:
			return
		}
		up.sweepDrained()
	}
}

// checkAll probes every endpoint at once and waits for the results.
func (up *Upstream) checkAll() {
	var wg sync.WaitGroup
	for _, ep := range up.Endpoints() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			up.check(ep)
		}()
	}
	wg.Wait()
}

// check probes ep once with a GET of the health path (never an
// inference call): unhealthy failures in a row take it out, healthy
// successes in a row bring it back (with slow start).
func (up *Upstream) check(ep *Endpoint) {
	hc := up.opts.HealthCheck
	start := time.Now()
	status, err := ep.probe(up, hc)
	ok := err == nil && status >= 200 && status < 300
	result := fmt.Sprintf("%d in %s", status, time.Since(start).Round(time.Millisecond))
	if err != nil {
		result = describeProbeError(err)
	}
	ep.health.Store(&result)
	if ok {
		up.env.Metrics.HealthChecks.WithLabelValues(up.name, "ok").Inc()
		ep.fails.Store(0)
		if n := ep.passes.Add(1); !ep.healthy.Load() && int(n) >= hc.Healthy {
			ep.healthy.Store(true)
			ep.CameBack(time.Now())
			up.env.Log.Info().Str("upstream", up.name).Str("endpoint", ep.addr).Str("health", result).Msg("endpoint healthy again")
			up.Notify()
		}
		return
	}
	up.env.Metrics.HealthChecks.WithLabelValues(up.name, "fail").Inc()
	ep.passes.Store(0)
	if n := ep.fails.Add(1); ep.healthy.Load() && int(n) >= hc.Unhealthy {
		ep.healthy.Store(false)
		up.env.Log.Warn().Str("upstream", up.name).Str("endpoint", ep.addr).Str("health", result).Msg("endpoint unhealthy: out")
		up.Notify()
	}
}

// probe sends one health check GET with its own client (a probe takes
// no connection place and no claim) and returns the status.
func (ep *Endpoint) probe(up *Upstream, hc HealthCheck) (int, error) {
	c := ep.checker.Load()
	if c == nil || c.hc != hc {
		// Read and write timeouts bound a TLS handshake too: a server that
		// accepts and never answers cannot hold the loop.
		c = &checker{hc: hc, client: &fasthttp.HostClient{Addr: ep.client.Addr, IsTLS: ep.tls != nil, TLSConfig: ep.tls,
			Dial:     func(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, hc.Timeout) },
			MaxConns: 1, MaxIdemponentCallAttempts: 1, NoDefaultUserAgentHeader: true, ReadTimeout: hc.Timeout,
			WriteTimeout: hc.Timeout, MaxResponseBodySize: 64 << 10, SecureErrorLogMessage: true}}
		ep.checker.Store(c)
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	scheme := "http://"
	if ep.tls != nil {
		scheme = "https://"
	}
	req.SetRequestURI(scheme + ep.addr + hc.Path)
	if ep.host != nil {
		req.UseHostHeader = true
		req.Header.SetHostBytes(ep.host)
	}
	req.Header.SetUserAgent("Sturdy-HealthCheck")
	// A fresh connection each time: an idle one kept between probes
	// (every ≥ a server's keep-alive timeout, 5 s for vLLM) would often
	// be found closed, and a probe should test connecting anyway.
	req.SetConnectionClose()
	if up.auth != nil {
		req.Header.SetBytesV("Authorization", up.auth) // /v1/models needs the key
	}
	if err := c.client.DoTimeout(req, resp, hc.Timeout); err != nil {
		return 0, err
	}
	return resp.StatusCode(), nil
}

// describeProbeError names a failed probe without quoting anything.
func describeProbeError(err error) string {
	var de *net.OpError
	switch {
	case IsTimeout(err):
		return "timeout"
	case errors.As(err, &de) && de.Op == "dial":
		return "connect failed"
	default:
		return "connection failed"
	}
}

// resolve looks up the discovery name and returns the endpoint URLs it
// names now, sorted. No address is a failure (the last good set stays).
func (up *Upstream) resolve() ([]string, error) {
	d := up.opts.Discover
	host, port, err := net.SplitHostPort(d.DNS)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), up.opts.Timeouts.Connect)
	defer cancel()
	addrs, err := up.env.Lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, errors.New("no addresses")
	}
	var urls []string
	for _, a := range addrs {
		addr := net.JoinHostPort(a, port)
		if up.env.IsSelf(addr) {
			if !up.selfWarned.Swap(true) {
				up.env.Log.Warn().Str("upstream", up.name).Str("dns", d.DNS).Str("address", addr).
					Msg("discovery: an address is Sturdy's own listener; left out of the pool (requests sent there would come back)")
			}
			continue
		}
		urls = append(urls, d.Scheme+"://"+addr)
	}
	if len(urls) == 0 {
		return nil, errors.New("no addresses but Sturdy's own")
	}
	slices.Sort(urls)
	return slices.Compact(urls), nil
}

// rediscover resolves the discovery name again: endpoints that appear
// join with slow start, those that vanish are drained (their requests
// finish) and removed. A failed resolution keeps the last good set.
func (up *Upstream) rediscover() {
	urls, err := up.resolve()
	if err != nil {
		up.env.Log.Warn().Str("upstream", up.name).Str("dns", up.opts.Discover.DNS).Str("error", describeLookup(err)).
			Msg("discovery failed: keeping the last good set")
		return
	}
	old := up.Endpoints()
	pool, err := up.endpoints(urls, old, true)
	if err != nil {
		up.env.Log.Warn().Str("upstream", up.name).Str("error", err.Error()).Msg("discovery: invalid address")
		return
	}
	var added, removed []string
	for _, ep := range pool {
		if !Contains(old, ep) {
			added = append(added, ep.addr)
			up.env.Metrics.BreakerState.WithLabelValues(up.name, ep.addr).Set(0)
		}
	}
	for _, ep := range old {
		if !Contains(pool, ep) {
			ep.draining.Store(true)
			up.drainedMu.Lock()
			up.drained = append(up.drained, ep)
			up.drainedMu.Unlock()
			removed = append(removed, ep.addr)
		}
	}
	if len(added) == 0 && len(removed) == 0 {
		return
	}
	up.pool.Store(&pool)
	up.env.Log.Info().Str("upstream", up.name).Strs("added", added).Strs("removed", removed).
		Int("endpoints", len(pool)).Msg("discovery: pool changed")
	up.Notify()
}

// sweepDrained lets go of the drained endpoints whose requests ended
// (the metric series too, unless the address is back in the pool).
func (up *Upstream) sweepDrained() {
	up.drainedMu.Lock()
	defer up.drainedMu.Unlock()
	kept := up.drained[:0]
	for _, ep := range up.drained {
		if ep.Load() > 0 {
			kept = append(kept, ep)
			continue
		}
		ep.close()
		if !slices.ContainsFunc(up.Endpoints(), func(e *Endpoint) bool { return e.addr == ep.addr }) {
			up.env.Forget(up.name, ep)
		}
	}
	clear(up.drained[len(kept):])
	up.drained = kept
}

// draining returns the endpoints DNS dropped whose requests go on.
func (up *Upstream) draining() []*Endpoint {
	up.drainedMu.Lock()
	defer up.drainedMu.Unlock()
	return slices.Clone(up.drained)
}

// describeLookup names a resolution failure in a line.
func describeLookup(err error) string {
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		if dnsErr.IsNotFound {
			return "not found"
		}
		if dnsErr.IsTimeout {
			return "timeout"
		}
	}
	return strings.TrimSpace(strconv.Quote(err.Error()))
}
