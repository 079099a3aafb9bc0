package proxy

import (
	"io"
	"strconv"
	"sync"
	"time"

	"sturdy/events"
	"sturdy/policy"
	"sturdy/upstream"

	"github.com/valyala/fasthttp"
)

// attempt is one try of the request on an endpoint: what the upstream
// side readied for it (the endpoint, a connection place, both breakers'
// tickets), how it went (its outcome; for one that reached nothing, why)
// and what policy made of that (its verdict), and the upstream's reply to
// it. The loop holds one per request (run, and a rescue's continueOn its
// own): attemptOn fills it for each try, decide judges it, and respond
// answers from the last, handing its reply to the client's stream when
// it is committed to go as it comes.
type attempt struct {
	// ti is the index of its target in the route, up its upstream, ep
	// its endpoint.
	ti int
	up *upstream.Upstream
	ep *upstream.Endpoint
	// lease is the connection place taken for it, until it is sent (then
	// the reply holds it); tk its breakers' tickets.
	lease upstream.Lease
	tk    upstream.Tickets
	// n is its number among the request's attempts (stale replays
	// included), model the model as sent, cont says it carries a rescue's
	// continuation, stale that it is a stale connection's replay (its
	// sample does not count); sentAt is when it was sent, headAt when
	// its response head arrived (its reply's ttfb, once committed).
	n              int
	model          string
	cont           bool
	stale          bool
	sentAt, headAt time.Time
	// out is what roundTrip saw of it (a stream's error event before its
	// first output included: StreamFailed, StreamError).
	out     policy.Outcome
	verdict policy.Verdict
	// why says why a try without a response reached nothing
	// (WhyUnreachable); refused that its connection was refused (nothing
	// listened). Both are set as it is sent (roundTrip): a try not sent
	// keeps the last one's.
	why     string
	refused bool
	// rp is its reply (nil until one is sent): the upstream's message,
	// body and connection. A sent try takes over the one before it, its
	// reply closed (reply.reuse).
	rp *reply
}

// replied says a's try produced a response (a status, no fault).
func (a *attempt) replied() bool { return a.rp != nil && a.out.Fault == policy.FaultNone }

// reply is an attempt's reply: its message, the body still to be read,
// the connection and the place it holds, and the body bytes read before
// commit. It is pooled (replyPool): an attempt takes one as it is sent,
// the next attempt takes it over (reuse), and it goes back as the request
// ends without it (respond) or, once committed to go as it comes, as its
// stream ends (stream.rp).
type reply struct {
	msg *fasthttp.Response
	// conn is where the request holds the upstream connection in use
	// (its presence's inUse: closed when the client leaves or Shutdown's
	// grace ends), let go of as the reply is closed.
	conn *upstream.Hold
	// lease is the connection place (max_connections) the attempt holds
	// until its body is closed; sample is what it reports then (its
	// ttft, and whether that counts: not for a stale connection's replay,
	// nor for an attempt not sent or whose client left; see sampled).
	lease  upstream.Lease
	sample upstream.Sample
	// body is the upstream response stream still to be read, nil once
	// fully read or closed.
	body io.Reader
	// head holds the body bytes read before commit; headOff is how much
	// of it went to the client.
	head    []byte
	headOff int
	// headBuf holds head's place in headPool (head is the one to read: it
	// may have grown), nil once a stream gave it away.
	headBuf *[]byte
	// heldToEnd is set when a stream ended while its framing was held:
	// all of it is in head.
	heldToEnd bool
}

var replyPool = sync.Pool{New: func() any { return &reply{msg: new(fasthttp.Response)} }}

// headPool holds the reply heads committed streams gave back (passHead):
// a reply keeps its head through the pool of replies, so a request not
// streamed takes none from here, and a thousand open streams do not each
// keep a head's touched pages. A reply without one takes one as its body
// is first read (readHead).
var headPool = sync.Pool{New: func() any { b := make([]byte, 0, headSize); return &b }}

