package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"sturdy/events"
	"sturdy/policy"
	"sturdy/upstream"
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

// chatContinuation is a chat completions body with text as a trailing
// assistant message, and vLLM's flags for continuing it when c says so.
func chatContinuation(body, text []byte, c upstream.Continuation) ([]byte, error) {
	msg, _ := json.Marshal(struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}{"assistant", string(text)})
	b, err := sjson.SetRawBytes(slices.Clone(body), "messages.-1", msg)
	if err == nil && c == upstream.ContinueVLLM {
		if b, err = sjson.SetBytes(b, "continue_final_message", true); err == nil {
			b, err = sjson.SetBytes(b, "add_generation_prompt", false)
		}
	}
	return b, err
}

// messageSeam joins a Messages API stream and its continuations into the
// one stream the client sees: a continuation's message_start is dropped
// (the client has its own, its id with it), its first text block is
// joined to the cut one when that block is an open text block (its start
// dropped, its indexes mapped onto the cut block's) or else follows the
// client's blocks (the cut block stopped first), the whitespace the
// prefill stripped is not sent twice, and the final message_delta's
// output_tokens counts every attempt's output.
type messageSeam struct {
	// block is the index of the client's last content block (-1: none),
	// open that it has had no stop, text that it is a text block.
	block      int64
	open, text bool
	// shift maps the relayed stream's block indexes onto the client's;
	// mapped says a continuation's first block (or its end) was seen.
	shift  int64
	mapped bool
	// ws is how much of the continuation's leading whitespace is dropped
	// at the seam: what the prefill's end stripped (prefillMessages).
	ws int
	// prior is the output tokens of the attempts cut before the relayed
	// one; tokens what the relayed one last reported, streamed the bytes
	// of text it streamed (an estimate, ÷ 4, where it reported less).
	prior, tokens int64
	streamed      int
}

// cutOver prepares the seam for a continuation taking over: the cut
// attempt's output counted, ws the whitespace its prefill stripped.
func (m *messageSeam) cutOver(ws int) {
	m.prior += max(m.tokens, textTokens(m.streamed))
	m.tokens, m.streamed, m.mapped, m.shift, m.ws = 0, 0, false, 0, ws
}

// relay appends to dst what the client gets of one event (raw, read as
// ev) of the relayed stream, a continuation's when cont, and returns the
// text the client got of it. An event goes as it came unless the seam
// changes it (its index, its text's leading whitespace, the final count).
func (m *messageSeam) relay(dst []byte, ev policy.MessageEvent, raw, data []byte, cont bool) ([]byte, string) {
	if ev.OutputTokens >= 0 {
		m.tokens = ev.OutputTokens
	}
	if !cont {
		m.track(ev, ev.Index)
		m.streamed += len(ev.Text)
		return append(dst, raw...), ev.Text
	}
	idx := ev.Index + m.shift
	switch ev.Type {
	case "message_start":
		return dst, ""
	case "content_block_start":
		if !m.mapped {
			m.mapped = true
			if ev.Block == "text" && ev.Index == 0 && m.open && m.text { // joined: the client's block goes on
				m.shift = m.block
				return m.joined(dst, ev.Text)
			}
			dst = m.stopOpen(dst)
			m.shift = m.block + 1 - ev.Index
			idx = m.block + 1
		}
		m.track(ev, idx)
		return m.edit(dst, ev, raw, data, idx, "content_block.text")
	case "content_block_delta":
		return m.edit(dst, ev, raw, data, idx, "delta.text")
	case "content_block_stop":
		m.track(ev, idx)
	case "message_delta", "message_stop":
		if !m.mapped { // a continuation that added nothing: the cut block ends here
			m.mapped = true
			dst = m.stopOpen(dst)
		}
		if ev.OutputTokens >= 0 && m.prior > 0 {
			data, _ = sjson.SetBytes(slices.Clone(data), "usage.output_tokens", ev.OutputTokens+m.prior)
			return messageEvent(dst, ev.Type, data), ""
		}
		return append(dst, raw...), ""
	}
	if m.shift == 0 || ev.Index < 0 {
		return append(dst, raw...), ""
	}
	data, _ = sjson.SetBytes(slices.Clone(data), "index", idx)
	return messageEvent(dst, ev.Type, data), ""
}

