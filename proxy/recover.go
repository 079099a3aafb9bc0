package proxy

import (
	"fmt"
	"runtime/debug"
)

// survive keeps a panic while serving one request from ending the
// process: fasthttp recovers none, and every stream in flight would go
// with it. Handle defers it. The panic is logged with its stack and
// counted (sturdy_panics_total{where="request"}); the request ends as
// 500 internal_error when nothing reached its client, its upstream
// connection and its share of every limit go back, and its client
// connection closes.
func survive(ex *exchange) {
	r := recover()
	if r == nil {
		return
	}
	p, ctx, api := ex.p, ex.ctx, ex.req.call.API
	id := append([]byte(nil), ex.req.id...)
	panicked(p, "request", r, id)
	streaming, ended := ex.out.reader, ex.out.ended
	ex.out.outcome, ex.out.status, ex.out.errCode = outcomeInternalError, 500, CodeInternalError
	if ex.st.rp != ex.last.rp {
		quietly(p, id, ex.last.rp.close)
	}
	switch {
	case ended: // the panic was in finish: its rest is not run twice
	case streaming:
		ex.st.broken = errStreamAborted
		quietly(p, id, ctx.Response.Reset) // closes the body reader: CloseWithError finishes ex
	default:
		quietly(p, id, ex.finish)
	}
	newError(CodeInternalError).write(ctx, id, api)
	ctx.SetConnectionClose()
}

// quietly runs f, logging and counting a panic in it instead of
// raising it: cleanup after a panic must not raise a second one.
func quietly(p *Proxy, id []byte, f func()) {
	defer func() {
		if r := recover(); r != nil {
			panicked(p, "request", r, id)
		}
	}()
	f()
}

// panicked logs a recovered panic with its stack, and counts it. The
// value is printed, never the request: a panic value comes from our
// code, not from what a client sent.
func panicked(p *Proxy, where string, r any, id []byte) {
	p.m.Panics.WithLabelValues(where).Inc()
	p.log.Error().Str("component", "proxy").Str("where", where).Bytes(fieldID, id).
		Str("panic", fmt.Sprint(r)).Bytes("stack", debug.Stack()).Msg("recovered a panic; the process serves on")
}

// readSafely is stream.Read's guard: a panic while relaying ends this
// stream as a failed one (its client's connection is cut), not the
// process.
func (st *stream) readSafely(n *int, err *error) {
	if r := recover(); r != nil {
		panicked(st.ex.p, "stream", r, st.ex.req.id)
		st.broken = errStreamAborted
		*n, *err = 0, errStreamAborted
	}
}

// closeSafely is stream.CloseWithError's guard: a panic while ending a
// stream is logged, and the exchange is dropped (not pooled).
func (st *stream) closeSafely() {
	if r := recover(); r != nil {
		panicked(st.ex.p, "stream", r, st.ex.req.id)
	}
}