// takeHead empties rp's head for the next body, taking one from the pool
// when a stream gave its own away.
func (rp *reply) takeHead() {
	if rp.headBuf == nil {
		rp.headBuf = headPool.Get().(*[]byte)
		rp.head = *rp.headBuf
	}
	rp.head, rp.headOff = rp.head[:0], 0
}

// reuse readies rp for the next attempt, whose connection is held in
// conn (a request's presence.inUse): the previous attempt's reply closed
// (its body and its connection place given up) and emptied, or a pooled
// one when there was none.
func (rp *reply) reuse(conn *upstream.Hold) *reply {
	if rp == nil {
		rp = replyPool.Get().(*reply)
	} else {
		rp.close()
	}
	rp.conn, rp.sample, rp.heldToEnd = conn, upstream.Sample{}, false
	return rp
}

// passHead gives a committed stream's reply head to the pool once what
// it held has gone on (to the client, or to a rescue's pending text),
// and with it the request's share s of the budget b reserved for its
// capacity past headSize: the next request to take it reserves anew.
func (rp *reply) passHead(s *share, b *heldBytes) {
	if rp.headBuf == nil {
		return
	}
	*rp.headBuf = keepHead(rp.head)
	headPool.Put(rp.headBuf)
	rp.headBuf, rp.head, rp.headOff = nil, nil, 0
	s.giveHead(b)
}

// release closes rp and returns it to the pool (nil: none).
func (rp *reply) release() {
	if rp == nil {
		return
	}
	rp.close()
	rp.msg.Reset()
	*rp = reply{msg: rp.msg, head: keepHead(rp.head), headBuf: rp.headBuf}
	replyPool.Put(rp)
}

// failureCause names a failed attempt in a few words, for a breaker it
// may open: the reason a connection failed ("connection refused"), a
// status ("503"), an in-band error's code, or the fault ("timeout").
func (a *attempt) failureCause() string {
	switch out := &a.out; {
	case out.Fault != policy.FaultNone && a.why != "":
		return a.why
	case out.Fault != policy.FaultNone:
		return out.Fault.String()
	case out.StreamFailed:
		return "an in-band " + strconv.Quote(out.StreamError)
	default:
		return strconv.Itoa(out.Status)
	}
}

// roundTrip sends the request once, for a, and reads the response head:
// the status, headers and the first body bytes (all of a small body),
// into the reply; a.out says what happened. Its timeout is the upstream's
// first_byte, or for a stream the route's first_token when shorter, cut
// short by the deadline. It only reports what happened; the loop asks
// policy what that means.
func (v *visit) roundTrip(a *attempt) {
	ex, t := v.ex, v.t
	timeout := min(t.up.Options().Timeouts.FirstByte, ex.req.deadline.Sub(a.sentAt))
	if ex.req.firstToken > 0 {
		timeout = min(timeout, ex.req.firstToken)
	}
	if timeout <= 0 {
		a.out = policy.Outcome{Fault: policy.FaultTimeout} // not sent: its sample does not count
		return
	}
	rp := a.rp
	resp := rp.msg
	rp.heldToEnd = false
	a.why, a.refused = "", false // this attempt's, not an earlier one's
	ex.client.enter(phaseHead)
	if err := a.ep.Send(rp.conn, ex.req.msg, resp, timeout); err != nil || ex.client.isGone.Load() {
		f := policy.FaultClientGone
		switch {
		case ex.client.isGone.Load():
		case upstream.Unsent(err), !upstream.IsTimeout(err) && upstream.Stale(resp):
			f = policy.FaultStale
		default:
			f = faultOf(err)
			a.why, a.refused = WhyUnreachable(err), refusedConnection(err)
		}
		v.sampled(a, f)
		a.rp.close()
		a.out = policy.Outcome{Fault: f}
		return
	}
	// headAt: when the head arrived, or with a small body read whole
	// with it (upstreamTransport), when that body did. Without a body
	// stream the transport was done with the connection, and the
	// exchange let go of it (upstreamConn.detach).
	a.headAt = time.Now()
	status := resp.StatusCode()
	out := &a.out
	*out = policy.Outcome{Status: status}
	if f := v.readHead(a, status); f != policy.FaultNone {
		if ex.client.isGone.Load() { // the watcher closed the connection: no fault of the upstream's
			f = policy.FaultClientGone
		}
		v.sampled(a, f)
		a.rp.close()
		*out = policy.Outcome{Fault: f}
		return
	}
	v.firstOutput(a)
	// An error event before the stream's first output (judge): what it
	// means is policy's (EventFailure). A retryable one gives the stream up.
	if out.StreamFailed && policy.EventFailure(out.StreamError).Class == policy.ClassRetryable {
		a.rp.close()
	}
	if status == 429 || status == 402 {
		out.InsufficientQuota = policy.InsufficientQuota(rp.head)
	}
	if out.StreamFailed && (out.StreamError == "insufficient_quota" || out.StreamError == "billing_error") {
		out.InsufficientQuota = true // told in-band: fails over all the same
	}
}

