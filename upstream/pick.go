package upstream

import (
	"time"
	"unsafe"

	"github.com/tidwall/gjson"

	"sturdy/breaker"
	"sturdy/policy"
)

// MaxPick bounds the endpoints one pick weighs; beyond them a pool's
// candidates (and a caller's list of refused ones) come from the heap.
const MaxPick = 16

// Ask is what a pick knows of the request: the model as sent (its reply
// breaker), the endpoints it failed on (weighed as tried), those to leave
// out (a breaker refused them), its affinity key (for BalanceAffinity;
// HasKey false: none, picked by load) and the source of randomness.
type Ask struct {
	Model   string
	Tried   []*Endpoint
	Refused []*Endpoint
	Key     uint64
	HasKey  bool
	Rand    func(n int64) int64
}

// Pick returns the endpoint the balancer chooses among those that can
// take the request (a.Refused left out), nil when none can.
func (up *Upstream) Pick(a *Ask) *Endpoint {
	pool := up.Endpoints()
	if len(pool) == 1 { // no choice to make: the common case stays cheap
		if ep := pool[0]; ep.Usable(a.Model) && !Contains(a.Refused, ep) {
			return ep
		}
		return nil
	}
	var buf [MaxPick]policy.Candidate
	var shedBuf [MaxPick]bool
	cs, shed := buf[:0], shedBuf[:0]
	room := false // an endpoint that can take it would not shed it
	now := time.Now()
	for _, ep := range pool {
		c, shedding := policy.Candidate{Load: ep.Load(), ID: ep.id, Tried: Contains(a.Tried, ep) || ep.Full()}, false
		if ep.Usable(a.Model) && !Contains(a.Refused, ep) {
			c.Weight = ep.weight(now, up.slowStart) * ep.soundness()
		}
		if cc := ep.conc; cc != nil {
			shedding = up.weighRoom(&c, cc)
		}
		room = room || c.Weight > 0 && !shedding
		cs, shed = append(cs, c), append(shed, shedding)
	}
	for i := range cs {
		if shed[i] && room {
			cs[i].Weight = 0
		}
	}
	i := -1
	switch {
	case up.balance == BalanceRoundRobin:
		i = policy.PickRoundRobin(cs, up.turn.Add(1), a.Rand)
	case up.balance == BalanceAffinity && a.HasKey:
		i = policy.PickAffinity(cs, a.Key)
	default: // by load (affinity without a key too)
		i = policy.PickLeastRequests(cs, a.Rand)
	}
	if i < 0 {
		return nil
	}
	return pool[i]
}

// weighRoom weighs c by its endpoint's concurrency (cc): by least
// requests a pool balances by headroom (in flight ÷ limit), and by either
// it or round robin one with a free place comes before one where the
// request would queue (affinity queues where its cache is). It reports
// whether cc's queue is full — a request there would be shed: Pick
// leaves it out while another can take the request.
func (up *Upstream) weighRoom(c *policy.Candidate, cc *concurrency) (shedding bool) {
	limit, full, shedding := cc.room()
	switch up.balance {
	case BalanceLeastRequests:
		c.Weight *= float64(limit)
		c.Tried = c.Tried || full
	case BalanceRoundRobin:
		c.Tried = c.Tried || full
	}
	return shedding
}

// Usable reports whether ep may take a request of model: it is in
// (breaker not open, healthy, not drained) and its reply breaker of the
// model is not open.
func (ep *Endpoint) Usable(model string) bool {
	if ep.Out() {
		return false
	}
	m := ep.models.Peek(model)
	return m == nil || m.State() != breaker.StateOpen
}

// Contains reports whether ep is one of eps.
func Contains(eps []*Endpoint, ep *Endpoint) bool {
	for _, e := range eps {
		if e == ep {
			return true
		}
	}
	return false
}

// Elsewhere reports whether an endpoint of up a request of model has not
// failed on (tried) can take a retry now.
func (up *Upstream) Elsewhere(model string, tried []*Endpoint) bool {
	pool := up.Endpoints()
	if len(pool) < 2 || len(tried) == 0 {
		return false
	}
	for _, ep := range pool {
		if ep.Usable(model) && !Contains(tried, ep) && !ep.Full() {
			return true
		}
	}
	return false
}

// AnyUsable reports whether an endpoint of up can take a request of
// model (Usable: in, its model's breaker not open).
func (up *Upstream) AnyUsable(model string) bool {
	for _, ep := range up.Endpoints() {
		if ep.Usable(model) {
			return true
		}
	}
	return false
}

// AffinityKey returns a request's key for BalanceAffinity under a: the
// hash of the affinity header's value (header, as the request has it),
// or of the first a.Prefix bytes of the body's messages' roles and
// contents in order (what a prefix cache keys on; the raw body starts
// with "model", which would key on the model alone). ok is false when
// the request has no key.
func AffinityKey(a Affinity, header, body []byte) (key uint64, ok bool) {
	h := policy.NewKeyHash()
	if a.Header != "" {
		if len(header) == 0 {
			return 0, false
		}
		h.Write(header)
	} else if !hashPrefix(&h, body, a.Prefix) {
		return 0, false
	}
	return uint64(h), true
}

