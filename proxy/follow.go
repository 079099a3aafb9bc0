package proxy

import (
	"errors"
	"io"
	"math"
	"slices"

	"github.com/tidwall/sjson"

	"sturdy/events"
	"sturdy/policy"
)

// rescue follows a committed chat completions stream that a target of
// the route could continue, should it fail mid-answer: events are relayed
// whole (so the client never holds half of one at a seam), and the text
// so far is kept to send as a trailing assistant message.
type rescue struct {
	// on: the stream is followed (its events go whole); rescuable: it
	// may be continued, should it fail.
	on, rescuable bool
	// raw is set once an event outgrew maxHold: from then on bytes go as
	// they come, unfollowed, and no continuation is possible.
	raw bool
	// pending holds upstream bytes not yet relayed (an unfinished event);
	// ready whole events for the client, readyOff how much of it went.
	pending  []byte
	ready    []byte
	readyOff int
	// end is how the relayed upstream stream ended (io.EOF: cleanly), to
	// act on once ready is out.
	end error
	// text is the answer streamed so far (choice 0), id the stream's id
	// that a continuation's chunks take; blocker says what streamed
	// rules a continuation out (policy.FollowChunk, Continuable).
	text    []byte
	id      []byte
	blocker string
	// ti is the target whose stream is relayed now; cont says it is a
	// continuation, begun that its first output went by; done that its
	// [DONE] went by (nothing after it is followed or relayed).
	ti                int
	cont, begun, done bool
	// tries counts continuations sent, rescued those that took over;
	// seam is the bytes the client had at the last seam, by the upstream
	// that continued; refused why a failure could not be rescued.
	tries, rescued int
	seam           int64
	by             string
	refused        string
	// join joins a Messages API stream's continuations to it.
	join messageSeam
	// try is a continuation's try, then the last one made, made with the
	// first: off the stack (the continuation's first event is judged as
	// deep as the loop's, under the stream's Read), and no part of a
	// stream that is never rescued.
	try *attempt
}

// errInBand is why a stream that reported an error mid-answer ended.
var errInBand = errors.New("the upstream reported an error mid-stream")

// followForRescue turns following on at commit for a stream whose events
// go whole: a chat completions or Messages API stream the route could
// continue — chunked SSE, a request continuing cannot corrupt
// (policy.Continuable), and a target that can continue (ti is the index
// of the target whose stream it is) — or one whose usage Sturdy asked
// for and the client did not (stripUsage: that event is not relayed).
func (st *stream) followForRescue(ti int) {
	ex := st.ex
	rs := &st.rescue
	api := ex.req.call.API
	rs.ti = ti
	rs.rescuable = (api == policy.APIChat || api == policy.APIAnthropic) && st.kind == events.SSE && st.chunked &&
		ex.req.route.maxRescues > 0 && ex.out.outcome == outcomeOK && st.rescueTarget() >= 0
	st.stripUsage = st.kind == events.SSE && ex.req.asksUsage(&ex.req.route.targets[ti])
	if !rs.rescuable && !st.stripUsage {
		return
	}
	switch body := ex.ctx.Request.Body(); {
	case !rs.rescuable: // followed for its usage only (follow)
	case api == policy.APIAnthropic:
		rs.blocker, rs.join = policy.ContinuableMessages(body), messageSeam{block: -1}
	default:
		rs.blocker = policy.Continuable(body)
	}
	rs.on = true
	rs.pending = make([]byte, 0, headSize) // one read takes what a chunk brings
}

// readEvents is Read for a followed stream: it puts whole events in p
// (n bytes, to be relayed), and when the upstream stream fails — a cut, a
// stall past idle, an in-band error — continues it on a target that can
// (rescueStream); end is how the stream ended, when no target took it
// over (or when it ended whole: io.EOF), for Read to end it as any.
func (st *stream) readEvents(p []byte) (n int, end error) {
	rs := &st.rescue
	for {
		if rs.readyOff < len(rs.ready) {
			n := copy(p, rs.ready[rs.readyOff:])
			rs.readyOff += n
			return n, nil
		}
		rs.ready, rs.readyOff = rs.ready[:0], 0
		if rs.end != nil {
			if rs.end != io.EOF && st.rescueStream() {
				rs.end = nil
				continue
			}
			rs.on = false
			return 0, rs.end
		}
		err := st.pull()
		if st.takeEvents() {
			err = errInBand
		}
		if rs.done {
			err = io.EOF // what follows [DONE], even a cut, is not the stream's
		}
		switch {
		case err == nil:
			continue
		case err == io.EOF && st.cutAtEnd():
			err = errUnterminated
		case err == io.EOF:
			st.lastEvent()
		}
		rs.end = err
	}
}

// pull adds the next upstream bytes to pending: the reply's held head
// first, then its body.
func (st *stream) pull() error {
	rp, rs := st.rp, &st.rescue
	if rp.headOff < len(rp.head) {
		rs.pending = append(rs.pending, rp.head[rp.headOff:]...)
		rp.passHead(&st.ex.held, &st.ex.p.held) // all of it is in pending
		return nil
	}
	if rp.body == nil { // read to its end while held
		return io.EOF
	}
	var err error
	rs.pending, err = readOnto(rs.pending, rp.body, math.MaxInt)
	return err
}

// cutAtEnd reports whether a stream that reached EOF was cut: only its
// connection's close ended it, before its terminator.
func (st *stream) cutAtEnd() bool {
	if !st.closeDelimited {
		return false
	}
	s := st.scan // a copy: what the client's scanner will make of the rest
	_, _ = s.Write(st.rescue.ready[st.rescue.readyOff:])
	_, _ = s.Write(st.rescue.pending)
	s.End()
	return !s.Done()
}

