package proxy

import (
	"time"

	"sturdy/policy"
	"sturdy/upstream"
)

// choose picks the endpoint for attempt a on v's target and readies it: a
// connection place and both breakers' tickets. An endpoint whose breaker
// refuses (a half-open one with its probe out) is left out and another
// picked. With every endpoint out it rides through the outage when
// configured, else returns what policy says of an open breaker.
func (v *visit) choose(a *attempt) policy.Action {
	ex := v.ex
	up := v.t.up
	var refusedBuf [upstream.MaxPick]*upstream.Endpoint
	refused := refusedBuf[:0]
	last := ""
	for {
		changed := up.Changes() // before looking: no change is missed
		ask := v.ask(refused)
		ep := up.Pick(&ask)
		if ep == nil {
			if again, act := v.rideThrough(changed); again {
				refused, last = refused[:0], ""
				continue
			} else if act != policy.ActionAttempt {
				return act
			}
			return v.carry(v.allOut(last))
		}
		if !v.release(ep) {
			return policy.ActionStop
		}
		lease, act := v.takeConnection(ep)
		if act != policy.ActionAttempt {
			return act
		}
		tk, no := ep.Allow(v.model)
		if no == "" {
			ex.loop.stopRiding() // its place in the queue, and its spread, go once it has its attempt
			v.rideDraw = 0
			ex.loop.ep = ep
			a.ep, a.lease, a.tk = ep, lease, tk
			return policy.ActionAttempt
		}
		lease.Release(upstream.Sample{}) // not used: its sample does not count
		refused, last = append(refused, ep), no
	}
}

// ask is what the pick of v's upstream needs of this request
// (upstream.Ask): the endpoints it failed on, those refused, its
// affinity key when the upstream balances by affinity.
func (v *visit) ask(refused []*upstream.Endpoint) upstream.Ask {
	ex := v.ex
	up := v.t.up
	a := upstream.Ask{Model: v.model, Tried: v.tried[:v.nTried], Refused: refused, Rand: ex.p.rand}
	if up.Options().Balance == upstream.BalanceAffinity && len(up.Endpoints()) > 1 {
		a.Key, a.HasKey = v.affinityKey()
	}
	return a
}

// failedOn remembers that an attempt on ep failed: retries go elsewhere.
func (v *visit) failedOn(ep *upstream.Endpoint) {
	if v.nTried < len(v.tried) && !v.triedOn(ep) {
		v.tried[v.nTried] = ep
		v.nTried++
	}
}

// triedOn reports whether an attempt of this visit on ep failed.
func (v *visit) triedOn(ep *upstream.Endpoint) bool {
	return upstream.Contains(v.tried[:v.nTried], ep)
}

// affinityKey returns the request's key for BalanceAffinity
// (upstream.AffinityKey) on v's upstream, computed once; ok is false when
// it has none.
func (v *visit) affinityKey() (key uint64, ok bool) {
	ex := v.ex
	if !v.affKnown {
		a := v.t.up.Options().Affinity
		var header []byte
		if a.Header != "" {
			header = ex.ctx.Request.Header.Peek(a.Header)
		}
		v.affKnown = true
		v.affKey, v.hasKey = upstream.AffinityKey(a, header, ex.ctx.Request.Body())
	}
	return v.affKey, v.hasKey
}

// allOut asks policy what it means that no endpoint of v's upstream can
// take the request (upstream.AllOut says why: breakers, else health
// checks or DNS; refused names the breaker that refused last, if one
// did). The obstacle says what put the soonest endpoint out.
func (v *visit) allOut(refused string) policy.Decision {
	up := v.t.up
	a := up.AllOut(v.model, refused)
	o := obstacle{kind: policy.ObstacleUnhealthy, upstream: up.Name(), wait: a.Wait, limit: a.Limit, cause: a.Cause}
	if a.Breaker {
		o.kind = policy.ObstacleBreaker
	}
	return v.clearWith(o, 0)
}

// rideThrough waits, when the upstream has ride_through, for an endpoint
// to come back: until changed closes (a breaker or a health check
// changed), the soonest probe is due, the ride's end (ride_through within
// the deadline) or an interruption. again says to look again; otherwise
// action is ActionAttempt when the ride is over (or off, or its queue
// full), ActionStop when interrupted.
func (v *visit) rideThrough(changed <-chan struct{}) (again bool, action policy.Action) {
	ex := v.ex
	up := v.t.up
	if up.Options().RideThrough <= 0 {
		return false, policy.ActionAttempt
	}
	now := time.Now()
	if !v.startRide() {
		return false, policy.ActionAttempt // the queue is full: at once
	}
	left := v.rideUntil.Sub(now)
	if left <= 0 {
		return false, policy.ActionAttempt
	}
	wait := up.NextChange(v.model, now, left)
	ex.client.enter(phaseRideThrough)
	ex.report().waiting(phaseRideThrough, wait, sourceRideThrough)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-changed:
	case <-ex.p.stopping:
		return false, v.interrupted()
	case <-ex.client.gone():
		return false, v.interrupted()
	}
	return true, policy.ActionAttempt
}