// hashPrefix writes the first n bytes of a body's conversation to h: the
// role and content of each message of "messages" (chat), "input" (the
// Responses API, a string or items) or "prompt" (completions), in order.
// It reports whether the body had one.
func hashPrefix(h *policy.KeyHash, body []byte, n int) bool {
	doc := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body)))
	conv := doc.Get("messages")
	if !conv.Exists() {
		conv = doc.Get("input")
	}
	if !conv.Exists() {
		conv = doc.Get("prompt")
	}
	if !conv.Exists() {
		return false
	}
	left := n
	write := func(s string) {
		if left <= 0 {
			return
		}
		s = s[:min(len(s), left)]
		h.WriteString(s)
		left -= len(s)
		h.Write([]byte{0})
	}
	if conv.Type == gjson.String {
		write(conv.Str)
		return true
	}
	conv.ForEach(func(_, m gjson.Result) bool {
		if m.Type == gjson.String {
			write(m.Str)
		} else {
			write(m.Get("role").Str)
			c := m.Get("content")
			if c.Type == gjson.String {
				write(c.Str)
			} else {
				write(c.Raw)
			}
		}
		return left > 0
	})
	return true
}

// AllOut is why no endpoint of an upstream can take a request: out by
// their breakers (Breaker set: an open breaker lets a probe through at
// the soonest in Wait; Limit names it, "connection" or "model"), or, when
// no breaker has one out, by their health checks (or DNS). Cause says
// what put the soonest endpoint out.
type AllOut struct {
	Breaker bool
	Wait    time.Duration
	Limit   string
	Cause   string
}

// AllOut says why no endpoint of up can take a request of model now;
// refused names the breaker that refused last, if one did. Wait is a
// second at least.
func (up *Upstream) AllOut(model, refused string) AllOut {
	now := time.Now()
	o := AllOut{Wait: -1, Limit: "connection"}
	pool := up.Endpoints()
	if len(pool) == 0 {
		o.Breaker, o.Cause = true, "the pool has no endpoint (DNS discovery found none)"
	}
	for _, ep := range pool {
		in, w := ep.probeIn(now, model, up)
		if w != "" || ep.hinted() {
			o.Breaker = true
		}
		if o.Wait < 0 || in < o.Wait {
			o.Wait, o.Cause = in, ep.outCause(w, model)
			if w != "" {
				o.Limit = w
			}
		}
	}
	if refused != "" {
		o.Breaker, o.Limit = true, refused
	}
	o.Wait = max(o.Wait, time.Second)
	return o
}

// NextChange bounds a wait of at most wait for an endpoint of up to take
// a request of model again: the soonest probe, next health check or DNS
// resolution due — a second at most while a probe is out (its result
// wakes the waiter through Changes; the bound is a safety net, not a
// poll).
func (up *Upstream) NextChange(model string, now time.Time, wait time.Duration) time.Duration {
	for _, ep := range up.Endpoints() {
		if in, _ := ep.probeIn(now, model, up); in == 0 {
			wait = min(wait, time.Second)
		} else if in < wait {
			wait = in
		}
	}
	return wait
}

// outCause says what keeps ep out, for the breaker which (probeIn's): a
// breaker's Cause, the last health check, or DNS having dropped it.
func (ep *Endpoint) outCause(which, model string) string {
	switch {
	case which == "connection":
		return ep.breaker.Cause()
	case which == "model":
		if m := ep.models.Peek(model); m != nil {
			return m.Cause()
		}
	case ep.draining.Load():
		return "dropped by DNS discovery"
	case !ep.healthy.Load():
		if h := ep.health.Load(); h != nil {
			return "health check: " + *h
		}
		return "health check failing"
	case ep.hinted():
		return "another replica's breaker has it out (share_breakers)"
	}
	return ""
}

// probeIn returns how long until ep may take a request of model again as
// far as known, and which breaker keeps it out ("" for neither): a
// breaker's probe, the next health check, the next DNS resolution.
func (ep *Endpoint) probeIn(now time.Time, model string, up *Upstream) (time.Duration, string) {
	switch {
	case ep.breaker.State() == breaker.StateOpen:
		return ep.breaker.ProbeIn(now), "connection"
	case !ep.healthy.Load():
		return up.opts.HealthCheck.Every, ""
	case ep.draining.Load():
		return up.opts.Discover.Every, ""
	}
	if m := ep.models.Peek(model); m != nil && m.State() == breaker.StateOpen {
		return m.ProbeIn(now), "model"
	}
	return 0, ""
}

// ModelBreakerState is the state of ep's reply breaker of model (closed
// when it has none).
func (ep *Endpoint) ModelBreakerState(model string) string {
	if m := ep.models.Peek(model); m != nil {
		return m.State().String()
	}
	return breaker.StateClosed.String()
}

// State is the upstream's state as one breaker: open when every endpoint
// is out, else the best of its endpoints' connection breakers.
func (up *Upstream) State() breaker.State {
	best := breaker.StateOpen
	for _, ep := range up.Endpoints() {
		if ep.healthy.Load() && !ep.draining.Load() {
			if s := ep.breaker.State(); s < best {
				best = s
			}
		}
	}
	return best
}