// readHead reads the body's first bytes into the reply's head before
// anything is committed, so a body that dies before its first byte is
// still a retryable failure. A body of known length fills the head (all
// of it when it fits): more than fasthttp's write buffer, so a
// non-streamed reply's first bytes reach the client within first_byte
// and a trickling upstream is a timeout, not a client left without
// headers. A body of unknown length (a stream) gives one chunk, unless it
// is a 429/5xx (inspected or kept as the last reply) or a 400 the route
// may fail over on, which are read whole up to the head's size.
func (v *visit) readHead(a *attempt, status int) policy.Fault {
	ex := v.ex
	rp := a.rp
	rp.takeHead()
	rp.body = rp.msg.BodyStream()
	if rp.body == nil {
		// Read whole with the head (upstreamTransport), or no body.
		rp.head = append(rp.head, rp.msg.Body()...)
		return policy.FaultNone
	}
	cl := rp.msg.Header.ContentLength()
	if api := ex.req.call.API; api != policy.APIOther && status < 300 && cl < 0 {
		if kind := events.KindOf(rp.msg.Header.ContentType()); kind != 0 {
			return v.holdToCommit(a, kind, api)
		}
	}
	whole := cl >= 0 || status == 429 || status == 402 || status >= 500 || (status == 400 && len(ex.req.route.failoverCodes) > 0)
	for len(rp.head) < cap(rp.head) {
		n, err := rp.body.Read(rp.head[len(rp.head):cap(rp.head)])
		rp.head = rp.head[:len(rp.head)+n]
		if err == io.EOF {
			v.sampled(a, policy.FaultNone)
			a.rp.close() // fully read: the connection goes back to the pool
			return policy.FaultNone
		}
		if err != nil {
			if upstream.IsTimeout(err) {
				return policy.FaultTimeout
			}
			return policy.FaultReset
		}
		if !whole && len(rp.head) > 0 {
			break
		}
	}
	upstream.MarkStreaming(rp.msg)
	return policy.FaultNone
}

// maxHold bounds the events held before a stream's commit point: a
// Responses API response.created repeats the request's tools and
// instructions, so agents with many tools send large framing; past the
// bound the stream is committed as it is.
const maxHold = 1 << 20

