package proxy

import (
	"time"

	"sturdy/breaker"
	"sturdy/upstream"
)

// Upstreams reports the state of every configured upstream, for the
// admin listener's /debug/upstreams (upstream.Status: no secret in it).
func (p *Proxy) Upstreams() []upstream.Status {
	now := time.Now()
	var out []upstream.Status
	for _, up := range p.tbl.Load().upstreams {
		out = append(out, up.Status(now))
	}
	return out
}

// Ready reports whether every route has a target with an endpoint that
// is in (half-open counts as ready: probes go through); notReady names
// the routes that have none. While draining it is false (see Draining).
func (p *Proxy) Ready() (ok bool, notReady []string) {
	if p.Draining() {
		return false, nil
	}
	for _, r := range p.tbl.Load().routes {
		ready := false
		for _, t := range r.targets {
			if t.up.State() != breaker.StateOpen {
				ready = true
				break
			}
		}
		if !ready {
			notReady = append(notReady, r.name)
		}
	}
	return len(notReady) == 0, notReady
}

// RefreshBreakerGauges brings the gauges read on scrape up to date: the
// bytes held for clients, and every upstream's per-endpoint gauges
// (upstream.RefreshGauges).
func (p *Proxy) RefreshBreakerGauges() {
	p.m.BufferedBytes.Set(float64(p.held.used.Load()))
	for _, up := range p.tbl.Load().upstreams {
		up.RefreshGauges()
	}
}
