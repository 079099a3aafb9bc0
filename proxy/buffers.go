package proxy

import (
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prometheus/client_golang/prometheus"
)

// heldBytes is the budget of bytes Sturdy holds on behalf of clients, all
// requests together (server.max_buffered_bytes): a stream's head held
// past its first chunk (the commit point's framing, stream_hold), the
// text a rescue keeps, a body read whole for an HTTP/1.0 client. Each
// request reserves what it grows by and gives it all back when it ends —
// a held head's part earlier, as soon as its client has what it held.
// Past the budget a hold is released early (the stream is committed as
// it stands), a rescue becomes unrescuable and an HTTP/1.0 reply is
// 502 response_too_large.
type heldBytes struct {
	max  atomic.Int64 // hot-reloads
	used atomic.Int64
	// full counts the holds refused, by use (sturdy_buffer_full_total).
	full *prometheus.CounterVec
}

// take reserves n bytes; false, with nothing reserved, when that would
// pass the budget.
func (b *heldBytes) take(n int) bool {
	for {
		u := b.used.Load()
		if u+int64(n) > b.max.Load() {
			return false
		}
		if b.used.CompareAndSwap(u, u+int64(n)) {
			return true
		}
	}
}

// give returns n bytes reserved with take.
func (b *heldBytes) give(n int) { b.used.Add(-int64(n)) }

// The uses of the budget, as sturdy_buffer_full_total names them.
const (
	heldForHold   = "hold"
	heldForRescue = "rescue"
	heldForHTTP10 = "http10"
	heldForBody   = "request"
)

// bodyRoom refuses, before its body is read, a request whose
// Content-Length the request bodies' budget b (server.max_request_bytes)
// has no room for now: fasthttp then fails its read as too large, and
// handleParseError answers 503 server_busy. Admission reserves the body
// (holdBody); this only spares reading one that would be refused. It is
// the server's HeaderReceived hook.
func bodyRoom(b *heldBytes, h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if n := h.ContentLength(); n > 1 && b.used.Load()+int64(n) > b.max.Load() {
		b.full.WithLabelValues(heldForBody).Inc()
		return fasthttp.RequestConfig{MaxRequestBodySize: 1}
	}
	return fasthttp.RequestConfig{}
}

// refusedForBodies reports whether a body fasthttp found too large was
// refused by bodyRoom: its Content-Length is within the server's own
// limit (maxBody).
func refusedForBodies(ctx *fasthttp.RequestCtx, maxBody int) bool {
	n := ctx.Request.Header.ContentLength()
	return n > 1 && n <= maxBody
}

// holdBody reserves a body of n bytes of the bodies' budget b for its
// request's life: held, or 503 server_busy when b has no room.
func holdBody(b *heldBytes, n int) (held int, e *apiError) {
	if n == 0 {
		return 0, nil
	}
	if !b.take(n) {
		b.full.WithLabelValues(heldForBody).Inc()
		return 0, bodiesFull(b)
	}
	return n, nil
}

// bodiesFull is the answer when the bodies' budget b has no room.
func bodiesFull(b *heldBytes) *apiError {
	e := newError(CodeServerBusy, sizeText(int(b.max.Load())))
	e.retryAfter = time.Second
	return e
}

// errBuffersFull is why a read that would have grown a held buffer was
// not made: server.max_buffered_bytes is in use.
var errBuffersFull = errors.New("server.max_buffered_bytes is in use")

// share is what one request holds of the budget, given back all at once
// when it ends (heldBytes.give of n); head is the part of it covering the
// reply head's capacity past headSize.
type share struct{ n, head int }

// hold reserves n more bytes of the budget b for this request; false
// when the budget has no room, counted for use.
func (s *share) hold(b *heldBytes, n int, use string) bool {
	if !b.take(n) {
		b.full.WithLabelValues(use).Inc()
		return false
	}
	s.n += n
	return true
}

// headRoom makes room in a reply's head for at least one more byte
// (doubling it, to at most limit bytes), with every byte of its capacity
// past headSize reserved from the budget — a pooled head may come bigger
// than headSize from an earlier request (keepHead); false, and head as
// it was, when the budget b has no room.
func (s *share) headRoom(b *heldBytes, head []byte, limit int) ([]byte, bool) {
	want := cap(head)
	if len(head) == want {
		want += min(max(want, headSize), limit-len(head))
	}
	if need := want - headSize - s.head; need > 0 {
		if !s.hold(b, need, heldForHold) {
			return head, false
		}
		s.head += need
	}
	return clip(slices.Grow(head, want-len(head)), want), true
}

// giveHead gives back the part of s covering a reply head's capacity
// past headSize, as the head goes back to its pool before the request
// ends (reply.passHead): the next request to take it reserves it anew.
func (s *share) giveHead(b *heldBytes) {
	b.give(s.head)
	s.n -= s.head
	s.head = 0
}

// grow makes room in buf for at least one more byte, to at most limit
// bytes, once the budget b agrees. It doubles buf's capacity; past the
// limit it returns errAtLimit, past the budget errBuffersFull.
func (s *share) grow(b *heldBytes, buf []byte, limit int, use string) ([]byte, error) {
	if len(buf) < cap(buf) {
		return buf, nil
	}
	more := min(max(cap(buf), headSize), limit-len(buf))
	if more <= 0 {
		return buf, errAtLimit
	}
	if !s.hold(b, more, use) {
		return buf, errBuffersFull
	}
	return clip(slices.Grow(buf, more), len(buf)+more), nil
}

// errAtLimit is why grow made no room: the buffer holds its limit.
var errAtLimit = errors.New("the buffer holds its limit")

// clip caps buf's capacity at n bytes. slices.Grow rounds a capacity up
// to the allocator's size class; what the budget reserved, and the limit,
// end at n.
func clip(buf []byte, n int) []byte { return buf[:len(buf):min(n, cap(buf))] }
