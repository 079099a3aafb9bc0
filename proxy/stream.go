package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"sturdy/events"
	"sturdy/policy"
	"sturdy/upstream"
)

// stream is the client's response body once a reply is committed to go
// as it comes (or read whole for an HTTP/1.0 client): fasthttp pulls
// from it (Read) and ends it (CloseWithError), which ends the request.
// It is what the client side knows of the body as it goes: how the
// upstream frames it, the events relayed so far, how it failed, and a
// rescue's state. Each exchange has one, pooled with it (ex: its
// exchange, for the loop a rescue runs again); it begins at commit, when
// the answering attempt hands it its reply (rp: the upstream body it
// reads, a continuation's once a rescue took over), and is reset as the
// exchange ends, the reply given back.
type stream struct {
	ex      *exchange
	rp      *reply
	kind    events.Kind // 0: neither SSE nor NDJSON
	chunked bool        // the client's body has no length: failures can be told in-band
	// closeDelimited says the upstream body had neither length nor
	// chunks: only its connection closing ended it.
	closeDelimited bool
	// scan follows the SSE or NDJSON events relayed to the client; over
	// is set once the stream's terminator went by (Scanner.Ended): what
	// the upstream sends after it is not relayed.
	scan    events.Scanner
	over    bool
	pending error // upstream error seen with data, reported on next Read
	// tail is what Read sends before the body ends: the error event of an
	// interrupted stream, or a body read whole for an HTTP/1.0 client.
	tail   []byte
	broken error // why the upstream stream failed mid-body
	// cut is set when Shutdown ends the stream past its grace (interrupt).
	cut atomic.Bool
	// rescue follows a stream that may be continued if it fails.
	rescue rescue
	// meter reads its usage, when metering (outbound.metered).
	meter    meter
	metering bool
	// stripUsage: Sturdy asked the upstream for the stream's usage, not
	// the client (outbound.asksUsage): its usage chunk is not relayed.
	stripUsage bool
	// drain reads what follows the stream's end (endBody) into io.Discard's
	// pooled buffers: held here, it costs a request no allocation.
	drain io.LimitedReader
}

// streamed says the body is a stream by its framing: of no length, or
// SSE or NDJSON (no default max_duration bounds it: responseCap).
func (st *stream) streamed() bool { return st.chunked || st.kind != 0 }

// Read is the client's response body once a reply is committed as a
// stream: first the bytes read before commit, then the upstream body as
// it arrives (fasthttp flushes after each Read). If the upstream fails
// mid-body, an SSE stream ends with an error event, an NDJSON stream with
// an error line, and anything else by aborting the connection: a failed
// stream never ends as if it had succeeded.
func (st *stream) Read(p []byte) (n int, err error) {
	defer st.readSafely(&n, &err)
	rp := st.rp
	if st.tail != nil {
		if len(st.tail) == 0 {
			return 0, io.EOF
		}
		n := copy(p, st.tail)
		st.tail = st.tail[n:]
		return st.sent(p[:n]), nil
	}
	if st.broken != nil {
		return 0, errStreamAborted
	}
	if st.over { // the terminator went by: the rest, if any, is not the stream's
		st.endBody()
		return 0, io.EOF
	}
	if st.rescue.on {
		n, end := st.readEvents(p)
		if end != nil {
			return st.upstreamEnded(end, p)
		}
		return st.relayed(p[:n]), nil
	}
	if rp.headOff < len(rp.head) {
		n := copy(p, rp.head[rp.headOff:])
		if rp.headOff += n; rp.headOff == len(rp.head) {
			rp.passHead(&st.ex.held, &st.ex.p.held) // the client has it all: it serves the next request's reply
		}
		return st.relayed(p[:n]), nil
	}
	if rp.body == nil {
		if rp.heldToEnd { // the upstream's end came while its framing was held
			rp.heldToEnd = false
			return st.upstreamEnded(io.EOF, p)
		}
		return 0, io.EOF
	}
	if err := st.pending; err != nil {
		st.pending = nil
		return st.upstreamEnded(err, p)
	}
	n, err = rp.body.Read(p)
	if n > 0 {
		// fasthttp ignores an error returned with data; keep it for the
		// next call.
		st.pending = err
		return st.relayed(p[:n]), nil
	}
	if err == nil {
		return 0, nil
	}
	return st.upstreamEnded(err, p)
}

// relayed counts upstream bytes going to the client and follows them
// with the event scanner; of a stream of a known API, the bytes after
// its terminator's event are left out (see Read), and the count says so.
func (st *stream) relayed(b []byte) int {
	ex := st.ex
	if st.kind != 0 {
		if ex.req.call.API != policy.APIOther {
			b = b[:st.scan.Feed(b)]
			st.over = st.scan.Ended()
		} else {
			_, _ = st.scan.Write(b)
		}
	}
	if st.metering && (!st.rescue.on || st.rescue.raw) { // a followed stream's events are metered as they are framed
		st.meter.feed(b)
	}
	return st.sent(b)
}

func (st *stream) sent(b []byte) int {
	ex := st.ex
	ex.out.bytesOut += int64(len(b))
	return len(b)
}

// errUnterminated is why a close-delimited stream that ended without its
// terminator is an interruption: only the connection's close said it
// ended, and a cut looks the same.
var errUnterminated = errors.New("the upstream closed the stream before its terminator")

