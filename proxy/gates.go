package proxy

import (
	"sturdy/policy"
	"time"
)

// What stands before an attempt on a visit's target, and the loop's waits:
// an obstacle cleared or waited for (policy.Clear), a refusal recorded in
// the loop's obstruction, a decision's stop carried, a wait that Sturdy's
// shutdown or the client's leaving ends early. The steps of both the loop
// (loop.go) and the pick and lease (pool.go) go through these.

// carry records what the loop needs of a decision (the stop reason, a
// spent budget) and returns its action.
func (v *visit) carry(d policy.Decision) policy.Action {
	ex := v.ex
	if d.Stop == policy.StopBudget {
		ex.report().budgetSpent(v.t.up)
	}
	if d.Action == policy.ActionStop {
		ex.loop.stop = d.Stop
	}
	return d.Action
}

// clear asks policy what an obstacle before an attempt on v's target
// means — it clears in wait and may be waited for up to maxWait — and
// records a refusal (limit names the setting a busy target is at).
func (v *visit) clear(kind policy.Obstacle, wait, maxWait time.Duration, limit string) policy.Decision {
	return v.clearWith(obstacle{kind: kind, upstream: v.t.up.Name(), wait: wait, limit: limit}, maxWait)
}

// clearWith is clear of an obstacle told whole (with its cause).
func (v *visit) clearWith(o obstacle, maxWait time.Duration) policy.Decision {
	ex := v.ex
	d := policy.Clear(policy.Gate{Obstacle: o.kind, Wait: o.wait, MaxWait: maxWait, Remaining: time.Until(ex.req.deadline),
		HasFallback: ex.req.route.fallbackAfter(ex.req.call.API, v.ti), N: v.n, Total: ex.loop.attempts})
	if d.Action != policy.ActionAttempt {
		o.model = v.model
		v.block(o)
	}
	return d
}

// block records why v's target could not be used, keeping the obstacle
// that clears soonest (in v's loop's obstruction).
func (v *visit) block(o obstacle) {
	ex := v.ex
	ex.report().skipped(o)
	in := &v.in
	in.blocked = true
	if in.obstacle.kind == policy.ObstacleNone || o.wait < in.obstacle.wait {
		in.obstacle = o
	}
}

// wait waits d, unless Sturdy shuts down (or, once watched, the client
// leaves) first; false means it ended early, or that shutdown had already
// begun, and ex.loop.stop says why. The timer is always stopped. source
// says who set the wait (for a trace).
func (v *visit) wait(d time.Duration, source waitSource) bool {
	ex := v.ex
	ex.report().waiting(phase(ex.client.phase.Load()), d, source)
	if d <= 0 {
		select {
		case <-ex.p.stopping:
		case <-ex.client.goneCh:
		default:
			return true
		}
		v.interrupted()
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ex.p.stopping:
	case <-ex.client.goneCh:
	}
	v.interrupted()
	return false
}

// interrupted records why a wait ended early — shutdown, else the client
// left — and stops the loop. What stood in the way before the wait is no
// longer the answer.
func (v *visit) interrupted() policy.Action {
	ex := v.ex
	v.in.blocked = false
	ex.loop.stop = policy.StopClientGone
	if closed(ex.p.stopping) {
		ex.loop.stop = policy.StopShutdown
	}
	return policy.ActionStop
}

// closed reports whether ch is closed (Proxy.stopping: shutdown has
// begun).
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
