package proxy

import (
	"time"

	"sturdy/breaker"
	"sturdy/upstream"
)

// status reports the state of every upstream of the table at now (see
// Proxy.Upstreams).
func (t *table) status(now time.Time) []upstream.Status {
	var out []upstream.Status
	for _, up := range t.upstreams {
		out = append(out, up.Status(now))
	}
	return out
}

// unready names the routes of the table that have no target with an
// endpoint that is in (half-open counts as in: probes go through).
func (t *table) unready() (notReady []string) {
	for _, r := range t.routes {
		ready := false
		for _, tg := range r.targets {
			if tg.up.State() != breaker.StateOpen {
				ready = true
				break
			}
		}
		if !ready {
			notReady = append(notReady, r.name)
		}
	}
	return notReady
}

// refreshGauges brings every upstream's per-endpoint gauges up to date
// (upstream.RefreshGauges).
func (t *table) refreshGauges() {
	for _, up := range t.upstreams {
		up.RefreshGauges()
	}
}