// upstreamEnded handles the end of the upstream body: EOF ends the client
// stream cleanly — unless it is an SSE or NDJSON stream without its
// terminator whose only end was the connection closing — and anything
// else is a mid-stream failure.
func (st *stream) upstreamEnded(err error, p []byte) (int, error) {
	ex := st.ex
	out := &ex.out
	if ex.client.isGone.Load() { // the watcher closed the upstream: the client left
		st.rp.close()
		out.outcome, out.status = outcomeClientGone, 499
		return 0, errStreamAborted
	}
	if err == io.EOF && st.kind != 0 {
		st.scan.End()
	}
	if err == io.EOF && st.kind != 0 && !st.scan.Done() {
		if st.closeDelimited {
			err = errUnterminated
		} else {
			// A framed stream that ends cleanly without a terminator is the
			// server's choice: passed on, and counted.
			ex.report().unterminated()
		}
	}
	if err == io.EOF {
		st.endBody()
		return 0, io.EOF
	}
	st.broken = err
	out.outcome = outcomeStreamInterrupted
	st.rp.close()
	if !st.chunked || st.kind == 0 {
		return 0, errStreamAborted
	}
	st.tail = st.interruptionTail()
	n := copy(p, st.tail)
	st.tail = st.tail[n:]
	return st.sent(p[:n]), nil
}

// What is read, and dropped, of an upstream body after its stream ended:
// a server often sends a chunked body's last chunk a moment after the
// terminator's event (uvicorn writes it apart), and the connection can go
// back to the pool only once it came. Past either bound it is closed.
const (
	drainWait  = time.Second
	drainBytes = 64 << 10
)

// endBody ends the upstream body of a stream that ended (its terminator,
// or the body's own end): what is left of it is read, within drainWait
// and drainBytes, and dropped, then the body is closed.
func (st *stream) endBody() {
	rp := st.rp
	if rp.body != nil && st.pending == nil {
		upstream.CapReads(rp.msg, time.Now().Add(drainWait))
		st.drain = io.LimitedReader{R: rp.body, N: drainBytes}
		_, _ = io.Copy(io.Discard, &st.drain)
		st.drain.R = nil
	}
	st.rp.close()
}

// interruptionTail is the last thing an interrupted SSE or NDJSON stream
// sends: it first finishes whatever line or event was cut, then reports
// the failure in the stream's own format. SSE gets no [DONE] after it.
func (st *stream) interruptionTail() []byte {
	ex := st.ex
	out, up := &ex.out, ex.target().up
	what := "the upstream stream failed mid-response"
	switch {
	case st.cut.Load():
		what = "Sturdy is shutting down and its grace period ended before the stream"
	case upstream.IsTimeout(st.broken) && ex.req.route.maxDuration > 0 && time.Since(ex.req.start) >= ex.req.route.maxDuration:
		what = fmt.Sprintf("the response took longer than the route's max_duration (%s)", ex.req.route.maxDuration)
	case upstream.IsTimeout(st.broken):
		what = fmt.Sprintf("the upstream sent nothing for %s mid-response", up.Options().Timeouts.Idle)
	case errors.Is(st.broken, errUnterminated):
		what = "the upstream closed the connection before the stream's end ([DONE] or a final event)"
	case errors.Is(st.broken, errInBand):
		what = errInBand.Error()
	}
	if st.rescue.tries > 0 {
		what += ", and continuing it failed"
	}
	e := newError(CodeStreamInterrupted, what, up.Name())
	var b []byte
	switch st.kind {
	case events.SSE:
		switch { // finish the cut line, then the cut event
		case st.scan.InLine():
			b = append(b, "\n\n"...)
		case st.scan.InEvent():
			b = append(b, '\n')
		}
		e.details = errorDetails{Upstream: up.Name(), Attempts: ex.loop.attempts, LastStatus: out.status}
		b = shapeOf(ex.req.call.API).event(b, e, st.scan.Events())
	default:
		if st.scan.InLine() {
			b = append(b, '\n')
		}
		line, _ := json.Marshal(map[string]string{"error": e.msg})
		b = append(b, line...)
		b = append(b, '\n')
	}
	return b
}

// CloseWithError is called by fasthttp when the response is done: err is
// nil after a complete write, the write error when the client went away,
// or our own read error. It closes the upstream stream (a partly read one
// closes the connection, so the model server stops generating), logs the
// request and releases the exchange.
func (st *stream) CloseWithError(err error) error {
	defer st.closeSafely()
	ex := st.ex
	ex.p.streams.track(st, false)
	// A client that leaves once the stream's terminator went to it has its
	// answer, whole: delivered, not gone.
	if err != nil && st.broken == nil && ex.out.outcome != outcomeStreamInterrupted && !st.over {
		ex.out.outcome = outcomeClientGone
		ex.out.status = 499
		ex.client.gonePhase.Store(uint32(phaseStream))
	}
	st.rp.close()
	ex.finish()
	return nil
}

// interrupt ends the stream for Shutdown, past its grace: closing the
// upstream connection makes the stream's next read fail, and that read
// sends the interruption event (and stops the model generating). Called
// with the proxy's streams lock held, so the exchange is not released
// meanwhile.
func (st *stream) interrupt() {
	ex := st.ex
	st.cut.Store(true)
	ex.client.inUse.Sever()
}

// openStreams are the responses streaming now, for Shutdown to end with
// an interruption event once its grace is over.
type openStreams struct {
	mu sync.Mutex
	m  map[*stream]struct{}
}

// track adds st (on) or takes it out.
func (o *openStreams) track(st *stream, on bool) {
	o.mu.Lock()
	if on {
		o.m[st] = struct{}{}
	} else {
		delete(o.m, st)
	}
	o.mu.Unlock()
}

// interrupt ends every open stream (stream.interrupt), under the lock: no
// exchange is released meanwhile.
func (o *openStreams) interrupt() {
	o.mu.Lock()
	for st := range o.m {
		st.interrupt()
	}
	o.mu.Unlock()
}

// count is how many streams are open.
func (o *openStreams) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.m)
}