// lastEvent moves what pending holds as the stream ends to ready: an
// event without its blank line, followed like any (metered, its usage
// stripped), or bytes that are no event, as they are.
func (st *stream) lastEvent() {
	rs := &st.rescue
	ev, n := events.Last(events.SSE, rs.pending)
	if n > 0 && !rs.raw {
		if st.follow(ev, rs.pending) { // an error the stream ends with: relayed, nothing can follow it
			rs.ready = append(rs.ready, rs.pending...)
		}
	} else {
		rs.ready = append(rs.ready, rs.pending...)
	}
	rs.pending = rs.pending[:0]
}

// takeEvents moves pending's whole events to ready, following each. true
// means an in-band error a continuation may rescue: it and whatever
// follows it are not relayed.
func (st *stream) takeEvents() (failed bool) {
	rs := &st.rescue
	if rs.raw {
		rs.ready, rs.pending = append(rs.ready, rs.pending...), rs.pending[:0]
		return false
	}
	off := 0
	for !failed && !rs.done {
		ev, n := events.Next(events.SSE, rs.pending[off:])
		if n == 0 {
			break
		}
		failed = st.follow(ev, rs.pending[off:off+n])
		off += n
	}
	if failed || rs.done {
		off = len(rs.pending)
	}
	rs.pending = rs.pending[:copy(rs.pending, rs.pending[off:])]
	if len(rs.pending) > maxHold { // no event's end in sight: give up following
		rs.raw, rs.blocker = true, "oversized_event"
		rs.ready, rs.pending = append(rs.ready, rs.pending...), rs.pending[:0]
	}
	return failed
}

// follow relays one event (raw) of the stream to ready, after learning
// from it: its text, its id, whatever rules a continuation out. A
// continuation's events lose their role-only framing (the client had it)
// and take the first stream's id. true means ev is an in-band error a
// continuation may rescue, not relayed.
func (st *stream) follow(ev events.Event, raw []byte) (failed bool) {
	rs := &st.rescue
	if st.metering {
		st.meter.event(ev.Data)
	}
	if st.stripUsage && policy.UsageChunk(ev.Data) { // Sturdy's, not the client's
		return false
	}
	if !rs.rescuable { // followed for its usage only: relayed as it came, no text kept
		rs.ready = append(rs.ready, raw...)
		rs.done = string(ev.Data) == "[DONE]"
		return false
	}
	if ev.Data == nil || string(ev.Data) == "[DONE]" {
		rs.ready = append(rs.ready, raw...)
		rs.done = ev.Data != nil
		return false
	}
	mark, code := policy.Judge(st.ex.req.call.API, ev.Name, ev.Data)
	if mark == policy.MarkFailure {
		if policy.EventFailure(code).Class == policy.ClassRetryable && st.rescueState(st.rescueTarget(), false).Refusal() == "" {
			return true
		}
		rs.ready = append(rs.ready, raw...)
		return false
	}
	if st.ex.req.call.API == policy.APIAnthropic {
		st.followMessage(ev, raw)
		return false
	}
	if rs.cont && !rs.begun {
		if mark == policy.MarkFraming {
			return false
		}
		rs.begun = true
	}
	id, text, blocker := policy.FollowChunk(ev.Data)
	if rs.blocker == "" {
		rs.blocker = blocker
	}
	if rs.blocker == "" { // else no continuation will need it
		st.keepText(text)
	}
	switch {
	case !rs.cont && len(rs.id) == 0:
		rs.id = append(rs.id, id...)
	case rs.cont && id != string(rs.id):
		if data, err := sjson.SetBytes(slices.Clone(ev.Data), "id", string(rs.id)); err == nil {
			rs.ready = append(append(append(rs.ready, "data: "...), data...), "\n\n"...)
			return false
		}
	}
	rs.ready = append(rs.ready, raw...)
	return false
}

// followMessage relays one Messages API event of a followed stream
// through the seam (messageSeam.relay), after learning from it what
// rules a continuation out, and keeps the text the client got of it.
func (st *stream) followMessage(ev events.Event, raw []byte) {
	rs := &st.rescue
	m := policy.FollowMessage(ev.Name, ev.Data)
	if rs.blocker == "" {
		rs.blocker = m.Blocker
	}
	var text string
	rs.ready, text = rs.join.relay(rs.ready, m, raw, ev.Data, rs.cont)
	if rs.blocker == "" {
		st.keepText(text)
	}
	rs.done = m.Type == "message_stop"
}

// keepText adds streamed text to what a continuation would send, within
// the route's max_rescue_bytes and the buffer budget; past either the
// stream is relayed as ever but no longer rescuable — rescue_refused
// says which bound it met — and the text is let go.
func (st *stream) keepText(text string) {
	ex := st.ex
	rs, limit := &st.rescue, ex.req.route.maxRescueBytes
	switch {
	case len(rs.text)+len(text) > limit:
		rs.blocker = policy.RescueTooLarge
	case cap(rs.text)-len(rs.text) < len(text):
		more := min(max(len(text), cap(rs.text), 4<<10), limit-len(rs.text))
		if !ex.held.hold(&ex.p.held, more, heldForRescue) {
			rs.blocker = policy.RescueBuffers
			break
		}
		rs.text = slices.Grow(rs.text, more)
	}
	if rs.blocker != "" {
		rs.refused, rs.text = rs.blocker, nil
		return
	}
	rs.text = append(rs.text, text...)
}
