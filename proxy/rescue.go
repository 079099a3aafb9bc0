package proxy

import (
	"time"

	"sturdy/events"
	"sturdy/policy"
	"sturdy/upstream"
)

// rescueTarget returns the index of the target that continues the
// stream: the current one if its upstream can continue, else the next
// fallback that can; -1 for none.
func (st *stream) rescueTarget() int {
	ex := st.ex
	ts := ex.req.route.targets
	for i := st.rescue.ti; i < len(ts); i++ {
		if o := ts[i].up.Options(); o.Continuation.Continues(ex.req.call.API) && o.APIs.Serves(ex.req.call.API) {
			return i
		}
	}
	return -1
}

// rescueState is where the failed stream stands, for policy.Rescue: ti
// is the target that would continue it (rescueTarget, -1: none),
// budgetSpent says its upstream's retry budget had no retry left (see
// rescueStream).
func (st *stream) rescueState(ti int, budgetSpent bool) policy.Rescue {
	ex := st.ex
	rs, r := &st.rescue, ex.req.route
	return policy.Rescue{Blocker: rs.blocker, HasTarget: ti >= 0, Tries: rs.tries, MaxRescues: r.maxRescues,
		Total: ex.loop.counted(), MaxTotal: ex.req.retry.TotalAttempts(), Remaining: time.Until(ex.req.deadline),
		Elapsed: time.Since(ex.req.start), MaxDuration: r.maxDuration,
		Interrupted: st.cut.Load() || ex.client.isGone.Load() || closed(ex.p.stopping), BudgetSpent: budgetSpent}
}

// rescueStream continues the failed stream on a target that can, as
// policy.Rescue allows, and reports whether one took over. Each
// continuation sent is paid for from its upstream's retry budget:
// reserved before deciding, given back when it is not sent.
func (st *stream) rescueStream() bool {
	ex := st.ex
	rs := &st.rescue
	if !rs.rescuable {
		return false
	}
	if rs.try == nil {
		rs.try = new(attempt)
	}
	a := rs.try
	*a = attempt{}
	for {
		ti, budget, now, ok := st.nextRescue()
		if !ok {
			return false
		}
		rs.tries++
		ex.report().cut(rs.end)
		took, sent := st.continueOn(ti, a)
		if !sent {
			budget.Cancel(now)
		}
		if took {
			ex.report().rescued("continued", true)
			return true
		}
		if rs.blocker == policy.RescueTooLarge { // its body would pass max_body: never sent
			rs.tries--
			continue
		}
		ex.report().rescued("failed", true)
		ex.report().continuationFailed()
		rs.ti = policy.RescueNext(ti, sent && a.verdict.Class == policy.ClassRetryable)
	}
}

// nextRescue is the target the next continuation goes to, as
// policy.Rescue allows, with its upstream's retry budget reserved at now
// (given back unless it is sent); not ok: none goes (the refusal
// reported). A function of its own: its frame is not on the stack while
// the continuation is judged.
func (st *stream) nextRescue() (ti int, budget *policy.Budget, now time.Time, ok bool) {
	ex, rs := st.ex, &st.rescue
	ti, now = st.rescueTarget(), time.Now()
	reserved := false
	if ti >= 0 {
		budget = ex.req.route.targets[ti].up.Budget()
		reserved = budget.Reserve(now)
	}
	if why := st.rescueState(ti, ti >= 0 && !reserved).Refusal(); why != "" {
		if reserved {
			budget.Cancel(now)
		}
		if rs.refused == "" && why != "interrupted" {
			rs.refused = why
		}
		ex.report().rescued(why, rs.tries == 0 || why != "exhausted")
		return ti, nil, now, false
	}
	return ti, budget, now, true
}

// continueOn sends the continuation request to target ti — the body as
// the target gets it, the text so far as a trailing assistant message —
// through the loop's step (attemptOn), and, when it answers with a
// stream, makes it the one relayed (took). sent says an attempt was made;
// a is the last one.
func (st *stream) continueOn(ti int, a *attempt) (took, sent bool) {
	ex := st.ex
	rs, lp := &st.rescue, &ex.loop
	t := &ex.req.route.targets[ti]
	failedUp, failedEp := ex.target().up, lp.ep
	st.rp.close() // closing the cut stream's connection stops its generation
	a.rp = st.rp  // the continuation's attempt takes the reply over: the stream reads what it gets
	// The event it was cut in never reached the client, nor the text so
	// far: the continuation starts after the last whole event.
	rs.pending = rs.pending[:0]
	body, ws, ok := st.continuation(t) // before the target is taken: a body too large leaves the loop as it was
	if !ok {
		return false, false
	}
	v := &ex.visit // the loop's visit has ended: off the stack, as onTarget's
	*v = visit{}
	v.ex, v.t, v.ti = ex, t, ti
	if v.useTarget() != policy.ActionAttempt { // its obstruction answers nobody: the stream ends
		return false, false
	}
	v.continuing = true
	ex.req.msg.SetBodyRaw(body)
	if t.up == failedUp && failedEp != nil {
		v.failedOn(failedEp) // another replica, if one is in
	}
	for {
		if v.attemptOn(a) != policy.ActionAttempt {
			return false, sent
		}
		sent = true
		if a.out.Fault == policy.FaultStale {
			d, _ := policy.DecideStale(policy.Attempt{Replayable: ex.req.replayable, AfterStale: a.stale,
				Remaining: time.Until(ex.req.deadline)})
			if v.replaying = d.Replay; d.Replay {
				continue
			}
		}
		if !a.replied() || a.verdict.Class != policy.ClassSuccess || a.out.StreamFailed ||
			events.KindOf(a.rp.msg.Header.ContentType()) != events.SSE || st.cut.Load() || ex.client.isGone.Load() {
			a.rp.close()
			return false, true
		}
		break
	}
	st.closeDelimited = a.rp.msg.Header.ContentLength() == -2
	upstream.CapReads(a.rp.msg, ex.req.responseCap(true)) // a followed stream is chunked SSE (followForRescue)
	rs.ti, rs.cont, rs.begun = ti, true, false
	st.stripUsage = st.stripUsage || ex.req.asksUsage(t) // the continuation's body asked for it (bodyFor)
	rs.join.cutOver(ws)
	st.meter.cutOver()
	rs.rescued, rs.seam, rs.by = rs.rescued+1, ex.out.bytesOut, t.up.Name()
	ex.client.enter(phaseStream)
	return true, true
}

// continuation returns the body of the continuation request to t: the
// body as t gets it, the text so far appended as a trailing assistant
// message, with vLLM's flags for continuing it on chat completions (with
// no text yet, the request as it was); on the Messages API a prefill
// (prefillMessages: ws is the whitespace its end stripped). false means
// it could not be built — it must not be sent as it is — or would pass
// the route's max_body (policy.RescueTooLarge).
func (st *stream) continuation(t *target) (b []byte, ws int, ok bool) {
	ex := st.ex
	rs := &st.rescue
	var err error
	switch {
	case ex.req.call.API == policy.APIAnthropic:
		b, ws, err = prefillMessages(ex.bodyFor(t), rs.text)
	case len(rs.text) == 0:
		return ex.bodyFor(t), 0, true
	default:
		b, err = chatContinuation(ex.bodyFor(t), rs.text, t.up.Options().Continuation)
	}
	if err != nil {
		return nil, 0, false
	}
	if len(b) > ex.req.route.maxBody { // no continuation is larger than a request the route takes
		rs.blocker, rs.refused = policy.RescueTooLarge, policy.RescueTooLarge
		return nil, 0, false
	}
	return b, ws, true
}