// holdToCommit reads a stream's events into the reply's head until its
// commit point (policy.Judge): the first output, an error event before
// it (noted on a's outcome), the stream's end, or maxHold bytes. Until
// then nothing is committed, so a stream that fails in its framing is
// retried like any failure, and first_token runs to the first output.
func (v *visit) holdToCommit(a *attempt, kind events.Kind, api policy.API) policy.Fault {
	ex := v.ex
	rp := a.rp
	judged := 0
	for {
		var mark policy.Mark
		judged, mark = a.judge(rp.head, kind, api, judged, true)
		switch {
		case mark == policy.MarkContent && ex.req.route.streamHold.Max > 0 && !ex.out.streaming: // not a continuation's
			upstream.MarkStreaming(rp.msg)
			return v.holdWindow(a, kind, api, judged)
		case mark != policy.MarkFraming, len(rp.head) >= maxHold:
			upstream.MarkStreaming(rp.msg)
			return policy.FaultNone
		}
		// At the stream's end the whole stream was framing: it goes as it
		// is, and its end is checked as a stream's (see Read).
		if done, f := v.holdMore(a, maxHold, nil); done || f != policy.FaultNone {
			return f
		}
	}
}

// holdWindow goes on holding a stream past its first output, for a route
// with stream_hold: until the stream ends, the window passes (max from
// now, within the deadline; checked as bytes arrive) or bytes are held.
// A failure inside the window — a cut, a stall past idle, an in-band
// error — is the attempt's, retried or failed over from scratch with
// nothing sent; past it the stream flows as any. judged is how much of
// the head has been judged.
func (v *visit) holdWindow(a *attempt, kind events.Kind, api policy.API, judged int) policy.Fault {
	ex := v.ex
	rp, hold := a.rp, ex.req.route.streamHold
	until := time.Now().Add(hold.Max)
	if until.After(ex.req.deadline) {
		until = ex.req.deadline
	}
	// The window is ended by the clock between reads, never by a read
	// deadline: a timeout inside the chunk framing (streamedBody's
	// decoder) would leave the body unreadable for the stream that
	// follows. So a silence inside
	// the window holds the head until the next bytes (or idle passes,
	// which is a stall: retried).
	ex.client.enter(phaseStreamHold)
	var scan events.Scanner
	scan.Reset(kind)
	_, _ = scan.Write(rp.head)
	for {
		var mark policy.Mark
		if judged, mark = a.judge(rp.head, kind, api, judged, false); mark == policy.MarkFailure ||
			len(rp.head) >= int(hold.Bytes) || !time.Now().Before(until) {
			return policy.FaultNone
		}
		if done, f := v.holdMore(a, int(hold.Bytes), &scan); done || f != policy.FaultNone {
			return f
		}
	}
}

// judge judges the whole events of a's reply head from offset judged on
// (policy.Judge) and returns how far it got and the mark that stopped
// it: a failure (noted on a's outcome) or, when content is set, the
// first output; MarkFraming when neither came.
func (a *attempt) judge(head []byte, kind events.Kind, api policy.API, judged int, content bool) (int, policy.Mark) {
	for {
		ev, n := events.Next(kind, head[judged:])
		if n == 0 {
			return judged, policy.MarkFraming
		}
		judged += n
		if ev.Data == nil {
			continue // a comment or an empty event
		}
		switch mark, code := policy.Judge(api, ev.Name, ev.Data); {
		case mark == policy.MarkFailure:
			a.out.StreamFailed, a.out.StreamError = true, code
			return judged, mark
		case mark == policy.MarkContent && content:
			return judged, mark
		}
	}
}

// holdMore reads the next bytes of a held stream onto the reply's head
// (at most limit in all). done says to hold no more: the stream ended
// whole while held (all of it is in the head: heldToEnd), or Sturdy's
// buffer budget (server.max_buffered_bytes) has no room for more, and the
// stream goes on as it stands; a fault, that it failed: a cut, a stall
// past idle — or, followed by scan, an end that only the connection's
// close made, before the stream's terminator.
func (v *visit) holdMore(a *attempt, limit int, scan *events.Scanner) (done bool, f policy.Fault) {
	ex := v.ex
	rp := a.rp
	before := len(rp.head)
	var room bool
	if rp.head, room = ex.held.headRoom(&ex.p.held, rp.head, limit); !room {
		upstream.MarkStreaming(rp.msg)
		return true, policy.FaultNone
	}
	var err error
	rp.head, err = readOnto(rp.head, rp.body, limit)
	if scan != nil {
		_, _ = scan.Write(rp.head[before:])
	}
	switch {
	case err == io.EOF:
		if scan != nil {
			if scan.End(); !scan.Done() && rp.msg.Header.ContentLength() == -2 {
				return false, policy.FaultReset
			}
		}
		rp.heldToEnd = true // before its sample: a stream held whole is no stream's first content
		v.sampled(a, policy.FaultNone)
		a.rp.close()
		return true, policy.FaultNone
	case err != nil && upstream.IsTimeout(err):
		return false, policy.FaultTimeout
	case err != nil:
		return false, policy.FaultReset
	}
	return false, policy.FaultNone
}