// startRide begins this target's ride through an outage (ride_through,
// within the deadline) unless it has begun: a place among the riders
// taken, when max_in_flight does not bound them. false: their queue is
// full.
func (v *visit) startRide() bool {
	ex := v.ex
	up := v.t.up
	if !v.rideUntil.IsZero() {
		return true
	}
	ok, held := up.TakeRider()
	if !ok {
		return false
	}
	if held {
		ex.loop.rider = up
	}
	v.rideUntil = time.Now().Add(min(up.Options().RideThrough, time.Until(ex.req.deadline)))
	v.rideDraw = float64(ex.p.rand(1<<20)) / (1 << 20)
	ex.report().riding(up)
	return true
}

// rideLeft is how long this request may still ride through an outage of
// v's upstream: what is left of the ride it began, or the ride it may begin (none
// without ride_through, or with the riders' queue full).
func (v *visit) rideLeft(now time.Time) time.Duration {
	ex := v.ex
	up := v.t.up
	ride := up.Options().RideThrough
	switch {
	case ride <= 0:
		return 0
	case !v.rideUntil.IsZero():
		return max(v.rideUntil.Sub(now), 0)
	case up.RidersFull():
		return 0
	}
	return max(min(ride, ex.req.deadline.Sub(now)), 0)
}

// release holds a request that rode through an outage back a little
// once an endpoint returns, so the waiting requests reach it spread over
// a tenth of min(slow_start, ride_through) instead of all at once. false
// means it was interrupted.
func (v *visit) release(ep *upstream.Endpoint) bool {
	ex := v.ex
	up := v.t.up
	if v.rideUntil.IsZero() || v.rideDraw == 0 {
		return true
	}
	spread := min(up.SlowStart(), up.Options().RideThrough) / 10
	delay := time.Duration(v.rideDraw * float64(spread))
	return v.wait(min(delay, time.Until(ex.req.deadline)/2), sourceRideThrough)
}

// takeConnection waits, up to queue_timeout, for a place among ep's
// max_connections. That wait is Sturdy's own congestion, never the
// upstream's fault: no attempt, no breaker count; when it runs out the
// target is busy (fail over, or 503 upstream_busy).
func (v *visit) takeConnection(ep *upstream.Endpoint) (upstream.Lease, policy.Action) {
	ex := v.ex
	ex.client.enter(phaseQueue)
	start := ex.report().queueing()
	lr := v.leaseRequest()
	source := sourceConnections
	if ep.Concurrent() {
		lr.Priority, lr.Tenant, source = ex.req.priority, tenantOf(ex.ctx, ex.tbl, ex.req.key), sourceConcurrency
	}
	lease, r := ep.Lease(lr)
	v.queuedAt = time.Time{} // a retry's wait for a place is its own
	limit, wait := lease.Refusal()
	waited := ex.report().queued(start, r, source)
	if source == sourceConcurrency {
		ex.report().concurrencyQueued(v.t.up, lr.Priority, waited, r, r == upstream.LeaseTimedOut && limit == "concurrency")
	}
	switch r {
	case upstream.LeaseTimedOut:
		if wait <= 0 {
			wait = time.Second
		}
		return lease, v.carry(v.clear(policy.ObstacleBusy, wait, 0, limit))
	case upstream.LeaseCancelled:
		return lease, v.interrupted()
	}
	return lease, policy.ActionAttempt
}

// leaseRequest is this request's ask for a place on up (a max_in_flight
// slot, a connection place): waiting up to queue_timeout within the
// deadline — what is left of it after the wait for the visit's
// max_in_flight slot, for its first attempt — ended by shutdown or the
// client leaving. It has the default priority and no tenant (a
// concurrency queue's are set by takeConnection).
func (v *visit) leaseRequest() upstream.LeaseRequest {
	ex := v.ex
	wait := v.t.up.Options().QueueTimeout
	if !v.queuedAt.IsZero() {
		wait -= time.Since(v.queuedAt)
	}
	return upstream.LeaseRequest{Wait: min(wait, time.Until(ex.req.deadline)), Cancel: ex.p.stopping, Gone: ex.client.gone()}
}
