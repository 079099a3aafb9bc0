package proxy

import (
	"time"
	"unsafe"

	"github.com/tidwall/gjson"

	"sturdy/breaker"
	"sturdy/policy"
)

// maxPick bounds the endpoints one pick weighs; beyond them a pool's
// candidates come from the heap.
const maxPick = 16

// choose picks the endpoint for the next attempt on up and readies it: a
// connection place and both breakers' tickets. An endpoint whose breaker
// refuses (a half-open one with its probe out) is left out and another
// picked. With every endpoint out it rides through the outage when
// configured, else returns what policy says of an open breaker.
func (ex *exchange) choose(up *upstream) (*endpoint, tickets, policy.Action) {
	var refusedBuf [maxPick]*endpoint
	refused := refusedBuf[:0]
	last := ""
	for {
		changed := up.changes() // before looking: no change is missed
		ep := ex.pick(up, refused)
		if ep == nil {
			if again, a := ex.rideThrough(up, changed); again {
				refused, last = refused[:0], ""
				continue
			} else if a != policy.ActionAttempt {
				return nil, tickets{}, a
			}
			return nil, tickets{}, ex.carry(ex.allOut(up, last))
		}
		if !ex.release(up, ep) {
			return nil, tickets{}, policy.ActionStop
		}
		if a := ex.takeConnection(up, ep); a != policy.ActionAttempt {
			return nil, tickets{}, a
		}
		tk, no := ex.allow(ep)
		if no == "" {
			ex.stopRiding() // its place in the queue, and its spread, go once it has its attempt
			ex.loop.rideDraw = 0
			ex.loop.ep = ep
			return ep, tk, policy.ActionAttempt
		}
		ex.dropPlace()
		refused, last = append(refused, ep), no
	}
}

// pick returns the endpoint of up the balancer chooses among those that
// can take the request (refused left out), nil when none can.
func (ex *exchange) pick(up *upstream, refused []*endpoint) *endpoint {
	pool := up.endpointsNow()
	if len(pool) == 1 { // no choice to make: the common case stays cheap
		if ep := pool[0]; ex.usable(ep) && !contains(refused, ep) {
			return ep
		}
		return nil
	}
	var buf [maxPick]policy.Candidate
	cs := buf[:0]
	now := time.Now()
	for _, ep := range pool {
		c := policy.Candidate{Load: ep.load(), ID: ep.id, Tried: ex.triedOn(ep) || ep.full()}
		if ex.usable(ep) && !contains(refused, ep) {
			c.Weight = ep.weight(now, up.slowStart) * ep.soundness()
		}
		cs = append(cs, c)
	}
	i := -1
	switch up.balance {
	case BalanceRoundRobin:
		i = policy.PickRoundRobin(cs, up.turn.Add(1), ex.p.rand)
	case BalanceAffinity:
		if key, ok := ex.affinityKey(up); ok {
			i = policy.PickAffinity(cs, key)
			break
		}
		fallthrough // no key: by load
	default:
		i = policy.PickLeastRequests(cs, ex.p.rand)
	}
	if i < 0 {
		return nil
	}
	return pool[i]
}

// usable reports whether ep may take this request: it is in (breaker not
// open, healthy, not drained) and its reply breaker of the request's
// model is not open.
func (ex *exchange) usable(ep *endpoint) bool {
	if ep.out() {
		return false
	}
	m := ep.models.Peek(ex.loop.model)
	return m == nil || m.State() != breaker.StateOpen
}

func contains(eps []*endpoint, ep *endpoint) bool {
	for _, e := range eps {
		if e == ep {
			return true
		}
	}
	return false
}

// elsewhere reports whether an endpoint of up this request has not failed
// on can take a retry now.
func (ex *exchange) elsewhere(up *upstream) bool {
	pool := up.endpointsNow()
	if len(pool) < 2 || ex.loop.nTried == 0 {
		return false
	}
	for _, ep := range pool {
		if ex.usable(ep) && !ex.triedOn(ep) && !ep.full() {
			return true
		}
	}
	return false
}