// readOnto appends one Read of r to buf, growing it when full, so that
// buf holds at most limit bytes (more than it holds now).
func readOnto(buf []byte, r io.Reader, limit int) ([]byte, error) {
	if len(buf) == cap(buf) {
		buf = append(buf, 0)[:len(buf)]
	}
	n, err := r.Read(buf[len(buf):min(cap(buf), limit)])
	return buf[:len(buf)+n], err
}

// close closes the upstream body stream: a fully read one returns its
// connection to the pool, a partly read one closes the connection, which
// also tells a model server to stop generating. Either way the
// connection's place under max_connections is free again.
func (rp *reply) close() {
	if rp == nil {
		return
	}
	// From here the connection may serve another request: it must not be
	// closed for this one.
	rp.conn.Drop()
	if rp.body != nil {
		_ = rp.msg.CloseBodyStream()
		rp.body = nil
	}
	if l := rp.lease; l.Held() {
		l.Release(rp.sample)
		rp.lease = upstream.Lease{}
	}
}

// firstOutput notes the sample of attempt a, whose first output is held
// (its ttft), and gives a stream's first content to an adaptive limit now,
// not as the reply ends (Observe takes only a stream's that counts).
func (v *visit) firstOutput(a *attempt) {
	v.sampled(a, policy.FaultNone)
	a.rp.lease.Observe(a.rp.sample)
}

// sampled notes attempt a's sample as its head is read (f: none) or it
// fails (f: how), for its lease's release (reply.close) and, a stream's
// first content, for an adaptive limit at once (firstOutput): its time to first
// token from when it was sent, counted unless it is a stale connection's
// replay, its client left, or it failed before it was sent (a failed
// dial, no connection, a stale connection's).
func (v *visit) sampled(a *attempt, f policy.Fault) {
	ex := v.ex
	counts := !a.stale && !ex.client.isGone.Load()
	switch f {
	case policy.FaultClientGone, policy.FaultStale, policy.FaultConnect, policy.FaultLocal:
		counts = false
	}
	s := upstream.Sample{TTFT: time.Since(a.sentAt), Counts: counts, Size: len(ex.req.msg.Body())}
	if a.ep.Concurrent() {
		rp := a.rp
		status := rp.msg.StatusCode()
		// A stream's first content (not one held whole, nor past a
		// stream_hold window, nor an error event before any content) is
		// the adaptive limit's signal.
		s.Streamed = f == policy.FaultNone && status < 300 && ex.req.route.streamHold.Max <= 0 && !rp.heldToEnd &&
			!a.out.StreamFailed && ex.req.call.API != policy.APIOther && events.KindOf(rp.msg.Header.ContentType()) != 0
		s.Overload = policy.Overloaded(policy.Outcome{Status: status, Fault: f, StreamFailed: a.out.StreamFailed, StreamError: a.out.StreamError},
			f != policy.FaultTimeout || time.Now().Before(ex.req.deadline))
	}
	a.rp.sample = s
}

// keepHead returns head emptied for the next request, or a fresh one
// when holding a stream's framing grew it far past headSize.
func keepHead(head []byte) []byte {
	if cap(head) > 4*headSize {
		return make([]byte, 0, headSize)
	}
	return head[:0]
}