// edit relays a continuation's block event whose text (at path in data,
// if any) may lose leading whitespace at the seam, at the client's index
// idx: as it came when neither changes, else rewritten; a delta left
// with no text is dropped.
func (m *messageSeam) edit(dst []byte, ev policy.MessageEvent, raw, data []byte, idx int64, path string) ([]byte, string) {
	text := m.trimmed(ev.Text)
	m.streamed += len(text)
	switch {
	case text == "" && ev.Text != "" && ev.Type == "content_block_delta":
		return dst, ""
	case text == ev.Text && idx == ev.Index:
		return append(dst, raw...), text
	}
	data, _ = sjson.SetBytes(slices.Clone(data), "index", idx)
	if text != ev.Text {
		data, _ = sjson.SetBytes(data, path, text)
	}
	return messageEvent(dst, ev.Type, data), text
}

// joined appends a joined block start's own text as a text_delta of the
// client's block, less the seam's whitespace (nothing when none is left).
func (m *messageSeam) joined(dst []byte, text string) ([]byte, string) {
	text = m.trimmed(text)
	m.streamed += len(text)
	if text == "" {
		return dst, ""
	}
	data := fmt.Appendf(nil, `{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":""}}`, m.block)
	data, _ = sjson.SetBytes(data, "delta.text", text)
	return messageEvent(dst, "content_block_delta", data), text
}

// trimmed is a continuation's text less the leading whitespace the seam
// still drops (ws bytes); its first other character ends the dropping.
func (m *messageSeam) trimmed(text string) string {
	i := 0
	for i < len(text) && m.ws > 0 {
		r, n := utf8.DecodeRuneInString(text[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i, m.ws = i+n, m.ws-n
	}
	if i < len(text) {
		m.ws = 0
	}
	return text[i:]
}

// track follows the client's content blocks: ev, at the client's index
// idx, starts or stops one.
func (m *messageSeam) track(ev policy.MessageEvent, idx int64) {
	switch ev.Type {
	case "content_block_start":
		m.block, m.open, m.text = idx, true, ev.Block == "text"
	case "content_block_stop":
		m.open = false
	}
}

// stopOpen ends the client's open block, if one is, before what follows
// the seam goes in blocks of its own.
func (m *messageSeam) stopOpen(dst []byte) []byte {
	if !m.open {
		return dst
	}
	m.open = false
	return messageEvent(dst, "content_block_stop", fmt.Appendf(nil, `{"type":"content_block_stop","index":%d}`, m.block))
}

// messageEvent appends a Messages API event named typ with data.
func messageEvent(dst []byte, typ string, data []byte) []byte {
	dst = append(append(append(dst, "event: "...), typ...), "\ndata: "...)
	return append(append(dst, data...), "\n\n"...)
}

// prefillMessages is a Messages API body with text as the answer's
// prefill: appended to a trailing assistant message the request has (a
// string, or its last text block; policy.ContinuableMessages rules out
// any other), else as a new one. Its trailing
// whitespace is stripped — Anthropic refuses a final assistant message
// ending in it — and stripped says how much (the seam drops as much of
// the continuation's leading whitespace). With no text left, the body as
// it is.
func prefillMessages(body, text []byte) (b []byte, stripped int, err error) {
	kept := bytes.TrimRightFunc(text, unicode.IsSpace)
	stripped = len(text) - len(kept)
	if len(kept) == 0 {
		return body, stripped, nil
	}
	n := gjson.GetBytes(body, "messages.#").Int()
	last := gjson.GetBytes(body, fmt.Sprintf("messages.%d", n-1))
	c := last.Get("content")
	switch {
	case n > 0 && last.Get("role").Str == "assistant" && c.Type == gjson.String:
		b, err = sjson.SetBytes(slices.Clone(body), fmt.Sprintf("messages.%d.content", n-1), c.Str+string(kept))
	case n > 0 && last.Get("role").Str == "assistant" && c.Get("@reverse.0.type").Str == "text":
		k := c.Get("#").Int() - 1
		b, err = sjson.SetBytes(slices.Clone(body), fmt.Sprintf("messages.%d.content.%d.text", n-1, k), c.Get("@reverse.0.text").Str+string(kept))
	default:
		msg, _ := json.Marshal(struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		}{"assistant", string(kept)})
		b, err = sjson.SetRawBytes(slices.Clone(body), "messages.-1", msg)
	}
	return b, stripped, err
}
