package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"sturdy/events"
	"sturdy/policy"
	"sturdy/upstream"
)

// Read is the client's response body once a reply is committed as a
// stream: first the bytes read before commit, then the upstream body as
// it arrives (fasthttp flushes after each Read). If the upstream fails
// mid-body, an SSE stream ends with an error event, an NDJSON stream with
// an error line, and anything else by aborting the connection: a failed
// stream never ends as if it had succeeded.
func (ex *exchange) Read(p []byte) (int, error) {
	rp, out := &ex.reply, &ex.out
	if out.tail != nil {
		if len(out.tail) == 0 {
			return 0, io.EOF
		}
		n := copy(p, out.tail)
		out.tail = out.tail[n:]
		return ex.sent(p[:n]), nil
	}
	if out.broken != nil {
		return 0, errStreamAborted
	}
	if out.over { // the terminator went by: the rest, if any, is not the stream's
		ex.endBody()
		return 0, io.EOF
	}
	if out.rescue.on {
		return ex.readEvents(p)
	}
	if rp.headOff < len(rp.head) {
		n := copy(p, rp.head[rp.headOff:])
		rp.headOff += n
		return ex.relayed(p[:n]), nil
	}
	if rp.body == nil {
		if rp.heldToEnd { // the upstream's end came while its framing was held
			rp.heldToEnd = false
			return ex.upstreamEnded(io.EOF, p)
		}
		return 0, io.EOF
	}
	if err := out.pending; err != nil {
		out.pending = nil
		return ex.upstreamEnded(err, p)
	}
	n, err := rp.body.Read(p)
	if n > 0 {
		// fasthttp ignores an error returned with data; keep it for the
		// next call.
		out.pending = err
		return ex.relayed(p[:n]), nil
	}
	if err == nil {
		return 0, nil
	}
	return ex.upstreamEnded(err, p)
}

// relayed counts upstream bytes going to the client and follows them
// with the event scanner; of a stream of a known API, the bytes after
// its terminator's event are left out (see Read), and the count says so.
func (ex *exchange) relayed(b []byte) int {
	if out := &ex.out; out.kind != 0 {
		if ex.req.api != policy.APIOther {
			b = b[:out.scan.Feed(b)]
			out.over = out.scan.Ended()
		} else {
			_, _ = out.scan.Write(b)
		}
	}
	ex.tr.keepTail(b)
	return ex.sent(b)
}

func (ex *exchange) sent(b []byte) int {
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
func (ex *exchange) upstreamEnded(err error, p []byte) (int, error) {
	out := &ex.out
	if ex.isGone.Load() { // the watcher closed the upstream: the client left
		ex.closeBody()
		out.outcome, out.status = outcomeClientGone, 499
		return 0, errStreamAborted
	}
	if err == io.EOF && out.kind != 0 {
		out.scan.End()
	}
	if err == io.EOF && out.kind != 0 && !out.scan.Done() {
		if out.closeDelimited {
			err = errUnterminated
		} else {
			// A framed stream that ends cleanly without a terminator is the
			// server's choice: passed on, and counted.
			ex.p.m.StreamsUnterminated.WithLabelValues(ex.req.route.name).Inc()
		}
	}
	if err == io.EOF {
		ex.endBody()
		return 0, io.EOF
	}
	out.broken = err
	out.outcome = outcomeStreamInterrupted
	ex.closeBody()
	if !out.chunked || out.kind == 0 {
		return 0, errStreamAborted
	}
	out.tail = ex.interruptionTail()
	n := copy(p, out.tail)
	out.tail = out.tail[n:]
	return ex.sent(p[:n]), nil
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
func (ex *exchange) endBody() {
	rp := &ex.reply
	if rp.body != nil && ex.out.pending == nil {
		upstream.CapReads(rp.msg, time.Now().Add(drainWait))
		var buf [4 << 10]byte
		for left := drainBytes; left > 0; {
			n, err := rp.body.Read(buf[:min(len(buf), left)])
			if left -= n; err != nil {
				break
			}
		}
	}
	ex.closeBody()
}

// interruptionTail is the last thing an interrupted SSE or NDJSON stream
// sends: it first finishes whatever line or event was cut, then reports
// the failure in the stream's own format. SSE gets no [DONE] after it.
func (ex *exchange) interruptionTail() []byte {
	out, up := &ex.out, ex.loop.up
	what := "the upstream stream failed mid-response"
	switch {
	case out.cut.Load():
		what = "Sturdy is shutting down and its grace period ended before the stream"
	case upstream.IsTimeout(out.broken) && ex.req.route.maxDuration > 0 && time.Since(ex.req.start) >= ex.req.route.maxDuration:
		what = fmt.Sprintf("the response took longer than the route's max_duration (%s)", ex.req.route.maxDuration)
	case upstream.IsTimeout(out.broken):
		what = fmt.Sprintf("the upstream sent nothing for %s mid-response", up.Options().IdleTimeout)
	case errors.Is(out.broken, errUnterminated):
		what = "the upstream closed the connection before the stream's end ([DONE] or a final event)"
	case errors.Is(out.broken, errInBand):
		what = errInBand.Error()
	}
	if out.rescue.tries > 0 {
		what += ", and continuing it failed"
	}
	e := newError(CodeStreamInterrupted, what, up.Name())
	var b []byte
	switch out.kind {
	case events.SSE:
		switch { // finish the cut line, then the cut event
		case out.scan.InLine():
			b = append(b, "\n\n"...)
		case out.scan.InEvent():
			b = append(b, '\n')
		}
		e.details = errorDetails{Upstream: up.Name(), Attempts: ex.loop.attempts, LastStatus: out.status}
		b = shapeOf(ex.req.api).event(b, e, out.scan.Events())
	default:
		if out.scan.InLine() {
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
func (ex *exchange) CloseWithError(err error) error {
	ex.p.streaming(ex, false)
	// A client that leaves once the stream's terminator went to it has its
	// answer, whole: delivered, not gone.
	if err != nil && ex.out.broken == nil && ex.out.outcome != outcomeStreamInterrupted && !ex.out.over {
		ex.out.outcome = outcomeClientGone
		ex.out.status = 499
		ex.gonePhase.Store(uint32(phaseStream))
	}
	ex.closeBody()
	ex.finish()
	return nil
}

// interrupt ends the stream for Shutdown, past its grace: closing the
// upstream connection makes the stream's next read fail, and that read
// sends the interruption event (and stops the model generating). Called
// with the proxy's streams lock held, so the exchange is not released
// meanwhile.
func (ex *exchange) interrupt() {
	ex.out.cut.Store(true)
	ex.conn.Sever()
}
