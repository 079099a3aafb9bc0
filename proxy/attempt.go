package proxy

import (
	"io"
	"time"

	"sturdy/policy"
)

// attempt sends the request once and reads the response head: the status,
// headers and the first body bytes (all of a small body). Its timeout is
// the upstream's first_byte, or for a stream the route's first_token when
// shorter, cut short by the deadline. It only reports what happened; the
// loop asks policy what that means.
func (ex *exchange) attempt(t *target, now time.Time) policy.Outcome {
	timeout := min(t.up.firstByte, ex.req.deadline.Sub(now))
	if ex.req.firstToken > 0 {
		timeout = min(timeout, ex.req.firstToken)
	}
	if timeout <= 0 {
		return policy.Outcome{Fault: policy.FaultTimeout}
	}
	resp := ex.reply.msg
	ex.enter(phaseHead)
	if err := t.up.send(ex, resp, timeout); err != nil || ex.isGone.Load() {
		ex.closeBody()
		switch {
		case ex.isGone.Load():
			return policy.Outcome{Fault: policy.FaultClientGone}
		case !isTimeout(err) && staleConnection(resp):
			return policy.Outcome{Fault: policy.FaultStale}
		}
		return policy.Outcome{Fault: faultOf(err)}
	}
	status := resp.StatusCode()
	if f := ex.readHead(status); f != policy.FaultNone {
		ex.closeBody()
		return policy.Outcome{Fault: f}
	}
	out := policy.Outcome{Status: status}
	if status == 429 {
		out.InsufficientQuota = policy.InsufficientQuota(ex.reply.head)
	}
	return out
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
func (ex *exchange) readHead(status int) policy.Fault {
	rp := &ex.reply
	rp.head, rp.headOff = rp.head[:0], 0
	rp.body = rp.msg.BodyStream()
	if rp.body == nil {
		return policy.FaultNone
	}
	cl := rp.msg.Header.ContentLength()
	whole := cl >= 0 || status == 429 || status >= 500 || (status == 400 && len(ex.req.route.failoverCodes) > 0)
	for len(rp.head) < cap(rp.head) {
		n, err := rp.body.Read(rp.head[len(rp.head):cap(rp.head)])
		rp.head = rp.head[:len(rp.head)+n]
		if err == io.EOF {
			ex.closeBody() // fully read: the connection goes back to the pool
			return policy.FaultNone
		}
		if err != nil {
			if isTimeout(err) {
				return policy.FaultTimeout
			}
			return policy.FaultReset
		}
		if !whole && len(rp.head) > 0 {
			break
		}
	}
	markStreaming(rp.msg)
	return policy.FaultNone
}

// closeBody closes the upstream body stream: a fully read one returns its
// connection to the pool, a partly read one closes the connection, which
// also tells a model server to stop generating. Either way the
// connection's place under max_connections is free again.
func (ex *exchange) closeBody() {
	if ex.upConn != nil {
		// From here the connection may serve another request: it must not
		// be closed for this one.
		ex.released()
	}
	if ex.reply.body != nil {
		_ = ex.reply.msg.CloseBodyStream()
		ex.reply.body = nil
	}

	if up := ex.reply.conn; up != nil {
		up.conns.release()
		ex.reply.conn = nil
	}
}