// failedOn remembers that an attempt on ep failed: retries go elsewhere.
func (ex *exchange) failedOn(ep *endpoint) {
	lp := &ex.loop
	if lp.nTried < len(lp.tried) && !ex.triedOn(ep) {
		lp.tried[lp.nTried] = ep
		lp.nTried++
	}
}

// triedOn reports whether an attempt of this request on ep failed.
func (ex *exchange) triedOn(ep *endpoint) bool {
	return contains(ex.loop.tried[:ex.loop.nTried], ep)
}

// affinityKey returns the request's key for BalanceAffinity: the hash of
// the affinity header's value, or of the first affinity.prefix bytes of
// the messages' roles and contents in order (what a prefix cache keys
// on; the raw body starts with "model", which would key on the model
// alone). ok is false when the request has no key.
func (ex *exchange) affinityKey(up *upstream) (key uint64, ok bool) {
	lp := &ex.loop
	if lp.affKnown {
		return lp.affKey, lp.hasKey
	}
	lp.affKnown = true
	h := policy.NewKeyHash()
	if up.affinity.Header != "" {
		v := ex.ctx.Request.Header.Peek(up.affinity.Header)
		if len(v) == 0 {
			return 0, false
		}
		h.Write(v)
	} else if !hashPrefix(&h, ex.ctx.Request.Body(), up.affinity.Prefix) {
		return 0, false
	}
	lp.affKey, lp.hasKey = uint64(h), true
	return lp.affKey, true
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

// allOut asks policy what it means that no endpoint of up can take the
// request: out by their breakers — an open breaker that lets a probe
// through at the soonest in the time returned (a second at least) — or,
// when no breaker has one out, by their health checks (or DNS):
// ObstacleUnhealthy. refused names the breaker that refused last, if one
// did. The obstacle says what put the soonest endpoint out.
func (ex *exchange) allOut(up *upstream, refused string) policy.Decision {
	now := time.Now()
	o := obstacle{kind: policy.ObstacleUnhealthy, upstream: up.name, wait: -1, limit: "connection"}
	pool := up.endpointsNow()
	if len(pool) == 0 {
		o.kind, o.cause = policy.ObstacleBreaker, "the pool has no endpoint (DNS discovery found none)"
	}
	for _, ep := range pool {
		in, w := ep.probeIn(now, ex.loop.model, up)
		if w != "" || ep.hinted() {
			o.kind = policy.ObstacleBreaker
		}
		if o.wait < 0 || in < o.wait {
			o.wait, o.cause = in, ep.outCause(w, ex.loop.model)
			if w != "" {
				o.limit = w
			}
		}
	}
	if refused != "" {
		o.kind, o.limit = policy.ObstacleBreaker, refused
	}
	o.wait = max(o.wait, time.Second)
	return ex.clearWith(o, 0)
}

// outCause says what keeps ep out, for the breaker which (probeIn's): a
// breaker's Cause, the last health check, or DNS having dropped it.
func (ep *endpoint) outCause(which, model string) string {
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

// rideThrough waits, when the upstream has ride_through, for an endpoint
// to come back: until changed closes (a breaker or a health check
// changed), the soonest probe is due, the ride's end (ride_through within
// the deadline) or an interruption. again says to look again; otherwise
// action is ActionAttempt when the ride is over (or off, or its queue
// full), ActionStop when interrupted.
func (ex *exchange) rideThrough(up *upstream, changed <-chan struct{}) (again bool, action policy.Action) {
	lp := &ex.loop
	if up.rideThrough <= 0 {
		return false, policy.ActionAttempt
	}
	now := time.Now()
	if !ex.startRide(up) {
		return false, policy.ActionAttempt // the queue is full: at once
	}
	left := lp.rideUntil.Sub(now)
	if left <= 0 {
		return false, policy.ActionAttempt
	}
	wait := left
	for _, ep := range up.endpointsNow() {
		// 0: its probe is out (or due), and its result wakes us (changed);
		// the bound is a safety net, not a poll.
		if in, _ := ep.probeIn(now, lp.model, up); in == 0 {
			wait = min(wait, time.Second)
		} else if in < wait {
			wait = in
		}
	}
	ex.enter(phaseRideThrough)
	ex.traceWait(wait, sourceRideThrough)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-changed:
	case <-ex.p.stopping:
		return false, ex.interrupted()
	case <-ex.gone():
		return false, ex.interrupted()
	}
	return true, policy.ActionAttempt
}

// startRide begins this target's ride through an outage (ride_through,
// within the deadline) unless it has begun: a place among the riders
// taken, when max_in_flight does not bound them. false: their queue is
// full.
func (ex *exchange) startRide(up *upstream) bool {
	lp := &ex.loop
	if !lp.rideUntil.IsZero() {
		return true
	}
	if up.riders != nil {
		select {
		case up.riders <- struct{}{}:
			lp.rider = up
		default:
			return false
		}
	}
	lp.rideUntil = time.Now().Add(min(up.rideThrough, time.Until(ex.req.deadline)))
	lp.rideDraw = float64(ex.p.rand(1<<20)) / (1 << 20)
	ex.p.m.RideThroughs.WithLabelValues(up.name).Inc()
	return true
}

// rideLeft is how long this request may still ride through an outage of
// up: what is left of the ride it began, or the ride it may begin (none
// without ride_through, or with the riders' queue full).
func (ex *exchange) rideLeft(up *upstream, now time.Time) time.Duration {
	lp := &ex.loop
	switch {
	case up.rideThrough <= 0:
		return 0
	case !lp.rideUntil.IsZero():
		return max(lp.rideUntil.Sub(now), 0)
	case up.riders != nil && len(up.riders) == cap(up.riders):
		return 0
	}
	return max(min(up.rideThrough, ex.req.deadline.Sub(now)), 0)
}

// anyUsable reports whether an endpoint of up can take this request's
// next attempt (usable: in, its model's breaker not open).
func (ex *exchange) anyUsable(up *upstream) bool {
	for _, ep := range up.endpointsNow() {
		if ex.usable(ep) {
			return true
		}
	}
	return false
}

// release holds a request that rode through an outage back a little
// once an endpoint returns, so the waiting requests reach it spread over
// a tenth of min(slow_start, ride_through) instead of all at once. false
// means it was interrupted.
func (ex *exchange) release(up *upstream, ep *endpoint) bool {
	lp := &ex.loop
	if lp.rideUntil.IsZero() || lp.rideDraw == 0 {
		return true
	}
	spread := min(up.slowStart, up.rideThrough) / 10
	delay := time.Duration(lp.rideDraw * float64(spread))
	return ex.wait(min(delay, time.Until(ex.req.deadline)/2), sourceRideThrough)
}

// stopRiding gives back the ride-through queue place, if one is held.
func (ex *exchange) stopRiding() {
	if up := ex.loop.rider; up != nil {
		up.riders.release()
		ex.loop.rider = nil
	}
}

// probeIn returns how long until ep may take a request of model again as
// far as known, and which breaker keeps it out ("" for neither): a
// breaker's probe, the next health check, the next DNS resolution.
func (ep *endpoint) probeIn(now time.Time, model string, up *upstream) (time.Duration, string) {
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

// modelBreakerState is the state of ep's reply breaker of model (closed
// when it has none).
func (ep *endpoint) modelBreakerState(model string) string {
	if m := ep.models.Peek(model); m != nil {
		return m.State().String()
	}
	return breaker.StateClosed.String()
}

// state is the upstream's state as one breaker: open when every endpoint
// is out, else the best of its endpoints' connection breakers.
func (up *upstream) state() breaker.State {
	best := breaker.StateOpen
	for _, ep := range up.endpointsNow() {
		if ep.healthy.Load() && !ep.draining.Load() {
			if s := ep.breaker.State(); s < best {
				best = s
			}
		}
	}
	return best
}
