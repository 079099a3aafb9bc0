package proxy

import (
	"time"

	"sturdy/policy"
	"sturdy/upstream"
)

// choose picks the endpoint for attempt a on up and readies it: a
// connection place and both breakers' tickets. An endpoint whose breaker
// refuses (a half-open one with its probe out) is left out and another
// picked. With every endpoint out it rides through the outage when
// configured, else returns what policy says of an open breaker.
func (ex *exchange) choose(up *upstream.Upstream, a *attempt) policy.Action {
	var refusedBuf [upstream.MaxPick]*upstream.Endpoint
	refused := refusedBuf[:0]
	last := ""
	for {
		changed := up.Changes() // before looking: no change is missed
		ask := ex.ask(up, refused)
		ep := up.Pick(&ask)
		if ep == nil {
			if again, act := ex.rideThrough(up, changed); again {
				refused, last = refused[:0], ""
				continue
			} else if act != policy.ActionAttempt {
				return act
			}
			return ex.carry(ex.allOut(up, last))
		}
		if !ex.release(up, ep) {
			return policy.ActionStop
		}
		lease, act := ex.takeConnection(up, ep)
		if act != policy.ActionAttempt {
			return act
		}
		tk, no := ep.Allow(ex.loop.model)
		if no == "" {
			ex.stopRiding() // its place in the queue, and its spread, go once it has its attempt
			ex.loop.rideDraw = 0
			ex.loop.ep = ep
			a.ep, a.lease, a.tk = ep, lease, tk
			return policy.ActionAttempt
		}
		lease.Release(upstream.Sample{}) // not used: its sample does not count
		refused, last = append(refused, ep), no
	}
}

// ask is what up's pick needs of this request (upstream.Ask), in the
// loop's state: the endpoints it failed on, those refused, its
// affinity key when up balances by affinity.
func (ex *exchange) ask(up *upstream.Upstream, refused []*upstream.Endpoint) upstream.Ask {
	lp := &ex.loop
	a := upstream.Ask{Model: lp.model, Tried: lp.tried[:lp.nTried], Refused: refused, Rand: ex.p.rand}
	if up.Options().Balance == upstream.BalanceAffinity && len(up.Endpoints()) > 1 {
		a.Key, a.HasKey = ex.affinityKey(up)
	}
	return a
}

// failedOn remembers that an attempt on ep failed: retries go elsewhere.
func (ex *exchange) failedOn(ep *upstream.Endpoint) {
	lp := &ex.loop
	if lp.nTried < len(lp.tried) && !ex.triedOn(ep) {
		lp.tried[lp.nTried] = ep
		lp.nTried++
	}
}

// triedOn reports whether an attempt of this request on ep failed.
func (ex *exchange) triedOn(ep *upstream.Endpoint) bool {
	return upstream.Contains(ex.loop.tried[:ex.loop.nTried], ep)
}

// affinityKey returns the request's key for BalanceAffinity
// (upstream.AffinityKey), computed once; ok is false when it has none.
func (ex *exchange) affinityKey(up *upstream.Upstream) (key uint64, ok bool) {
	lp := &ex.loop
	if !lp.affKnown {
		a := up.Options().Affinity
		var header []byte
		if a.Header != "" {
			header = ex.ctx.Request.Header.Peek(a.Header)
		}
		lp.affKnown = true
		lp.affKey, lp.hasKey = upstream.AffinityKey(a, header, ex.ctx.Request.Body())
	}
	return lp.affKey, lp.hasKey
}

// allOut asks policy what it means that no endpoint of up can take the
// request (upstream.AllOut says why: breakers, else health checks or
// DNS; refused names the breaker that refused last, if one did). The
// obstacle says what put the soonest endpoint out.
func (ex *exchange) allOut(up *upstream.Upstream, refused string) policy.Decision {
	a := up.AllOut(ex.loop.model, refused)
	o := obstacle{kind: policy.ObstacleUnhealthy, upstream: up.Name(), wait: a.Wait, limit: a.Limit, cause: a.Cause}
	if a.Breaker {
		o.kind = policy.ObstacleBreaker
	}
	return ex.clearWith(o, 0)
}

// rideThrough waits, when the upstream has ride_through, for an endpoint
// to come back: until changed closes (a breaker or a health check
// changed), the soonest probe is due, the ride's end (ride_through within
// the deadline) or an interruption. again says to look again; otherwise
// action is ActionAttempt when the ride is over (or off, or its queue
// full), ActionStop when interrupted.
func (ex *exchange) rideThrough(up *upstream.Upstream, changed <-chan struct{}) (again bool, action policy.Action) {
	lp := &ex.loop
	if up.Options().RideThrough <= 0 {
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
	wait := up.NextChange(lp.model, now, left)
	ex.enter(phaseRideThrough)
	ex.tr.wait(phaseRideThrough, wait, sourceRideThrough)
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
func (ex *exchange) startRide(up *upstream.Upstream) bool {
	lp := &ex.loop
	if !lp.rideUntil.IsZero() {
		return true
	}
	ok, held := up.TakeRider()
	if !ok {
		return false
	}
	if held {
		lp.rider = up
	}
	lp.rideUntil = time.Now().Add(min(up.Options().RideThrough, time.Until(ex.req.deadline)))
	lp.rideDraw = float64(ex.p.rand(1<<20)) / (1 << 20)
	ex.p.m.RideThroughs.WithLabelValues(up.Name()).Inc()
	return true
}

// rideLeft is how long this request may still ride through an outage of
// up: what is left of the ride it began, or the ride it may begin (none
// without ride_through, or with the riders' queue full).
func (ex *exchange) rideLeft(up *upstream.Upstream, now time.Time) time.Duration {
	lp, ride := &ex.loop, up.Options().RideThrough
	switch {
	case ride <= 0:
		return 0
	case !lp.rideUntil.IsZero():
		return max(lp.rideUntil.Sub(now), 0)
	case up.RidersFull():
		return 0
	}
	return max(min(ride, ex.req.deadline.Sub(now)), 0)
}

// release holds a request that rode through an outage back a little
// once an endpoint returns, so the waiting requests reach it spread over
// a tenth of min(slow_start, ride_through) instead of all at once. false
// means it was interrupted.
func (ex *exchange) release(up *upstream.Upstream, ep *upstream.Endpoint) bool {
	lp := &ex.loop
	if lp.rideUntil.IsZero() || lp.rideDraw == 0 {
		return true
	}
	spread := min(up.SlowStart(), up.Options().RideThrough) / 10
	delay := time.Duration(lp.rideDraw * float64(spread))
	return ex.wait(min(delay, time.Until(ex.req.deadline)/2), sourceRideThrough)
}

// stopRiding gives back the ride-through queue place, if one is held.
func (ex *exchange) stopRiding() {
	if up := ex.loop.rider; up != nil {
		up.FreeRider()
		ex.loop.rider = nil
	}
}
