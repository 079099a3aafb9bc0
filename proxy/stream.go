package proxy

import (
	"encoding/json"
	"fmt"
	"io"
)

// Read is the client's response body once a reply is committed as a
// stream: first the bytes read before commit, then the upstream body as
// it arrives (fasthttp flushes after each Read). If the upstream fails
// mid-body, an SSE stream ends with an error event, an NDJSON stream with
// an error line, and anything else by aborting the connection: a failed
// stream never ends as if it had succeeded.
func (ex *exchange) Read(p []byte) (int, error) {
	if ex.headOff < len(ex.head) {
		n := copy(p, ex.head[ex.headOff:])
		ex.headOff += n
		return ex.sent(p[:n]), nil
	}
	if ex.tail != nil {
		if len(ex.tail) == 0 {
			return 0, io.EOF
		}
		n := copy(p, ex.tail)
		ex.tail = ex.tail[n:]
		return ex.sent(p[:n]), nil
	}
	if ex.broken != nil {
		return 0, errStreamAborted
	}
	if ex.body == nil {
		return 0, io.EOF
	}
	if err := ex.pending; err != nil {
		ex.pending = nil
		return ex.upstreamEnded(err, p)
	}
	n, err := ex.body.Read(p)
	if n > 0 {
		// fasthttp ignores an error returned with data; keep it for the
		// next call.
		ex.pending = err
		return ex.sent(p[:n]), nil
	}
	if err == nil {
		return 0, nil
	}
	return ex.upstreamEnded(err, p)
}

func (ex *exchange) sent(b []byte) int {
	ex.bytesOut += int64(len(b))
	if len(b) >= 2 {
		ex.lastByte = [2]byte{b[len(b)-2], b[len(b)-1]}
	} else if len(b) == 1 {
		ex.lastByte = [2]byte{ex.lastByte[1], b[0]}
	}
	return len(b)
}

// upstreamEnded handles the end of the upstream body: EOF ends the client
// stream cleanly, anything else is a mid-stream failure.
func (ex *exchange) upstreamEnded(err error, p []byte) (int, error) {
	if err == io.EOF {
		ex.closeBody()
		return 0, io.EOF
	}
	ex.broken = err
	ex.outcome = outcomeStreamInterrupted
	ex.closeBody()
	if !ex.chunked || ex.kind == streamOther {
		return 0, errStreamAborted
	}
	ex.tail = ex.interruptionTail()
	n := copy(p, ex.tail)
	ex.tail = ex.tail[n:]
	return ex.sent(p[:n]), nil
}

// interruptionTail is the last thing an interrupted SSE or NDJSON stream
// sends: it first finishes whatever line or event was cut, then reports
// the failure in the stream's own format. SSE gets no [DONE] after it.
func (ex *exchange) interruptionTail() []byte {
	what := "the upstream stream failed mid-response"
	if isTimeout(ex.broken) {
		what = fmt.Sprintf("the upstream sent nothing for %s mid-response", ex.up.idle)
	}
	msg := fmt.Sprintf("%s from upstream %q; the output so far is incomplete: retry the request", what, ex.up.name)
	var b []byte
	switch ex.kind {
	case streamSSE:
		if ex.lastByte != [2]byte{'\n', '\n'} && ex.bytesOut > 0 {
			b = append(b, "\n\n"...)
		}
		b = append(b, "data: "...)
		b = append(b, errorJSON(CodeStreamInterrupted, msg, errorDetails{Upstream: ex.up.name, Attempts: ex.attempts, LastStatus: ex.status})...)
		b = append(b, "\n\n"...)
	default:
		if ex.lastByte[1] != '\n' && ex.bytesOut > 0 {
			b = append(b, '\n')
		}
		line, _ := json.Marshal(map[string]string{"error": msg})
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
	if err != nil && ex.broken == nil && ex.outcome != outcomeStreamInterrupted {
		ex.outcome = outcomeClientGone
		ex.status = 499
	}
	ex.closeBody()
	ex.finish()
	return nil
}
